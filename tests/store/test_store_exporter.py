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
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import fence_watcher
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
    runner_identity,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter

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
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry.store_exporter "
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


def stuck_wave(store, abort, rollout_id="chat-s"):
    """A wave planned an hour ago with a 60 s deadline, its runner gone: stuck now."""
    records = StoreRecords(store, "%s/wave_canary" % rollout_id)
    then = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)
    record, _c, _n = rollout.plan(
        None, "%s:wave_canary" % rollout_id, SCHEDULE, None, False, then, "runner@ctl",
        epoch=0, progress={"deadline_s": 60, "abort": abort},
    )  # fmt: skip
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, then, "runner@ctl")
    records.write(record, 0)
    return records


def stuck_events(store, rollout_id="chat-s"):
    return [
        entry
        for entry in rollout_events.list_events(store, rollout_id, with_fleet=False)
        if entry["type"] == "stuck"
    ]


def test_a_stuck_wave_is_announced_once_by_all_members_and_reaches_the_sinks_by_the_sender(
    store, webhook_receiver
):
    notify.write_sinks(
        store, [{"name": "oncall", "url": webhook_receiver.url("/oncall"), "allow_http": True}]
    )
    records = stuck_wave(store, abort=False)
    # Two members' exporters look at the same moment: one announces, the other finds it done.
    first = store_exporter.watch_deadlines(store, actor="exporter@m1")
    second = store_exporter.watch_deadlines(store, actor="exporter@m2")
    assert first == [{"record_key": "chat-s/wave_canary", "action": "announce"}]
    assert second == []
    (event,) = stuck_events(store)
    assert event["wave"] == "wave_canary" and event["stage"] == 1 and event["weight"] == 5
    assert event["detail"]["deadline_s"] == 60 and "no runner owns it" in event["reason"]
    # The exporter sends nothing itself (its store user cannot read the sinks, which are
    # secrets); the fleet's next sender sends the event, in the store's order.
    assert [body for body in webhook_receiver.bodies("/oncall") if body["type"] == "stuck"] == []
    assert notify.send_now(store) == "caught up"
    (sent,) = [body for body in webhook_receiver.bodies("/oncall") if body["type"] == "stuck"]
    assert sent["rollout_id"] == "chat-s" and sent["summary"].startswith("stuck: chat-s")
    record, _token = records.read()
    assert record["outcome"] == "running", "announced, not aborted (abort not asked)"
    assert store.fence()["epoch"] == 0


def test_progress_after_a_stuck_episode_makes_the_next_one_announced_again(store):
    records = stuck_wave(store, abort=False)
    assert store_exporter.watch_deadlines(store)
    record, token = records.read()
    long_ago = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=30)
    moved, _c = rollout.apply(record, "hold_started", {}, long_ago, "runner@ctl")
    records.write(moved, token)
    assert store_exporter.watch_deadlines(store), "a new episode (progress, then stuck again)"
    assert len(stuck_events(store)) == 2


def test_a_live_runner_keeps_a_wave_past_its_deadline_from_being_stuck(store):
    stuck_wave(store, abort=True)
    holder = store.acquire("gpu_nodes", runner_identity("chat-s"), 30)
    try:
        assert store_exporter.watch_deadlines(store, may_abort=True) == []
    finally:
        store.release("gpu_nodes", holder["lease"])
    assert stuck_events(store) == [] and store.fence()["epoch"] == 0


def test_a_stuck_wave_whose_record_asks_for_it_is_aborted_where_the_exporter_may(store):
    records = stuck_wave(store, abort=True)
    announced = store_exporter.watch_deadlines(store, may_abort=False)
    assert announced[0]["action"].startswith("announce (abort asked")
    assert records.read()[0]["outcome"] == "running" and store.fence()["epoch"] == 0

    other = stuck_wave(store, abort=True, rollout_id="chat-t")
    announced = store_exporter.watch_deadlines(store, may_abort=True, actor="exporter@m1")
    assert announced == [{"record_key": "chat-t/wave_canary", "action": "abort"}]
    fence = store.fence()
    assert fence["epoch"] == 1 and fence["action"] == "abort" and fence["actor"] == "exporter@m1"
    assert "progress deadline" in fence["reason"]
    assert other.read()[0]["outcome"] == "aborted"
    assert store_exporter.watch_deadlines(store, may_abort=True) == [], "aborted: not stuck"


def test_watchers_present_and_one_gone_since_the_exporter_saw_it(store):
    n1, n2 = fence_watcher.Presence(store, "n1"), fence_watcher.Presence(store, "n2")
    for presence in (n1, n2):
        presence.beat()
        assert presence.keep()
    known = set()
    try:
        got = series(store_exporter.render(store_exporter.collect(store, known=known)))
        assert got["zerolayer_rollout_store_watchers_present{}"] == 2
        assert got['zerolayer_rollout_store_watcher_present{node="n1"}'] == 1
        n2.stop()  # revoked: gone from the store at once, still known to the exporter
        got = series(store_exporter.render(store_exporter.collect(store, known=known)))
        assert got["zerolayer_rollout_store_watchers_present{}"] == 1
        assert got['zerolayer_rollout_store_watcher_present{node="n2"}'] == 0
    finally:
        n1.stop()
        n2.stop()
