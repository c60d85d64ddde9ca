"""Fixtures for the monitoring tests: promtool, and a real Prometheus over the recorded fleets."""

import shutil
import time

import pytest
from prometheus_process import PROMETHEUS
from promql_names import recorded_names
from recorded_fleet import RecordedPrometheus


@pytest.fixture(scope="session")
def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is not installed (Debian package prometheus, bindep profile test)"
    return path


@pytest.fixture(scope="session")
def recorded_prometheus(promtool):
    """Prometheus on 127.0.0.1 over the fleets of recorded_fleet.FLEETS, with the collection's
    rules; yielded once every recording rule has recorded something (its `rules_at` is a
    moment when they all have). Stopped, and its directory removed, at the end."""
    assert shutil.which(PROMETHEUS), f"{PROMETHEUS} is missing (Debian package prometheus)"
    server = RecordedPrometheus(promtool)
    try:
        server.build()
        server.start_server()
        names = sorted(recorded_names())

        def recorded():
            server.rules_at = time.time()
            return all(server.query(name, at=server.rules_at) for name in names)

        server.wait_for(recorded, f"the recording rules {names} to record something")
        yield server
    finally:
        server.cleanup()
