"""zerolayer-store-exporter against a real etcd: records, owner leases and the fence written
with the collection's own functions, then read back as the exporter serves them."""

import contextlib
import datetime
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout, store_exporter
from ansible_collections.zerolayer.fleet.plugins.module_utils.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_records import (
    StoreRecords,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_store import (
    RolloutStore,
    runner_identity,
)

from .etcd_member import free_port

COLLECTIONS_PATH = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
)
SCHEDULE = [{"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]


def started_wave(store, rollout_id="chat-a", wave="wave_canary", epoch=0):
    """A wave as a runner leaves it once its first stage holds; returns its records."""
    records = StoreRecords(store, "%s/%s" % (rollout_id, wave))
    now = datetime.datetime.now(datetime.timezone.utc)
    record, _c, _n = rollout.plan(
        None, "%s:%s" % (rollout_id, wave), SCHEDULE, None, False, now, "runner@ctl", epoch=epoch
    )
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, now, "runner@ctl")
    record, _c = rollout.apply(record, "hold_started", {}, now, "runner@ctl")
    records.write(record, 0)
    return records


def series(text):
    """{name{labels}: value} of an exposition text, labels sorted."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})?", name_labels)
            labels = ",".join(sorted((match.group(2) or "").split(","))) if match.group(2) else ""
            found["%s{%s}" % (match.group(1), labels)] = float(value)
    return found


def scrape(store):
    return series(store_exporter.render(store_exporter.collect(store)))


WAVE = 'rollout_id="chat-a",wave="wave_canary"'


def test_running_wave_with_its_runner_holding_the_scope(store):
    epoch = store.raise_fence("fast", "an earlier rollback", "oncall@laptop")["epoch"]
    started_wave(store, epoch=epoch)
    holder = store.acquire("gpu_nodes", runner_identity("chat-a"), 30)
    try:
        got = scrape(store)
    finally:
        store.release("gpu_nodes", holder["lease"])
    assert got["zerolayer_rollout_store_up{}"] == 1
    assert got["zerolayer_rollout_store_unreadable_keys{}"] == 0
    assert got["zerolayer_rollout_store_fence_epoch{}"] == epoch == 1
    assert got['zerolayer_rollout_store_wave_info{outcome="running",%s}' % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_paused{%s}" % WAVE] == 0
    assert got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_owner_lease_ttl_seconds{%s}" % WAVE] == 30
    # Just granted: the heartbeat's threshold (a third of the TTL) is far away.
    assert 20 <= got["zerolayer_rollout_store_wave_owner_lease_remaining_seconds{%s}" % WAVE] <= 30
    assert got["zerolayer_rollout_store_wave_fence_epoch{%s}" % WAVE] == epoch


def test_released_scope_leaves_the_running_wave_without_owner(store):
    started_wave(store)
    holder = store.acquire("gpu_nodes", runner_identity("chat-a"), 30)
    store.release("gpu_nodes", holder["lease"])
    got = scrape(store)
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 0
    assert not any("lease" in name for name in got)


def test_expired_lease_of_a_dead_runner(store):
    """No heartbeat renews the lease (a runner killed with -9): etcd expires it by itself."""
    started_wave(store)
    store.acquire("gpu_nodes", runner_identity("chat-a"), 5)
    deadline = time.monotonic() + 30
    while True:
        got = scrape(store)
        if got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 0:
            break
        # Until etcd removes the key, the time left runs down to -1 (expired).
        assert got["zerolayer_rollout_store_wave_owner_lease_remaining_seconds{%s}" % WAVE] <= 5
        assert time.monotonic() < deadline, "etcd did not expire the lease within 30 s"
        time.sleep(0.5)
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 1


def test_paused_wave_says_since_when(store):
    records = started_wave(store)
    record, token = records.read()
    before = time.time()
    paused, _c = rollout.apply(
        record,
        "pause",
        {"reason": "look at the p99 page"},
        datetime.datetime.now(datetime.timezone.utc),
        "oncall@laptop",
    )
    records.write(paused, token)
    got = scrape(store)
    assert got['zerolayer_rollout_store_wave_info{outcome="paused",%s}' % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_paused{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 0
    since = got["zerolayer_rollout_store_wave_paused_since_timestamp_seconds{%s}" % WAVE]
    assert before - 1 <= since <= time.time()


def test_finished_wave_and_a_key_of_another_kind(store):
    records = started_wave(store)
    record, token = records.read()
    done, _c = rollout.apply(
        record,
        "rolled_back",
        {"details": {"mode": "fast"}},
        datetime.datetime.now(datetime.timezone.utc),
        "rollback@ctl",
    )
    records.write(done, token)
    store.client.put(store.key("rollouts", "notes"), "not a record")
    got = scrape(store)
    assert got["zerolayer_rollout_store_unreadable_keys{}"] == 1
    assert got['zerolayer_rollout_store_wave_info{outcome="rolled_back",%s}' % WAVE] == 1
    assert [name for name in got if "_wave_" in name and "_info" not in name] == []


def test_unreachable_store_says_so():
    dead = RolloutStore(EtcdClient("http://127.0.0.1:%d" % free_port(), timeout=1))
    # Up 0 and nothing of the store; the exporter's own version (run from the checkout here).
    assert scrape(dead) == {
        "zerolayer_rollout_store_up{}": 0,
        'zerolayer_node_artifact_info{version="unpackaged"}': 1,
    }


@contextlib.contextmanager
def running_exporter(config_path, port):
    """zerolayer-store-exporter as its unit runs it, in a process group of its own."""
    command = (
        "import sys; sys.path.insert(0, %r); "
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.store_exporter "
        "import exporter_main; sys.exit(exporter_main())" % COLLECTIONS_PATH
    )
    process = subprocess.Popen(
        [sys.executable, "-c", command, "--store-config", config_path, "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        process.stderr.close()


def http_metrics(port, process):
    deadline = time.monotonic() + 15
    while True:
        try:
            # Only ever http://127.0.0.1:<port> of the exporter this test started.
            url = "http://127.0.0.1:%d/metrics" % port
            with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
                return answer.read().decode()
        except OSError:
            if process.poll() is not None:
                pytest.fail("exporter exited: %s" % process.stderr.read().decode())
            assert time.monotonic() < deadline, "the exporter did not answer within 15 s"
            time.sleep(0.2)


def test_the_command_serves_the_store_over_http(store, etcd_url, tmp_path):
    started_wave(store)
    holder = store.acquire("gpu_nodes", runner_identity("chat-a"), 30)
    config = tmp_path / "store.json"
    config.write_text(json.dumps({"endpoints": [etcd_url], "prefix": store.prefix}))
    port = free_port()
    try:
        with running_exporter(str(config), port) as process:
            text = http_metrics(port, process)
    finally:
        store.release("gpu_nodes", holder["lease"])
    got = series(text)
    assert got["zerolayer_rollout_store_up{}"] == 1
    assert got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 1
    assert "# TYPE zerolayer_rollout_store_wave_running gauge" in text


def test_the_server_reads_the_store_on_every_scrape(store):
    """One look per scrape: a pause made between two scrapes is in the second."""
    records = started_wave(store)
    servers = []
    ready = threading.Event()

    def started(server):
        servers.append(server)
        ready.set()

    thread = threading.Thread(
        target=store_exporter.serve,
        args=(store, "127.0.0.1", 0),
        kwargs={"ready": started},
        daemon=True,
    )
    thread.start()
    try:
        assert ready.wait(10)
        url = "http://127.0.0.1:%d/metrics" % servers[0].server_address[1]
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
            first = series(answer.read().decode())
        record, token = records.read()
        paused, _c = rollout.apply(
            record, "pause", {}, datetime.datetime.now(datetime.timezone.utc), "oncall@laptop"
        )
        records.write(paused, token)
        with urllib.request.urlopen(url, timeout=5) as answer:  # noqa: S310
            second = series(answer.read().decode())
    finally:
        if servers:
            servers[0].shutdown()
        thread.join(10)
    assert first["zerolayer_rollout_store_wave_paused{%s}" % WAVE] == 0
    assert second["zerolayer_rollout_store_wave_paused{%s}" % WAVE] == 1
