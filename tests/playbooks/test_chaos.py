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


def direct_requests(summary):
    return summary["paths"].get("direct", {}).get("requests", 0)


def test_engine_killed_under_load_falls_back_to_the_proxy_and_reregisters(fleet, baseline, load):
    """Proves: when an engine dies, new connections its slot would have taken go to the
    proxy (fallback, no reset from the router); the restarted engine registers its new
    socket by itself (the unit's ExecStartPost), with no Ansible run; only that node's
    requests fail, and only while its engine is down.

    One load client per side, so every request is counted where it went: the other nodes'
    client for the whole test, the victim's while its engine dies and comes back, and a
    fresh client on the victim once its new socket is registered."""
    victim, others = fleet.nodes[0], fleet.nodes[1:]
    assert others, "the chaos test needs at least two GPU nodes"
    fleet.set_weight(50)
    on_others = load("engine-killed-others", others)
    on_victim = load("engine-killed-victim", [victim])
    on_victim.wait_for(lambda s: direct_requests(s) >= 20, "direct requests on the victim")
    before = route_of(fleet, victim)
    fleet.exec(victim, "systemctl", "kill", "--signal=SIGKILL", ENGINE_UNIT)

    def reregistered():
        route = route_of(fleet, victim)
        return route if route["slots"] and route["slots"] != before["slots"] else None

    after = wait_for(reregistered, 60, "the restarted engine's socket in slot 0")
    while_down = on_victim.stop()
    # A fresh client on the victim: none of its requests may fail, and it reaches the
    # engine's new socket on the direct path.
    on_victim_again = load("engine-back-victim", [victim])
    on_victim_again.wait_for(
        lambda s: direct_requests(s) >= 20, "direct requests on the victim's new engine"
    )
    on_others.wait_for_more(20)
    back = on_victim_again.stop()
    elsewhere = on_others.stop()

    fallbacks = after["counters"]["fallback_no_socket"] - before["counters"]["fallback_no_socket"]
    assert fallbacks > 0, (before["counters"], after["counters"])
    assert is_active(fleet, victim, ENGINE_UNIT)
    assert elsewhere["requests_failed"] == 0, elsewhere["failures_by_cause"]
    assert direct_requests(elsewhere) > 0 and elsewhere["requests_ok"] > 0, elsewhere["paths"]
    assert back["requests_failed"] == 0, back["failures_by_cause"]
    assert direct_requests(back) >= 20, back["paths"]
    # While the engine was down the proxy kept serving the victim's requests.
    assert while_down["paths"].get("proxy", {}).get("requests", 0) > 0, while_down["paths"]
    print(
        "engine killed: %d fallbacks to the proxy; on %s %d requests failed while its engine "
        "was down (%s), 0 of %d after; 0 of %d on the other nodes"
        % (
            fallbacks,
            victim,
            while_down["requests_failed"],
            while_down["failures_by_cause"],
            back["requests_ok"],
            elsewhere["requests_ok"],
        )
    )


def test_proxy_restarted_at_full_weight_loses_no_request(fleet, baseline, load):
    """Proves: at weight 100 the direct path does not depend on the proxy: nginx restarted
    on every node under load, twice, and not one request fails."""
    fleet.set_weight(100)
    client = load("proxy-restarted")
    try:
        client.wait_for_more(50)
        engine_before = engine_counts(fleet)
        for _round in range(2):
            for node in fleet.nodes:
                fleet.exec(node, "systemctl", "restart", "nginx.service")
            # Requests keep flowing between and after the restarts.
            client.wait_for_more(50)
        engine_after = engine_counts(fleet)
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["requests_ok"] > 100
    for node in fleet.nodes:
        assert engine_after[node] > engine_before[node], node
        assert is_active(fleet, node, "nginx.service"), node
