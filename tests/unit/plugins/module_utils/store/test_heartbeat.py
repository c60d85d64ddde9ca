"""The runner's heartbeat: which answers of the store end it, and which it rides out.

A fake store client and a fake clock: each renewal returns (or raises) the next of a
scripted list of answers, and sleeping advances the clock."""

import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import heartbeat
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable

LEASE = 7
TTL_S = 30.0
TIMED_OUT = FleetError(
    "the rollout store refused /v3/lease/keepalive: etcdserver: request timed out"
)
LEADER_CHANGED = FleetError(
    "the rollout store refused /v3/lease/keepalive: etcdserver: leader changed"
)
UNREACHABLE = StoreUnavailable("the rollout store did not answer /v3/lease/keepalive: refused")
NOT_FOUND = FleetError("the rollout store refused /v3/lease/keepalive: requested lease not found")


class ScriptedStore:
    """Answers each keep_alive with the next scripted answer: a TTL, or an error raised."""

    def __init__(self, answers):
        self.answers = list(answers)
        self.renewals = 0

    def keep_alive(self, lease):
        assert lease == LEASE
        self.renewals += 1
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Clock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def run(answers, runner=None):
    store, clock = ScriptedStore(answers), Clock()
    runner = runner or (os.getpid(), heartbeat._stat(os.getpid())[1])
    why = heartbeat.beat(store, LEASE, runner, TTL_S, sleep=clock.sleep, clock=clock)
    return why, store, clock


def test_a_lease_the_store_no_longer_has_ends_the_heartbeat_at_once():
    why, store, _clock = run([30, 30, 0])
    assert why == "lease 7 released or expired" and store.renewals == 3


def test_a_lease_the_store_says_it_does_not_know_ends_the_heartbeat_at_once():
    why, store, _clock = run([30, NOT_FOUND])
    assert "requested lease not found" in why and store.renewals == 2


def test_renewals_come_every_third_of_the_ttl():
    _why, _store, clock = run([30, 30, 30, 0])
    assert clock.sleeps == [TTL_S / 3] * 3


@pytest.mark.parametrize("error", [TIMED_OUT, LEADER_CHANGED, UNREACHABLE], ids=str)
def test_a_store_busy_for_less_than_the_ttl_costs_no_lease(error):
    # Ten seconds of errors (a leader election, an fsync stall), then the store answers: the
    # heartbeat retried every second and goes on renewing; it ends only when the lease does.
    why, store, clock = run([30] + [error] * 10 + [30, 30, 0])
    assert why == "lease 7 released or expired"
    assert clock.sleeps[1:11] == [heartbeat.RETRY_S] * 10
    assert store.renewals == 14


def test_a_store_that_fails_for_the_whole_ttl_ends_the_heartbeat_naming_its_error():
    why, store, clock = run([30] + [TIMED_OUT] * 100)
    assert why.startswith("lease 7 not renewed for 30.0s") and "request timed out" in why
    # Renewed at 0, failing from TTL_S / 3 on: it tried every second until the lease's TTL
    # had passed since that renewal, and not longer.
    assert TTL_S <= clock.now < TTL_S + heartbeat.RETRY_S
    assert store.renewals == 2 + int((TTL_S - TTL_S / 3) / heartbeat.RETRY_S)


def test_a_runner_that_ended_ends_the_heartbeat_without_renewing():
    gone = (os.getpid(), heartbeat._stat(os.getpid())[1] + 1)  # another start time: not it
    why, store, _clock = run([30], runner=gone)
    assert why == "runner %d ended" % os.getpid() and store.renewals == 0
