"""engine_idle: what counts as in flight, which connections are a client's, and the bounded wait."""

from __future__ import annotations

import os
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.engine_idle import (
    client_connections,
    established_by_inode,
    metrics_reader,
    pids_in_cgroup,
    requests_in_flight,
    wait_until_idle,
)

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="chat"} 2.0
vllm:num_requests_waiting{engine="0",model_name="chat"} 1.0
vllm:num_requests_swapped{engine="0",model_name="chat"} 7.0
vllm:request_success_total{finished_reason="stop",model_name="chat"} 40.0
"""
TRITON_METRICS = """\
nv_inference_pending_request_count{model="chat",version="1"} 3
nv_inference_pending_request_count{model="embed",version="1"} 1
nv_inference_request_success{model="chat",version="1"} 90
"""


def test_vllm_counts_running_and_waiting_only():
    assert requests_in_flight(VLLM_METRICS, "vllm") == 3.0
    assert requests_in_flight(VLLM_METRICS, "sim") == 3.0


def test_triton_counts_pending_over_every_model():
    assert requests_in_flight(TRITON_METRICS, "triton") == 4.0


def test_metrics_without_the_series_are_not_idle():
    assert requests_in_flight("# nothing here\nup 1\n", "vllm") is None
    assert requests_in_flight(VLLM_METRICS, "triton") is None


def test_an_unknown_kind_names_the_field_and_the_kinds():
    with pytest.raises(FleetError) as caught:
        requests_in_flight(VLLM_METRICS, "tgi")
    assert caught.value.details["field"] == "kind"
    assert "sim, triton, vllm" in caught.value.message


def test_only_established_sockets_are_read_from_proc_net_tcp():
    tail = " 00000000:00000000 00:00000000 00000000     0        0 "
    text = "\n".join(
        [
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid",
            "   0: 0100007F:1F40 00000000:0000 0A" + tail + "111 1",
            "   1: 0100007F:1F40 0100007F:9C40 01" + tail + "222 1",
            "   2: 0100007F:1FA5 0100007F:9C41 01" + tail + "333 1",
            "   3: 0100007F:1F40 0100007F:9C42 06" + tail + "444 1",
        ]
    )
    assert established_by_inode([text]) == {222: 8000, 333: 8101}


def test_client_connections_are_counted_by_the_process_that_holds_them():
    """A real listening socket in this process, a client connected to it: the accepted socket is
    this process's, on the listener's port; another port is not counted."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted = listener.accept()[0]
    try:
        # The client's own end is established too, on an ephemeral local port.
        assert client_connections([os.getpid()], [port]) == 1
        assert client_connections([os.getpid()], [port + 1 if port < 65535 else port - 1]) == 0
        accepted.close()
        assert client_connections([os.getpid()], [port]) == 0
    finally:
        for sock in (client, accepted, listener):
            sock.close()


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def clock(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def engine(name="chat", kind="vllm"):
    return {
        "name": name,
        "kind": kind,
        "unit": "zerolayer-engine-%s.service" % name,
        "metrics_port": 8101,
        "service_ports": [8000],
    }


def test_the_wait_ends_when_the_last_request_finishes():
    clock = FakeClock()
    readings = iter(["vllm:num_requests_running 2\n", "vllm:num_requests_running 1\n"])

    def metrics(_port):
        return next(readings, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")

    result = wait_until_idle(
        [engine()], 60, 1.0, metrics, lambda _unit: [], clock=clock.clock, sleep=clock.sleep
    )
    # No process in the unit: idle at once, whatever the metrics would say.
    assert result["idle"] and result["waited_s"] == 0 and clock.sleeps == []

    result = wait_until_idle(
        [engine()],
        60,
        1.0,
        metrics,
        lambda _unit: [os.getpid()],
        proc="/nonexistent",
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert result["idle"] is True
    assert result["waited_s"] == 2.0
    assert result["engines"] == [{"name": "chat", "in_flight": 0.0, "connections": 0, "idle": True}]


def test_the_wait_is_bounded_and_says_what_was_left():
    clock = FakeClock()
    result = wait_until_idle(
        [engine(), engine("embed", "triton")],
        5,
        2.0,
        lambda _port: "vllm:num_requests_running 4\n",
        lambda _unit: [os.getpid()],
        proc="/nonexistent",
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert result["idle"] is False
    assert result["waited_s"] == 5.0
    # The last sleep is cut to the time left.
    assert clock.sleeps == [2.0, 2.0, 1.0]
    assert [entry["in_flight"] for entry in result["engines"]] == [4.0, None]


def test_metrics_that_cannot_be_read_are_not_idle():
    clock = FakeClock()
    result = wait_until_idle(
        [engine()],
        1,
        1.0,
        lambda _port: None,
        lambda _unit: [1],
        proc="/nonexistent",
        clock=clock.clock,
        sleep=clock.sleep,
    )
    assert result["idle"] is False and result["engines"][0]["in_flight"] is None


class KeyedMetrics(BaseHTTPRequestHandler):
    """/metrics behind one bearer key, as an engine's own port serves it."""

    def do_GET(self):
        if self.headers.get("Authorization") != "Bearer sk-engine-key-000001":
            status, body = 401, b'{"error":"Unauthorized"}'
        else:
            status, body = 200, VLLM_METRICS.encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def keyed_engine():
    server = ThreadingHTTPServer(("127.0.0.1", 0), KeyedMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_metrics_are_read_with_the_key_and_a_refusal_is_not_idle(keyed_engine):
    text = metrics_reader(api_key="sk-engine-key-000001")(keyed_engine)
    assert requests_in_flight(text, "vllm") == 3.0
    assert metrics_reader()(keyed_engine) is None
    assert metrics_reader(api_key="sk-wrong-key-000001")(keyed_engine) is None


def test_a_units_processes_are_found_on_either_cgroup_layout(tmp_path):
    unit = "/zerolayer.slice/zerolayer-engine.slice/zerolayer-engine-chat.service"
    layouts = {
        # unified (cgroup v2)
        "101": "0::%s\n" % unit,
        # hybrid: controllers at the container's root, the unit on name=systemd and 0::
        "102": "4:memory:/libpod-1\n1:name=systemd:%s\n0::%s\n" % (unit, unit),
        # another unit, and one whose name only starts like it
        "103": "0::/system.slice/nginx.service\n",
        "104": "0::%s-extra\n" % unit,
    }
    for pid, text in layouts.items():
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "cgroup").write_text(text)
    (tmp_path / "self").mkdir()
    assert pids_in_cgroup(unit, str(tmp_path)) == [101, 102]
