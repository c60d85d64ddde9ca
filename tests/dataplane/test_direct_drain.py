"""Pooled keep-alive clients leave the direct path when the node lowers a weight.

The real router in a throw-away netns, nginx on the service port as the proxy, the CPU
engine simulator (the engines' real drain code) on its own port, and one client that keeps
its connection, as the OpenAI SDK and gateways do. The router decides per connection only:
without the direct drain every answer on that connection stayed direct after a rollback.
"""

import json
import os
import subprocess
import sys
import time
import uuid

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    listening_inodes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route

from .conftest import REPO, SERVICE_PORT, ok, routectl

SIMULATOR = os.path.join(REPO, "roles", "model_engine", "files", "zerolayer_engine_sim.py")
CLIENT = os.path.join(os.path.dirname(__file__), "keepalive_client.py")
SIM_PORT = 9002
IDLE_GRACE_S = "0.5"


@pytest.fixture
def routed_to_sim(layout, netns, proxy, router_object, tmp_path):
    """Route chat on the service port at 100 % to a simulator that reads the layout's
    direct-drain marker; returns the node config routectl reads (netns, routes)."""
    engine = netns.popen(
        [
            sys.executable, SIMULATOR, "--port", str(SIM_PORT), "--engine-name", "sim",
            "--time-to-first-token", "0", "--inter-token-latency", "0",
            "--direct-drain-file", layout.direct_drain_file,
            "--direct-idle-grace", IDLE_GRACE_S,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not listening_inodes(engine.pid, SIM_PORT, "inet"):
        assert engine.poll() is None, engine.stderr.read().decode()
        assert time.monotonic() < deadline, "the simulator did not listen"
        time.sleep(0.05)
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "chat", SERVICE_PORT, 100)
    ok(
        layout, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
        "--port", str(SIM_PORT), "--timeout", "5",
    )  # fmt: skip
    config = tmp_path / "router.json"
    config.write_text(
        json.dumps({"netns": netns.path, "routes": [{"name": "chat", "port": SERVICE_PORT}]})
    )
    return str(config)


class KeepAliveClient:
    def __init__(self, netns, interval):
        tag = uuid.uuid4().hex[:6]
        self.until = os.path.join(netns.workdir, "stop-" + tag)
        started = os.path.join(netns.workdir, "started-" + tag)
        self.proc = netns.popen(
            [
                sys.executable, CLIENT, str(SERVICE_PORT), "--interval", str(interval),
                "--until-file", self.until, "--started-file", started,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not os.path.exists(started):
            assert self.proc.poll() is None, self.proc.stderr.read()
            assert time.monotonic() < deadline, "the client got no first answer"
            time.sleep(0.02)

    def stop(self):
        open(self.until, "w").close()
        out, err = self.proc.communicate(timeout=60)
        assert self.proc.returncode == 0, err
        return json.loads(out)


def answers_after(report, moment):
    return [path for at, path, _connection in report["answers"] if at > moment]


def assert_left_the_direct_path(report, moment):
    """The connection the client used at `moment` was ended by the server, and every
    connection it opened after that went to the proxy: what a pooled client sees when the
    drain works, however fast or slow the machine is. (Before the drain the same client kept
    its first connection, and every answer on it was direct.)"""
    in_use = max(connection for at, _path, connection in report["answers"] if at <= moment)
    later = [(path, connection) for at, path, connection in report["answers"] if at > moment]
    assert any(connection > in_use for _path, connection in later), report["connections"]
    assert all(path == "proxy" for path, connection in later if connection > in_use), later[:10]


def test_a_fast_rollback_sends_a_busy_pooled_connection_to_the_proxy(
    attached_sim_client, layout, routed_to_sim
):
    client = attached_sim_client(interval=0.05)
    time.sleep(0.5)
    assert routectl(layout, "direct", config=routed_to_sim)[1]["first"] == {"chat": 1}
    rolled_back_at = time.time()
    assert ok(layout, "rollback")["rolled_back"] is True
    drained = ok(layout, "direct", "--wait", "5", config=routed_to_sim)
    time.sleep(0.5)
    report = client.stop()
    assert drained["drained"] is True and drained["left"] == {}, drained
    assert report["errors"] == []
    assert all(path == "direct" for _at, path, _c in report["answers"][:5])
    # The answer that said Connection: close ended the connection; the client's next one
    # was decided by the router again, at weight 0: the proxy, as every one after it.
    assert_left_the_direct_path(report, rolled_back_at)
    assert answers_after(report, rolled_back_at)[-5:] == ["proxy"] * 5


def test_an_idle_pooled_connection_is_closed_by_the_engine_and_comes_back_via_the_proxy(
    attached_sim_client, layout, routed_to_sim
):
    # Idle for longer than the grace between requests: the engine closes it while it waits.
    client = attached_sim_client(interval=1.5)
    assert ok(layout, "rollback")["rolled_back"] is True
    rolled_back_at = time.time()
    drained = ok(layout, "direct", "--wait", "5", config=routed_to_sim)
    time.sleep(3.2)
    report = client.stop()
    assert drained["drained"] is True, drained
    after = answers_after(report, rolled_back_at)
    assert report["errors"] == []
    assert after and set(after) == {"proxy"}, report


def test_a_deep_rollback_sends_the_pooled_connection_to_the_proxy_too(
    attached_sim_client, layout, routed_to_sim
):
    client = attached_sim_client(interval=0.05)
    time.sleep(0.3)
    detached_at = time.time()
    assert ok(layout, "detach")["attached"] is False
    drained = ok(layout, "direct", "--wait", "5", config=routed_to_sim)
    time.sleep(0.5)
    report = client.stop()
    assert drained["drained"] is True, drained
    assert report["errors"] == []
    assert_left_the_direct_path(report, detached_at)
    assert answers_after(report, detached_at)[-5:] == ["proxy"] * 5


def test_a_weight_raised_after_the_rollback_keeps_new_direct_connections(
    attached_sim_client, layout, routed_to_sim
):
    epoch = ok(layout, "rollback")["fence_epoch"]
    ok(layout, "set-weight", "--route", "chat", "--weight", "100", "--epoch", str(epoch))
    client = attached_sim_client(interval=0.05)
    time.sleep(1.5)
    report = client.stop()
    assert report["errors"] == [] and report["connections"] == 1, report
    assert {path for _at, path, _c in report["answers"]} == {"direct"}


def test_counting_direct_connections_leaves_the_proxys_out(layout, routed_to_sim, netns):
    # Connections through the proxy (nginx holds the service port's listener) are no
    # direct connections, whatever their local port.
    set_route(layout, "chat", weight=0)
    client = KeepAliveClient(netns, 0.05)
    try:
        counted = ok(layout, "direct", config=routed_to_sim)
    finally:
        report = client.stop()
    assert {path for _at, path, _c in report["answers"]} == {"proxy"}
    assert counted == {
        "first": {"chat": 0},
        "left": {},
        "drained": True,
        "drained_after_s": counted["drained_after_s"],
        "waited_s": counted["waited_s"],
    }


def test_direct_refuses_a_negative_wait_and_names_the_field(layout, routed_to_sim):
    status, error = routectl(layout, "direct", "--wait", "-1", config=routed_to_sim)
    assert status == 2 and error["field"] == "wait", error


@pytest.fixture
def attached_sim_client(netns):
    started = []

    def start(interval):
        client = KeepAliveClient(netns, interval)
        started.append(client)
        return client

    yield start
    for client in started:
        if client.proc.poll() is None:
            open(client.until, "w").close()
            client.proc.communicate(timeout=60)
