"""The rollout store against a real etcd: the v3 JSON gateway client, the fence raised by
compare-and-swap, one owner per scope on a lease, the heartbeat tied to its runner."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    stat_fields,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC as FENCE_SPEC,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    fence_call,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import heartbeat
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (
    EtcdClient,
    StoreUnavailable,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    OwnerConflict,
    OwnerLost,
    runner_identity,
)

from .adhoc import run_module


def test_compare_and_swap_writes_only_on_the_revision_it_read(store):
    client, key = store.client, store.key("cas")
    assert client.put_if(key, {"n": 1}, 0) == (True, None)
    first = client.get(key)
    assert client.put_if(key, {"n": 2}, first.mod_revision)[0] is True
    lost, current = client.put_if(key, {"n": 3}, first.mod_revision)
    assert lost is False and current.json() == {"n": 2}, "the stale writer sees what won"
    assert client.put_if(key, {"n": 4}, 0)[0] is False, "create-only fails once it exists"


def test_the_fence_starts_at_zero_and_each_raise_goes_one_up(store):
    assert store.fence()["epoch"] == 0
    first = store.raise_fence("fast", "p99 page", "sre@ctl")
    assert (first["epoch"], first["action"], first["actor"]) == (1, "fast", "sre@ctl")
    assert store.raise_fence("deep", "still bad", "sre@ctl")["epoch"] == 2
    assert store.raise_fence("abort", "nodes fenced alone", "sre@ctl", at_least=7)["epoch"] == 8
    kept = store.fence()
    assert kept["epoch"] == 8 and kept["reason"] == "nodes fenced alone"


def catch_up(store, etcd_url, check_mode=False, **overrides):
    """rollout_fence raise with catch_up_to, as canary.yml calls it, on this test's store."""
    given = {name: spec.get("default") for name, spec in FENCE_SPEC.items()}
    given.update(endpoints=[etcd_url], prefix=store.prefix, timeout=3.0, action="raise")
    given.update(rollback_mode="catch_up", reason="nodes fenced alone", require_store=True)
    given.update(overrides)
    return fence_call(given, check_mode)


def test_a_catch_up_brings_the_store_to_the_nodes_epoch_and_never_past_it(store, etcd_url):
    store.raise_fence("fast", "p99 page", "sre@ctl")
    checked = catch_up(store, etcd_url, check_mode=True, catch_up_to=5)
    assert checked["changed"] and checked["fence"]["epoch"] == 5, checked
    assert store.fence()["epoch"] == 1, "check mode writes nothing"
    caught_up = catch_up(store, etcd_url, catch_up_to=5)
    assert caught_up["changed"] and caught_up["fence"]["epoch"] == 5, caught_up
    assert store.fence()["action"] == "catch_up"
    again = catch_up(store, etcd_url, catch_up_to=5)
    assert not again["changed"] and not again["store_updated"], again
    assert again["fence"]["epoch"] == 5, again
    assert not catch_up(store, etcd_url, check_mode=True, catch_up_to=5)["changed"]
    assert store.raise_fence("catch_up", "again", "t", catch_up_to=4) is None
    assert catch_up(store, etcd_url, catch_up_to=3)["fence"]["epoch"] == 5
    assert store.fence()["epoch"] == 5, "a store already at or above the nodes is left as it is"


@pytest.mark.parametrize(
    "overrides",
    [
        {"catch_up_to": 4, "rollback_mode": "fast"},
        {"catch_up_to": 4, "action": "read"},
        {"catch_up_to": 0},
        {"catch_up_to": 4, "at_least": 2},
    ],
)
def test_a_bad_catch_up_names_the_field_and_changes_nothing(store, etcd_url, overrides):
    with pytest.raises(FleetError) as failed:
        catch_up(store, etcd_url, **overrides)
    assert failed.value.details["field"] == "catch_up_to"
    assert store.fence() == {"epoch": 0, "mod_revision": 0}


def test_concurrent_raises_each_get_their_own_epoch(store):
    epochs, errors = [], []

    def raise_once():
        try:
            epochs.append(store.raise_fence("fast", "race", "t")["epoch"])
        except FleetError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=raise_once) for _thread in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert sorted(epochs) == [1, 2, 3, 4, 5, 6], "no two raisers wrote the same epoch"
    assert store.fence()["epoch"] == 6


@pytest.mark.parametrize(
    ("args", "field"),
    [(("rollback", "r", "a"), "action"), (("fast", "r", "a", -1), "at_least")],
)
def test_a_bad_raise_names_the_field_and_changes_nothing(store, args, field):
    with pytest.raises(FleetError) as failed:
        store.raise_fence(*args)
    assert failed.value.details["field"] == field
    assert store.fence() == {"epoch": 0, "mod_revision": 0}


def test_a_second_runner_is_refused_naming_the_holder(store):
    mine = store.acquire("gpu_nodes", runner_identity("chat-a", 1111), 10)
    with pytest.raises(OwnerConflict) as refused:
        store.acquire("gpu_nodes", runner_identity("chat-b", 2222), 10)
    message = refused.value.message
    assert "pid 1111" in message and "rollout chat-a" in message and "since" in message
    assert refused.value.details["holder"]["rollout_id"] == "chat-a"
    assert store.owner("gpu_nodes")["rollout_id"] == "chat-a", "the refusal changed nothing"
    store.release("gpu_nodes", mine["lease"])
    assert store.owner("gpu_nodes") is None
    assert store.acquire("gpu_nodes", runner_identity("chat-b", 2222), 10)["rollout_id"] == "chat-b"


def test_a_runner_whose_lease_is_gone_is_told_so_before_it_writes(store):
    """A lease that expired (its heartbeat could not renew it: here revoked, as etcd does at
    the TTL) takes the owner key with it; confirm then fails, naming nobody, and once
    another runner took the scope, naming that runner. The holder confirms fine."""
    mine = store.acquire("gpu_nodes", runner_identity("chat-a", 1111), 10)
    assert store.confirm_owner("gpu_nodes", mine["lease"])["rollout_id"] == "chat-a"
    store.client.revoke_lease(mine["lease"])
    with pytest.raises(OwnerLost) as lost:
        store.confirm_owner("gpu_nodes", mine["lease"])
    assert "nobody holds it now" in lost.value.message and lost.value.details["holder"] is None
    assert lost.value.details["outcome"] == "refused"
    other = store.acquire("gpu_nodes", runner_identity("chat-b", 2222), 10)
    with pytest.raises(OwnerLost) as taken:
        store.confirm_owner("gpu_nodes", mine["lease"])
    assert "pid 2222" in taken.value.message and "rollout chat-b" in taken.value.message
    assert store.confirm_owner("gpu_nodes", other["lease"])["rollout_id"] == "chat-b"
    store.release("gpu_nodes", other["lease"])


def test_the_owner_module_confirms_and_refuses_as_the_store_does(etcd_url, store):
    mine = store.acquire("wave_q", runner_identity("chat-q", 3333), 10)
    held = run_module(
        "rollout_owner", etcd_url, store.prefix, action="confirm", scope="wave_q",
        lease=mine["lease"],
    )  # fmt: skip
    assert not held.get("failed") and held["owner"]["rollout_id"] == "chat-q", held
    assert held["changed"] is False
    store.release("wave_q", mine["lease"])
    lost = run_module(
        "rollout_owner", etcd_url, store.prefix, action="confirm", scope="wave_q",
        lease=mine["lease"],
    )  # fmt: skip
    assert lost.get("failed") and "no longer owns scope wave_q" in lost["msg"], lost
    assert lost.get("field") == "lease", lost
    missing = run_module("rollout_owner", etcd_url, store.prefix, action="confirm", scope="x")
    assert missing.get("failed") and "lease" in missing["msg"], missing


def test_a_scope_under_another_name_that_shares_a_node_is_refused(store):
    fleet = ["node-01", "node-02", "node-03"]
    mine = store.acquire("gpu_nodes", runner_identity("chat-a", 1111), 10, hosts=fleet)
    assert store.owner("gpu_nodes")["hosts"] == fleet
    with pytest.raises(OwnerConflict) as refused:
        store.acquire("wave_canary", runner_identity("chat-b", 2222), 10, hosts=["node-01"])
    message = refused.value.message
    assert "overlaps scope gpu_nodes" in message and "rollout chat-a" in message
    assert "hosts in both: node-01" in message
    assert refused.value.details["overlap"] == ["node-01"]
    assert store.owner("wave_canary") is None, "the refusal changed nothing"
    # Disjoint hosts under another name are another owner's business.
    other = store.acquire("gpu_b", runner_identity("chat-c", 3333), 10, hosts=["node-09"])
    assert other["hosts"] == ["node-09"]
    # Once the holder gives its scope up, the overlapping one can be taken.
    store.release("gpu_nodes", mine["lease"])
    assert store.acquire("wave_canary", runner_identity("chat-b", 2222), 10, hosts=["node-01"])


def test_an_overlapping_scope_taken_between_the_read_and_the_write_is_seen(store, monkeypatch):
    """The owners read must still hold at the write: a scope taken in between makes the
    acquire read again, and refuse."""
    read = store.client.get_prefix_at
    raced = []

    def read_then_someone_takes_gpu_nodes(prefix, *args):
        answer = read(prefix, *args)
        if not raced:
            raced.append(True)
            store.acquire("gpu_nodes", runner_identity("chat-a", 1111), 10, hosts=["node-01"])
        return answer

    monkeypatch.setattr(store.client, "get_prefix_at", read_then_someone_takes_gpu_nodes)
    with pytest.raises(OwnerConflict) as refused:
        store.acquire("wave_canary", runner_identity("chat-b", 2222), 10, hosts=["node-01"])
    assert refused.value.details["overlap"] == ["node-01"]
    assert store.owner("wave_canary") is None


@pytest.mark.parametrize("hosts", [[], "node-01", ["node 01"], [7]])
def test_bad_scope_hosts_name_the_field_and_take_nothing(store, hosts):
    with pytest.raises(FleetError) as failed:
        store.acquire("gpu_nodes", runner_identity("x"), 10, hosts=hosts)
    assert failed.value.details["field"] == "hosts"
    assert store.owner("gpu_nodes") is None


@pytest.mark.parametrize(("scope", "ttl"), [("gpu nodes", 10), ("gpu_nodes", 2), ("", 10)])
def test_bad_owner_input_names_the_field(store, scope, ttl):
    with pytest.raises(FleetError) as failed:
        store.acquire(scope, runner_identity("x"), ttl)
    assert failed.value.details["field"] in ("scope", "ttl")


def test_the_heartbeat_keeps_the_lease_while_its_runner_lives_and_lets_it_expire_after(store):
    runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              start_new_session=True)  # fmt: skip
    try:
        held = store.acquire("wave_a", runner_identity("chat-a", runner.pid), 5)
        identity = heartbeat.runner_process(runner.pid)
        started = heartbeat._stat(runner.pid)[1]
        assert identity[0] != runner.pid or identity[1] == started
        beating = heartbeat.start_detached(store.client, held["lease"], (runner.pid, started), 5)
        time.sleep(7)  # longer than the TTL: only the heartbeat keeps it
        assert store.owner("wave_a")["pid"] == runner.pid, "alive runner, renewed lease"
        os.killpg(runner.pid, signal.SIGKILL)
        runner.wait(timeout=10)
        # The dead runner stays visible until its lease runs out, then the scope is free.
        assert store.owner("wave_a") is not None
        deadline = time.monotonic() + 15
        while store.owner("wave_a") is not None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert store.owner("wave_a") is None, "the lease expired after the runner died"
        deadline = time.monotonic() + 5
        while heartbeat._stat(beating) is not None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert heartbeat._stat(beating) is None or "Z" in open("/proc/%d/stat" % beating).read()
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait(timeout=10)


def test_watch_delivers_a_change_of_the_fence(store):
    seen = []

    def watch():
        for events in store.client.watch(store.key("fence"), timeout=10):
            seen.extend(kv.json()["epoch"] for kv in events)
            return

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.5)
    store.raise_fence("fast", "watched", "t")
    watcher.join(timeout=15)
    assert seen == [1]


def test_an_unreachable_store_says_so():
    client = EtcdClient(["http://127.0.0.1:9", "http://127.0.0.1:10"], timeout=1)
    with pytest.raises(StoreUnavailable) as failed:
        client.get("/zerolayer/fence")
    assert "127.0.0.1:9" in failed.value.message and "127.0.0.1:10" in failed.value.message


def wait_stopped(pid, timeout=10):
    """Wait until every thread of process pid is stopped (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while True:
        states = []
        for task in os.listdir("/proc/%d/task" % pid):
            fields = stat_fields(pid, task)
            if fields is not None:
                states.append(fields[0])
        if states and all(state == "T" for state in states):
            return
        assert time.monotonic() < deadline, "process %d did not stop: %s" % (pid, states)
        time.sleep(0.01)


@pytest.fixture
def paused_member(etcd_member):
    """pause(seconds): the member stops answering (SIGSTOP, as a member stalled on a slow
    disk) and resumes after `seconds`; it is resumed at the end of the test whatever happens."""
    timers = []

    def resume():
        os.killpg(etcd_member.proc.pid, signal.SIGCONT)

    def pause(seconds):
        os.killpg(etcd_member.proc.pid, signal.SIGSTOP)
        timers.append(threading.Timer(seconds, resume))
        timers[-1].start()
        # kill() returns before every thread has stopped (each stops on its next way back
        # from the kernel): on a loaded machine a request sent at once could still be
        # answered. The test's clock starts once all of them are stopped.
        wait_stopped(etcd_member.proc.pid)

    try:
        yield pause
    finally:
        for timer in timers:
            timer.cancel()
        resume()


def test_a_read_is_asked_once_more_when_the_member_did_not_answer_in_time(store, paused_member):
    client = EtcdClient(store.client.endpoints, timeout=2)
    client.put(store.key("busy"), {"n": 1})
    # The first try times out after 2 s; the second, sent then, is answered at the resume (3 s).
    paused_member(3)
    started = time.monotonic()
    assert client.get(store.key("busy")).json() == {"n": 1}
    assert time.monotonic() - started >= 2.5


def test_a_write_is_never_asked_twice(store, paused_member):
    client = EtcdClient(store.client.endpoints, timeout=2)
    paused_member(3)
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        client.put(store.key("busy-write"), {"n": 1})
    # One try of 2 s, not two: a second copy of a write that was applied is a second write.
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("endpoints", [[], ["127.0.0.1:2379"], ["ftp://x"]])
def test_bad_endpoints_name_the_field(endpoints):
    with pytest.raises(FleetError) as failed:
        EtcdClient(endpoints)
    assert failed.value.details["field"] == "endpoints"


def test_a_value_that_is_not_json_names_its_key(store):
    store.client.put(store.key("fence"), "not json")
    with pytest.raises(FleetError) as failed:
        store.fence()
    assert failed.value.details["key"] == store.key("fence")
    json.dumps(failed.value.details)


def test_a_runner_on_the_same_host_waits_out_a_dead_holders_lease(store):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=30)
    started = 12345  # its start time: the pid is gone, or now another process
    store.acquire("gpu_nodes", runner_identity("chat-a", dead.pid, started), 5)
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        time.sleep(seconds)

    mine = store.acquire(
        "gpu_nodes", runner_identity("chat-a", os.getpid(), heartbeat._stat(os.getpid())[1]), 5,
        alive=heartbeat.alive, sleep=sleep,
    )  # fmt: skip
    assert mine["pid"] == os.getpid() and slept and sum(slept) <= 5 + 10


def test_a_lease_that_reads_expired_but_whose_key_etcd_has_not_removed_yet_is_waited_for(
    store, monkeypatch
):
    """etcd removes an expired lease's keys a moment after the TTL (seconds on a busy store):
    the retry that finds the lease at -1 must wait a little more, not give up because the
    wait for the TTL itself was long."""
    dead_holder = {"host": socket.gethostname(), "pid": 1, "pid_started": 1}
    answers = iter([30, -1, -1, -1, None])  # seconds left at each try; None: free

    def attempt(_scope, identity, _ttl, _hosts=None):
        left = next(answers)
        if left is None:
            return dict(identity, lease=7)
        raise OwnerConflict("held", {"field": "scope", "holder": dead_holder, "ttl_left_s": left})

    monkeypatch.setattr(store, "_acquire_once", attempt)
    slept = []
    mine = store.acquire(
        "gpu_nodes", runner_identity("chat-b", 2222), 30,
        alive=lambda _pid, _started: False, sleep=slept.append,
    )  # fmt: skip
    assert mine["lease"] == 7 and slept == [30, 0.5, 0.5, 0.5]


def test_a_dead_holder_whose_key_never_goes_is_given_up_on_after_its_ttl_and_10_s(
    store, monkeypatch
):
    dead_holder = {"host": socket.gethostname(), "pid": 1, "pid_started": 1}

    def attempt(_scope, _identity, _ttl, _hosts=None):
        raise OwnerConflict("held", {"field": "scope", "holder": dead_holder, "ttl_left_s": -1})

    monkeypatch.setattr(store, "_acquire_once", attempt)
    slept = []
    with pytest.raises(OwnerConflict):
        store.acquire(
            "gpu_nodes", runner_identity("chat-b", 2222), 30,
            alive=lambda _pid, _started: False, sleep=slept.append,
        )  # fmt: skip
    assert 10 < sum(slept) <= 11


def test_a_live_holder_is_refused_at_once_even_on_the_same_host(store):
    me = heartbeat._stat(os.getpid())[1]
    store.acquire("gpu_nodes", runner_identity("chat-a", os.getpid(), me), 10)
    with pytest.raises(OwnerConflict):
        store.acquire(
            "gpu_nodes",
            runner_identity("chat-b", os.getpid(), me),
            10,
            alive=heartbeat.alive,
            sleep=lambda _s: pytest.fail("must not wait"),
        )


def test_the_runner_is_the_topmost_ansible_playbook_not_its_worker(tmp_path):
    """Modules run in a worker forked from ansible-playbook, with the same command line: the
    heartbeat must follow the process that lives as long as the rollout."""
    probe = (
        "import sys; sys.path.insert(0, %r); "
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.store import heartbeat; "
        "print(heartbeat.runner_process()[0])"
        % os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
    )
    playbook = tmp_path / "ansible-playbook"
    playbook.write_text(
        "import os, subprocess, sys\n"
        "print(os.getpid(), flush=True)\n"
        "worker = os.fork()\n"
        "if worker == 0:\n"
        "    subprocess.run([sys.executable, '-c', sys.argv[1]], check=True)\n"
        "    os._exit(0)\n"
        "os.waitpid(worker, 0)\n"
    )
    out = subprocess.run(
        [sys.executable, str(playbook), probe], capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout.split()  # fmt: skip
    top, found = out
    assert found == top, "the worker (same command line) was taken for the runner"


def test_acknowledgements_are_counted_once_per_node_and_only_when_they_confirm(store):
    put = store.client.put
    put(store.key("acks", "n1"), {"epoch": 3, "confirmed": True, "at_unix": 9e9})  # clock ahead
    put(store.key("acks", "n2"), {"epoch": 2, "confirmed": True})  # an older rollback's
    put(store.key("acks", "n3"), {"epoch": 3, "confirmed": False})  # read back wrong
    put(store.key("acks", "n4"), "not json")
    put(store.key("acks", "n5"), {"epoch": 4, "confirmed": True})  # a later epoch counts
    put(store.key("acks", "stranger"), {"epoch": 3, "confirmed": True})  # not asked about
    nodes = ["n1", "n2", "n3", "n4", "n5"]
    assert sorted(store.acknowledged(3, nodes)) == ["n1", "n5"]

    # n1 acknowledges again: still one of it.
    put(store.key("acks", "n1"), {"epoch": 3, "confirmed": True, "at_unix": 0})
    ticks = iter(range(1000))
    acked, lagging, waited = store.wait_for_acks(
        3, nodes, wait_s=5, clock=lambda: next(ticks) * 0.5, sleep=lambda _s: None
    )
    assert sorted(acked) == ["n1", "n5"] and lagging == ["n2", "n3", "n4"]
    # Clock readings: 0 start, 0.5 the read asked, 1.0 its answer (when the ack was seen).
    assert waited >= 5 and acked["n1"]["seen_after_s"] == 1.0


def test_a_deep_count_takes_only_the_acks_of_a_deep_rollback(store):
    put = store.client.put
    put(store.key("acks", "n1"), {"epoch": 5, "action": "deep", "confirmed": True})
    # The fast fence raised after the deep one: this node may never have detached.
    put(store.key("acks", "n2"), {"epoch": 6, "action": "fast", "confirmed": True})
    assert sorted(store.acknowledged(5, ["n1", "n2"])) == ["n1", "n2"]
    assert sorted(store.acknowledged(5, ["n1", "n2"], deep=True)) == ["n1"]
    acked, lagging, _waited = store.wait_for_acks(5, ["n1", "n2"], wait_s=0, deep=True)
    assert list(acked) == ["n1"] and lagging == ["n2"]


def test_the_count_ends_when_acknowledgements_stop_coming_not_only_at_wait_s(store):
    store.client.put(store.key("acks", "n1"), {"epoch": 2, "confirmed": True})
    ticks = iter(range(1000))

    def clock():
        return next(ticks) * 0.1  # each reading 0.1 s later

    acked, lagging, waited = store.wait_for_acks(
        2, ["n1", "n2"], wait_s=30, clock=clock, sleep=lambda _s: None, quiet_s=0.5
    )
    assert list(acked) == ["n1"] and lagging == ["n2"]
    assert 0.5 <= waited < 1.5, "the count went on after the acknowledgements had stopped"


def test_with_no_acknowledgement_at_all_the_quiet_rule_never_ends_the_count(store):
    ticks = iter(range(1000))
    acked, lagging, waited = store.wait_for_acks(
        2, ["n1"], wait_s=3, clock=lambda: next(ticks) * 0.1, sleep=lambda _s: None, quiet_s=0.5
    )
    assert acked == {} and lagging == ["n1"] and waited >= 3


def test_waiting_ends_as_soon_as_every_node_confirmed(store):
    store.client.put(store.key("acks", "n1"), {"epoch": 1, "confirmed": True})
    acked, lagging, waited = store.wait_for_acks(1, ["n1"], wait_s=30)
    assert list(acked) == ["n1"] and lagging == [] and waited < 5


def test_after_its_first_read_the_count_asks_only_for_acks_written_since(store):
    # An ack that was there before the count (a push, an earlier run) is counted by the first
    # read; later reads ask from the last one's revision on, and still see what comes.
    store.client.put(store.key("acks", "n1"), {"epoch": 4, "confirmed": True})
    reads = []
    read_prefix = store.client.get_prefix_at

    def spying_read(prefix, min_create_revision=0, min_mod_revision=0):
        kvs, revision = read_prefix(prefix, min_create_revision, min_mod_revision)
        reads.append((min_mod_revision, len(kvs), revision))
        if len(reads) == 2:  # n2 acknowledges while the count runs
            store.client.put(store.key("acks", "n2"), {"epoch": 4, "confirmed": True})
        return kvs, revision

    store.client.get_prefix_at = spying_read
    acked, lagging, _waited = store.wait_for_acks(4, ["n1", "n2"], wait_s=10)
    assert sorted(acked) == ["n1", "n2"] and lagging == []
    (first_from, first_kvs, first_at), (second_from, second_kvs, second_at) = reads[:2]
    assert (first_from, first_kvs) == (0, 1), reads
    # The second read starts after the first and finds nothing new; the third finds only n2.
    assert (second_from, second_kvs) == (first_at + 1, 0), reads
    assert reads[2][:2] == (second_at + 1, 1), reads
