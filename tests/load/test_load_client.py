"""The load client against the real engine simulator on loopback."""

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import threading
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
LOAD = REPO / "files" / "load" / "zerolayer_load.py"
SIM = REPO / "roles" / "model_engine" / "files" / "zerolayer_engine_sim.py"
API_KEY = "load-client-test-key"
MODEL = "load-test-model"


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port, process, seconds=15):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert process.poll() is None, "the simulator exited while starting"
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port}")


@pytest.fixture
def engine(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(API_KEY + "\n")
    os.chmod(keys, 0o600)
    admin = tmp_path / "admin.json"
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            str(SIM),
            "--port",
            str(port),
            "--api-keys-file",
            str(keys),
            "--admin-file",
            str(admin),
            "--model",
            MODEL,
            "--time-to-first-token",
            "0.002",
            "--inter-token-latency",
            "0.001",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_listening(port, process)
        yield {"port": port, "keys": keys, "admin": admin}
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def pipe(source, destination):
    with contextlib.suppress(OSError):
        while True:
            data = source.recv(65536)
            if not data:
                break
            destination.sendall(data)
    with contextlib.suppress(OSError):
        destination.shutdown(socket.SHUT_WR)


class CountingListener:
    """A listener on a free loopback port that counts the connections it accepts and hands
    each, with its number, to handle() in a thread of its own."""

    def __init__(self):
        self.lock = threading.Lock()
        self.accepted = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self.accept_loop, daemon=True).start()

    def accept_loop(self):
        while True:
            try:
                connection, _address = self.listener.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                number = self.accepted
            threading.Thread(target=self.handle, args=(connection, number), daemon=True).start()


class CountingProxy(CountingListener):
    """Forwards TCP connections to a local port and counts them: how many connections the
    client opened, which neither the client nor the simulator reports."""

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.sockets = []
        super().__init__()

    def handle(self, client, _number):
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        self.sockets += [client, upstream]
        for source, destination in ((client, upstream), (upstream, client)):
            threading.Thread(target=pipe, args=(source, destination), daemon=True).start()

    def close(self):
        for sock in [self.listener, *self.sockets]:
            sock.close()


COMPLETION = json.dumps({"choices": [{"index": 0, "message": {"content": "ok"}}]}).encode()


def read_request(reader):
    """Reads one request (head and Content-Length body); None when the client closed."""
    length = 0
    line = reader.readline()
    if not line:
        return None
    while line not in (b"\r\n", b""):
        name, _sep, value = line.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
        line = reader.readline()
    reader.read(length)
    return True


class RawHttpServer(CountingListener):
    """An HTTP/1.1 server on raw sockets that ends keep-alive connections on purpose: after
    `answers_per_connection` answers (the last one says Connection: close), once idle for
    `idle_close_s`, right after reading a request past `drop_after_answers` (a close that
    raced the request), or, from connection number `answering_connections` + 1 on, right after
    reading the first request, without an answer."""

    def __init__(
        self,
        answers_per_connection=None,
        idle_close_s=None,
        answering_connections=None,
        drop_after_answers=None,
    ):
        self.answers_per_connection = answers_per_connection
        self.idle_close_s = idle_close_s
        self.answering_connections = answering_connections
        self.drop_after_answers = drop_after_answers
        self.sent_close = 0
        super().__init__()

    def handle(self, connection, number):
        answers = self.answering_connections
        with connection, connection.makefile("rb") as reader:
            answered = 0
            while True:
                if answered and self.idle_close_s is not None:
                    connection.settimeout(self.idle_close_s)
                try:
                    if read_request(reader) is None:
                        return
                except OSError:  # idle for longer than idle_close_s
                    return
                if answers is not None and number > answers:
                    return
                if answered == self.drop_after_answers:
                    return
                answered += 1
                last = answered == self.answers_per_connection
                head = (
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    "Content-Length: %d\r\n%s\r\n"
                    % (len(COMPLETION), "Connection: close\r\n" if last else "")
                )
                if last:
                    with self.lock:
                        self.sent_close += 1
                connection.sendall(head.encode() + COMPLETION)
                if last:
                    return


@pytest.fixture
def raw_server():
    servers = []

    def start(**behaviour):
        servers.append(RawHttpServer(**behaviour))
        return servers[-1]

    yield start
    for server in servers:
        server.listener.close()


@pytest.fixture
def engine_proxy(engine):
    proxy = CountingProxy(engine["port"])
    yield proxy
    proxy.close()


def run_load(tmp_path, *args):
    summary = tmp_path / "summary.json"
    subprocess.run(
        [sys.executable, str(LOAD), "--summary", str(summary), "--model", MODEL, *args],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return json.loads(summary.read_text())


def test_counts_every_request_and_its_path(engine, tmp_path):
    summary = run_load(
        tmp_path,
        "--target",
        f"127.0.0.1:{engine['port']}",
        "--api-key-file",
        str(engine["keys"]),
        "--duration",
        "2",
        "--concurrency",
        "4",
        "--stream-percent",
        "50",
    )
    assert summary["finished"] is True
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    assert summary["requests_ok"] > 20
    assert set(summary["paths"]) == {"direct"}
    assert summary["streams_completed"] > 0
    assert summary["paths"]["direct"]["ttft_p50_s"] is not None
    buckets = sum(b.get("direct", 0) for b in summary["series"])
    assert buckets == summary["requests_ok"]
    assert summary["targets"] == {f"127.0.0.1:{engine['port']}": {"direct": summary["requests_ok"]}}


def test_a_refused_connection_is_a_failure_with_its_cause(tmp_path):
    closed = free_port()
    summary = run_load(
        tmp_path,
        "--target",
        f"127.0.0.1:{closed}",
        "--duration",
        "0.5",
        "--concurrency",
        "1",
        "--rate",
        "20",
    )
    assert summary["requests_ok"] == 0
    assert summary["requests_failed"] > 0
    assert set(summary["failures_by_cause"]) == {"connection_refused"}
    assert summary["targets"] == {f"127.0.0.1:{closed}": {"failed": summary["requests_failed"]}}


def test_a_missing_key_is_counted_as_http_401(engine, tmp_path):
    summary = run_load(
        tmp_path,
        "--target",
        f"127.0.0.1:{engine['port']}",
        "--duration",
        "0.5",
        "--concurrency",
        "1",
        "--rate",
        "20",
    )
    assert summary["requests_ok"] == 0
    assert set(summary["failures_by_cause"]) == {"http_401"}


def test_stop_file_ends_the_run_early(engine, tmp_path):
    stop = tmp_path / "stop"
    summary_path = tmp_path / "summary.json"
    process = subprocess.Popen(
        [
            sys.executable,
            str(LOAD),
            "--summary",
            str(summary_path),
            "--model",
            MODEL,
            "--target",
            f"127.0.0.1:{engine['port']}",
            "--api-key-file",
            str(engine["keys"]),
            "--duration",
            "120",
            "--stop-file",
            str(stop),
            "--concurrency",
            "2",
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while not summary_path.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        stop.touch()
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    summary = json.loads(summary_path.read_text())
    assert summary["finished"] is True
    assert summary["elapsed_s"] < 120
    assert summary["requests_failed"] == 0


PER_REQUEST_KEYS = {
    "started_unix",
    "elapsed_s",
    "finished",
    "requests_ok",
    "requests_failed",
    "streams_completed",
    "paths",
    "failures_by_cause",
    "failure_examples",
    "series",
}
PER_PATH_KEYS = {
    "requests",
    "share",
    "latency_p50_s",
    "latency_p99_s",
    "ttft_p50_s",
    "ttft_p99_s",
    "last_began_unix",
}


def pooled(tmp_path, port, *args):
    return run_load(
        tmp_path,
        "--target",
        f"127.0.0.1:{port}",
        "--connection-mode",
        "pooled",
        "--concurrency",
        "1",
        *args,
    )


def test_per_request_mode_keeps_its_summary_and_a_connection_per_request(
    engine, engine_proxy, tmp_path
):
    summary = run_load(
        tmp_path,
        "--target",
        f"127.0.0.1:{engine_proxy.port}",
        "--api-key-file",
        str(engine["keys"]),
        "--duration",
        "2",
        "--concurrency",
        "1",
    )
    added = {"connection_mode", "stale_connection_retries", "targets"}
    assert set(summary) == PER_REQUEST_KEYS | added
    direct = summary["paths"]["direct"]
    assert set(direct) == PER_PATH_KEYS | {"last_ended_unix", "connections_closed_by_server"}
    assert summary["connection_mode"] == "per-request"
    assert summary["stale_connection_retries"] == 0
    assert direct["connections_closed_by_server"] == 0
    assert direct["last_began_unix"] <= direct["last_ended_unix"] <= time.time()
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    assert summary["requests_ok"] >= 3
    assert engine_proxy.accepted == summary["requests_ok"]


def test_pooled_mode_reuses_one_connection(engine, engine_proxy, tmp_path):
    summary = pooled(
        tmp_path,
        engine_proxy.port,
        "--api-key-file",
        str(engine["keys"]),
        "--duration",
        "2",
        "--stream-percent",
        "50",
    )
    assert summary["connection_mode"] == "pooled"
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    # However slow the machine: several requests, all on the one connection.
    assert summary["requests_ok"] >= 3
    assert summary["streams_completed"] > 0
    # Streamed (chunked) and plain answers alike leave the connection reusable.
    assert engine_proxy.accepted == 1
    assert summary["paths"]["direct"]["connections_closed_by_server"] == 0
    assert summary["stale_connection_retries"] == 0


def test_connection_close_makes_the_pool_open_a_new_connection(raw_server, tmp_path):
    server = raw_server(answers_per_connection=2)
    summary = pooled(tmp_path, server.port, "--duration", "0.6", "--stream-percent", "0")
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    ok = summary["requests_ok"]
    assert ok >= 4
    assert summary["paths"]["direct"]["connections_closed_by_server"] == server.sent_close
    assert server.sent_close == ok // 2
    assert server.accepted == (ok + 1) // 2
    assert summary["stale_connection_retries"] == 0


def test_a_close_that_arrived_before_reuse_costs_nothing(raw_server, tmp_path):
    # The server closes each connection as soon as it has answered (idle for 0 s), and the
    # requests come 250 ms apart: the close is there before the reuse, and the pool sees it
    # before it sends, as httpx and urllib3 do.
    server = raw_server(idle_close_s=0)
    summary = pooled(
        tmp_path, server.port, "--duration", "1.5", "--rate", "4", "--stream-percent", "0"
    )
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    assert summary["stale_connection_retries"] == 0
    assert server.accepted == summary["requests_ok"] >= 3


def test_a_request_that_races_the_servers_close_is_retried_once_on_a_new_one(raw_server, tmp_path):
    # Each connection answers once, then closes as the next request arrives.
    server = raw_server(drop_after_answers=1)
    summary = pooled(
        tmp_path, server.port, "--duration", "1", "--rate", "10", "--stream-percent", "0"
    )
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    assert summary["stale_connection_retries"] >= 3
    # Each retry opened exactly one new connection.
    assert server.accepted == 1 + summary["stale_connection_retries"]
    assert summary["paths"]["direct"]["connections_closed_by_server"] == 0


def test_failures_on_a_new_connection_are_not_retried(raw_server, tmp_path):
    # The first connection answers once and drops the next request; every later one drops
    # its first request.
    server = raw_server(drop_after_answers=1, answering_connections=1)
    summary = pooled(
        tmp_path, server.port, "--duration", "0.6", "--rate", "10", "--stream-percent", "0"
    )
    assert summary["requests_ok"] >= 1
    # Only the request on the reused connection was sent again, and its retry failed.
    assert summary["stale_connection_retries"] == 1
    assert summary["requests_failed"] >= 3
    assert set(summary["failures_by_cause"]) == {"connection_reset"}
    assert server.accepted == 1 + summary["requests_failed"]


def test_an_expired_idle_connection_is_not_reused(raw_server, tmp_path):
    server = raw_server()
    # Expiry 0: every idle connection has expired by the next request, however the rate
    # limiter spaces them.
    summary = pooled(
        tmp_path,
        server.port,
        "--duration",
        "1",
        "--rate",
        "10",
        "--stream-percent",
        "0",
        "--keepalive-expiry",
        "0",
    )
    assert summary["requests_failed"] == 0, summary["failure_examples"]
    assert summary["requests_ok"] >= 3
    assert server.accepted == summary["requests_ok"]
    assert summary["stale_connection_retries"] == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--connection-mode", "bogus"],
            "argument --connection-mode: invalid choice: 'bogus' (choose from 'per-request', "
            "'pooled')",
        ),
        (
            ["--connection-mode", "pooled", "--requests-per-connection", "3"],
            "--requests-per-connection applies to --connection-mode per-request only",
        ),
        (["--keepalive-expiry", "-1"], "--keepalive-expiry must not be negative"),
    ],
)
def test_bad_connection_options_are_refused(tmp_path, args, message):
    result = subprocess.run(
        [
            sys.executable,
            str(LOAD),
            "--summary",
            str(tmp_path / "summary.json"),
            "--model",
            MODEL,
            "--target",
            "127.0.0.1:9",
            *args,
        ],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "summary.json").exists()
