"""Fixtures for the monitoring tests: promtool and a running engine simulator."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import urllib.request

import pytest
from promql_names import ENGINE_SIM


@pytest.fixture(scope="session")
def promtool():
    path = shutil.which("promtool")
    assert path, "promtool is not installed (Debian package prometheus, bindep profile test)"
    return path


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# Only ever http://127.0.0.1:<port> of the simulator this fixture started.
def http_get(url):
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310
        return reply.read().decode()


def http_post(url, payload, headers):
    request = urllib.request.Request(  # noqa: S310
        url, data=json.dumps(payload).encode(), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as reply:  # noqa: S310
        return reply.read().decode()


@pytest.fixture(scope="session")
def engine_sim_metrics():
    """The simulator's /metrics after one direct request, as text.

    The simulator runs on 127.0.0.1 on a free port and is stopped at the end.
    """
    assert ENGINE_SIM.exists(), f"{ENGINE_SIM} is missing"
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(ENGINE_SIM),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--time-to-first-token",
            "0",
            "--inter-token-latency",
            "0",
            "--output-tokens",
            "2",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        announced = process.stdout.readline()
        assert announced, "simulator exited: " + process.stderr.read()
        assert json.loads(announced)["port"] == port
        base = f"http://127.0.0.1:{port}"
        http_post(
            base + "/v1/chat/completions",
            {
                "model": "zerolayer-simulated-model",
                "messages": [{"role": "user", "content": "hello"}],
            },
            {"Content-Type": "application/json"},
        )
        yield http_get(base + "/metrics")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        process.stdout.close()
        process.stderr.close()
