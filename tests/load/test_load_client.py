"""The load client against the real engine simulator on loopback."""

import json
import os
import pathlib
import socket
import subprocess
import sys
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
