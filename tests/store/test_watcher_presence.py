"""The fence watcher's presence against a real etcd and real watcher processes: a running
watcher is present, a stopped, killed or stuck one is not, and a rollback waits only for the
watchers present (the others get the push at once, not after the count's quiet period).

The watchers run as `zerolayer-routectl watch` does, on nodes a deep rollback detached
earlier (no router maps): a fast fence there records the epoch and is acknowledged, with no
kernel object needed, which is what a presence and a count are about.
"""

import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.node import fence_watcher
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC,
    fence_call,
)
from waiting import wait_until

from .watcher_processes import presence_of


def test_a_running_watcher_is_present_until_stopped_and_a_killed_one_expires(store, watchers):
    n1 = watchers("n1").start()
    started = time.monotonic()
    present = wait_until(lambda: presence_of(store, "n1"), "n1's presence", seconds=10)
    assert time.monotonic() - started < 5, "the presence came too late"
    assert present["node"] == "n1" and present["pid"] == n1.proc.pid
    assert present["started_at_unix"] <= present["at_unix"] <= time.time() + 1
    lease = store.client.get(store.key("presence", "n1")).lease
    assert 0 < store.client.lease_ttl(lease) <= fence_watcher.PRESENCE_TTL_S
    # Renewed: after more than its TTL it is still there, on the same lease.
    time.sleep(fence_watcher.PRESENCE_TTL_S + 1)
    assert store.client.get(store.key("presence", "n1")).lease == lease
    # A clean stop revokes the lease: gone at once.
    n1.stop()
    assert presence_of(store, "n1") is None

    # Killed (-9): nothing revokes it, the lease expires within its TTL.
    n2 = watchers("n2").start()
    wait_until(lambda: presence_of(store, "n2"), "n2's presence", seconds=10)
    n2.kill()
    killed = time.monotonic()
    wait_until(lambda: presence_of(store, "n2") is None, "n2's presence to expire", seconds=15)
    assert time.monotonic() - killed <= fence_watcher.PRESENCE_TTL_S + 2


def test_a_watcher_whose_loop_stops_beating_lets_its_presence_expire(store):
    now = [1000.0]
    logged = []
    presence = fence_watcher.Presence(
        store, "n1", ttl_s=2, renew_s=0.3, stall_s=30, clock=lambda: now[0], log=logged.append
    )
    presence.beat()
    presence.start()
    try:
        wait_until(lambda: presence_of(store, "n1"), "the presence", seconds=5)
        time.sleep(3)  # past its TTL: renewed all along while the loop beats
        assert presence_of(store, "n1") is not None
        now[0] += 31  # the loop has not beaten for 31 s: stuck
        wait_until(lambda: presence_of(store, "n1") is None, "the presence to expire", 10)
        assert any("has not turned" in line for line in logged), logged
        # The loop turns again: the lease is gone, so a new one is granted and written.
        presence.beat()
        wait_until(lambda: presence_of(store, "n1"), "the presence again", seconds=5)
    finally:
        presence.stop()
    assert presence_of(store, "n1") is None


def test_a_store_failure_while_renewing_is_logged_and_tried_again(store):
    logged = []
    presence = fence_watcher.Presence(store, "n1", log=logged.append)
    presence.beat()
    assert presence.keep()
    keep_alive = store.client.keep_alive

    def refused(_lease):
        raise fence_watcher.StoreUnavailable("the rollout store cannot be reached (test)")

    store.client.keep_alive = refused
    assert not presence.keep() and not presence.keep()
    assert logged == ["presence not kept in the store: the rollout store cannot be reached (test)"]
    store.client.keep_alive = keep_alive
    assert presence.keep() and presence.error is None
    presence.stop()


def params(store, etcd_url, **overrides):
    values = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    values.update(endpoints=[etcd_url], prefix=store.prefix, timeout=3.0, actor="pytest")
    values.update(overrides)
    return values


def test_a_rollback_waits_only_for_the_watchers_present(store, etcd_url, watchers):
    up, down = watchers("n-up").start(), watchers("n-down").start()
    for node in ("n-up", "n-down"):
        wait_until(lambda node=node: presence_of(store, node), node + "'s presence")
    down.stop()  # before the rollback: its watcher is gone
    quiet_s = 5.0
    result = fence_call(
        params(
            store, etcd_url, action="raise", reason="p99 page", nodes=["n-up", "n-down"],
            wait_s=30.0, quiet_s=quiet_s,
        )
    )  # fmt: skip
    assert result["store_updated"] and result["fence"]["epoch"] == 1, result
    assert "present" not in result["fence"], "the fence record keeps its shape"
    assert result["absent"] == ["n-down"], result
    assert list(result["acked"]) == ["n-up"] and result["lagging"] == ["n-down"], result
    # It ended once n-up acknowledged, not after quiet_s of quiet (which the count without
    # presence needs before n-down gets its push).
    assert result["waited_s"] < quiet_s / 2, result
    assert store.client.get(store.key("fence")).json()["epoch"] == 1
    up.stop()


def test_without_any_presence_in_the_store_the_count_is_as_before(store, etcd_url):
    # Watchers of a release before presence: n1 acknowledges, n2 is silent.
    store.client.put(store.key("acks", "n1"), {"epoch": 99, "confirmed": True})
    result = fence_call(
        params(
            store, etcd_url, action="raise", reason="t", nodes=["n1", "n2"],
            wait_s=10.0, quiet_s=0.5,
        )
    )  # fmt: skip
    assert result["absent"] is None, "no presence key at all: presence tells nothing"
    assert list(result["acked"]) == ["n1"] and result["lagging"] == ["n2"], result
    # The quiet rule ended it, as before: n2 was waited for.
    assert 0.5 <= result["waited_s"] < 5, result


def test_the_fence_and_the_presence_are_one_transaction(store):
    store.client.put(store.key("presence", "n1"), "{}")
    store.client.put(store.key("presence", "n2", "below"), "{}")  # names no node
    raised = store.raise_fence("fast", "t", "pytest", presence=True)
    assert raised["epoch"] == 1 and raised["present"] == ["n1"]
    assert "present" not in store.raise_fence("fast", "t", "pytest")
    fence = store.fence()
    done, revision, kvs = store.client.put_if_reading(
        store.key("fence"), {"epoch": 3}, fence["mod_revision"], store.key("presence") + "/"
    )
    assert done and revision == store.client.get(store.key("fence")).mod_revision
    assert sorted(kv.key for kv in kvs) == [
        store.key("presence", "n1"),
        store.key("presence", "n2", "below"),
    ]
    # A stale revision: nothing written, nothing read.
    assert store.client.put_if_reading(
        store.key("fence"), {"epoch": 9}, fence["mod_revision"], store.key("presence") + "/"
    )[::2] == (False, [])
    assert store.fence()["epoch"] == 3


def test_a_present_node_is_still_waited_for_with_the_quiet_rule(store):
    # n1 and n2 present, only n1 acknowledges: the count waits for n2 as it always did.
    store.client.put(store.key("acks", "n1"), {"epoch": 2, "confirmed": True})
    ticks = iter(range(1000))
    acked, lagging, waited = store.wait_for_acks(
        2, ["n1", "n2", "n3"], wait_s=30, clock=lambda: next(ticks) * 0.1,
        sleep=lambda _s: None, quiet_s=0.5, enough={"n1", "n2"},
    )  # fmt: skip
    assert list(acked) == ["n1"] and lagging == ["n2", "n3"]
    assert 0.5 <= waited < 1.5
    # Only n1 present: the count ends at the read that saw its acknowledgement.
    ticks = iter(range(1000))
    acked, lagging, waited = store.wait_for_acks(
        2, ["n1", "n2"], wait_s=30, clock=lambda: next(ticks) * 0.1,
        sleep=lambda _s: None, quiet_s=0.5, enough={"n1"},
    )  # fmt: skip
    assert list(acked) == ["n1"] and lagging == ["n2"] and waited <= 0.3
    # No node asked about is present: one read, then every one of them gets the push.
    ticks = iter(range(1000))
    acked, lagging, waited = store.wait_for_acks(
        2, ["n2", "n3"], wait_s=30, clock=lambda: next(ticks) * 0.1,
        sleep=lambda _s: None, quiet_s=0.5, enough=set(),
    )  # fmt: skip
    assert acked == {} and lagging == ["n2", "n3"] and waited <= 0.3
