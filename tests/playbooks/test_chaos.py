"""Chaos on the sandbox fleet while a canary stage's weight is in place and load runs.

Each case states what it proves. The other chaos cases of the drill live beside the
playbooks they exercise (test_canary_playbooks.py): Prometheus down during a gate (the
stage holds, never rolls back), a node unreachable during a rollback (the others roll back,
the report names it, exit non-zero), a canary run killed mid-hold and resumed (only the
remaining hold is waited).
"""

from __future__ import annotations

import time

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

ENGINE_UNIT = "zerolayer-engine-chat.service"


def engine_counts(fleet):
    return {node: route_of(fleet, node)["counters"]["to_engine"] for node in fleet.nodes}


def is_active(fleet, node, unit):
    return fleet.exec(node, "systemctl", "is-active", unit, check=False).stdout.strip() == "active"


def route_of(fleet, node):
    routes = fleet.show(node)["routes"]
    return next(route for route in routes if route["name"] == fleet.route["name"])


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


def test_engine_killed_under_load_falls_back_to_the_proxy_and_reregisters(fleet, baseline, load):
    """Proves: when an engine dies, new connections its slot would have taken go to the
    proxy (fallback, no reset from the router); the restarted engine registers its new
    socket by itself (the unit's ExecStartPost), with no Ansible run; only that node's
    requests fail, and only while its engine is down."""
    victim = fleet.nodes[0]
    fleet.set_weight(50)
    client = load("engine-killed")
    try:
        time.sleep(5)
        before = route_of(fleet, victim)
        fleet.exec(victim, "systemctl", "kill", "--signal=SIGKILL", ENGINE_UNIT)
        killed_at = time.time()

        def reregistered():
            route = route_of(fleet, victim)
            return route if route["slots"] and route["slots"] != before["slots"] else None

        after = wait_for(reregistered, 60, "the restarted engine's socket in slot 0")
        back_at = time.time()
        time.sleep(5)
    finally:
        summary = client.stop()

    fallbacks = after["counters"]["fallback_no_socket"] - before["counters"]["fallback_no_socket"]
    assert fallbacks > 0, (before["counters"], after["counters"])
    assert is_active(fleet, victim, ENGINE_UNIT)
    victim_target = "%s:%d" % (fleet.address(victim), fleet.route["port"])
    for failure in summary["failure_examples"]:
        assert failure["target"] == victim_target, failure
        at = summary["started_unix"] + failure["at_s"]
        # A request may have begun just before the kill and failed with it.
        assert killed_at - 5 <= at <= back_at + 1, (failure, killed_at, back_at)
    # The direct path serves again once the engine is back.
    resumed = [
        bucket
        for bucket in summary["series"]
        if summary["started_unix"] + bucket["second"] > back_at + 1
    ]
    assert sum(bucket.get("direct", 0) for bucket in resumed) > 0, resumed
    print(
        "engine killed: %d fallbacks to the proxy, %d failed requests (all on %s), "
        "socket back after %.1f s"
        % (fallbacks, summary["requests_failed"], victim, back_at - killed_at)
    )


def test_proxy_restarted_at_full_weight_loses_no_request(fleet, baseline, load):
    """Proves: at weight 100 the direct path does not depend on the proxy: nginx restarted
    on every node under load, twice, and not one request fails."""
    fleet.set_weight(100)
    client = load("proxy-restarted")
    try:
        time.sleep(3)
        engine_before = engine_counts(fleet)
        for _round in range(2):
            for node in fleet.nodes:
                fleet.exec(node, "systemctl", "restart", "nginx.service")
            time.sleep(2)
        time.sleep(3)
        engine_after = engine_counts(fleet)
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["requests_ok"] > 100
    for node in fleet.nodes:
        assert engine_after[node] > engine_before[node], node
        assert is_active(fleet, node, "nginx.service"), node
