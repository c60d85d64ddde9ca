"""The canary's measured split (rollout_steps.at_measured, the step the canary takes once
traffic flowed) over routes that hash by client (each client address at the weight is one
draw, not each connection) and over routes with cohorts (their connections do not follow the
weight; a cohort stage is confirmed by them), on route_info results made up for each case;
and the step that the split implies: recorded, and a stop before the hold when it is off.
"""

import datetime

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout_steps as s,
)

T0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
SPLIT = {"min_connections": 200, "sigmas": 4, "floor_pct": 0.5, "wait_s": 60}


def route(name, lookups, to_engine, clients=None, opt_in=0, opt_out=0, weight=50):
    """A route as route_info returns it, with the counters the split reads."""
    entry = {
        "name": name,
        "weight": weight,
        "weight_bp": weight * 100,
        "generation": 2,
        "hash": "client" if clients is not None else "connection",
        "counters": {
            "lookups": lookups,
            "to_engine": to_engine,
            "to_engine_opt_in": opt_in,
            "to_proxy_opt_out": opt_out,
        },
        "always_direct": COHORT if weight == 0 else [],
    }
    if clients is not None:
        entry["clients"] = dict(zip(("to_engine", "to_proxy"), clients))
    return entry


COHORT = ["192.0.2.0/28"]
# Cases at a cohort stage (weight 0, the cohort above); the others are at 50 %.
COHORT_CASES = ("cohort", "cohort_too_little", "cohort_weight_ignored", "cohort_by_client")


# name: (routes read back when the weight took, routes read after traffic came)
CASES = {
    # Connection-hash routes as before: 1000 new connections, 500 to the engine.
    "by_connection": ([route("chat", 100, 40)], [route("chat", 1100, 540)]),
    # 24 clients of 10 connections each at 50 %: 12 addresses to the engine. Judged as 24
    # draws; the 240 connections only say that traffic came.
    "by_client": ([route("chat", 0, 0, (0, 0))], [route("chat", 240, 120, (12, 12))]),
    # Every address on the proxy at 50 %: off, whatever the connections say.
    "by_client_off": ([route("chat", 0, 0, (0, 0))], [route("chat", 240, 0, (0, 24))]),
    # Few connections: not confirmed, however well the addresses split.
    "by_client_too_little": ([route("chat", 0, 0, (0, 0))], [route("chat", 60, 30, (3, 3))]),
    # One route of each kind: 400 connection draws and 40 address draws add up.
    "mixed": (
        [route("chat", 50, 25), route("embed", 10, 5, (1, 1))],
        [route("chat", 450, 225), route("embed", 410, 205, (20, 20))],
    ),
    # A tenant on never_direct (300 connections, all to the proxy) and the opt-in cohort (200,
    # all to the engine) beside 1000 connections the weight split: judged on those 1000.
    "cohorts_left_out": (
        [route("chat", 0, 0)],
        [route("chat", 1500, 700, opt_in=200, opt_out=300)],
    ),
    # A cohort stage: 250 of the cohort's connections took the engine, the other 50 the proxy.
    "cohort": (
        [route("chat", 10, 0, weight=0)],
        [route("chat", 310, 250, opt_in=250, weight=0)],
    ),
    # Too few of the cohort's connections came, however many others did.
    "cohort_too_little": (
        [route("chat", 0, 0, weight=0)],
        [route("chat", 1000, 20, opt_in=20, weight=0)],
    ),
    # A connection outside the cohort went direct at weight 0: the router ignores the weight.
    "cohort_weight_ignored": (
        [route("chat", 0, 0, weight=0)],
        [route("chat", 400, 301, opt_in=300, weight=0)],
    ),
    # A route hashing by client at a cohort stage: the weight's addresses all on the proxy.
    "cohort_by_client": (
        [route("chat", 0, 0, (0, 0), weight=0)],
        [route("chat", 400, 250, (0, 7), opt_in=250, weight=0)],
    ),
}


def staged(cohort_stage):
    """A wave's record at its first stage, started: the cohort stage, or 50 %."""
    first = {"cohort": COHORT, "hold": 60} if cohort_stage else {"weight": 50, "hold": 60}
    schedule = [first, {"weight": 100}]
    record, _c, _n = rollout.plan(None, "r1:canary", schedule, None, False, T0, "ci")
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, T0, "ci")
    return record


def measured(case):
    read_back, after = CASES[case]
    names = [r["name"] for r in read_back]
    return s.at_measured(
        staged(case in COHORT_CASES), {"n1": read_back}, {"n1": after}, names, SPLIT, "canary"
    )


@pytest.fixture(scope="module")
def splits():
    """{case: the node's measured split}, as the step records it."""
    return {case: measured(case)["changes"][0]["splits"]["n1"] for case in CASES}


def test_connection_hash_routes_are_judged_by_their_connections_as_before(splits):
    split = splits["by_connection"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (1000, 0, 500)
    assert split["measured_pct"] == 50.0


def test_client_hash_routes_are_judged_by_their_addresses(splits):
    split = splits["by_client"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (240, 24, 12)
    assert split["measured_pct"] == 50.0
    # The binomial over 24 draws is wide; over 240 it would be far narrower.
    assert split["low_pct"] < 25 and split["high_pct"] > 75, split


def test_addresses_that_all_took_one_path_are_off(splits):
    split = splits["by_client_off"]
    assert split["ok"] is False and split["measured_pct"] == 0.0, split


def test_client_hash_routes_still_need_the_minimum_of_connections(splits):
    split = splits["by_client_too_little"]
    assert split["ok"] is False and split["connections"] == 60, split


def test_routes_of_both_kinds_add_their_draws(splits):
    split = splits["mixed"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (800, 40, 220)


def test_cohort_connections_are_left_out_of_the_weight_split(splits):
    split = splits["cohorts_left_out"]
    assert split["ok"] is True, split
    assert (split["connections"], split["to_engine"]) == (1000, 500), split
    assert (split["opt_in"], split["opt_out"]) == (200, 300), split
    assert split["measured_pct"] == 50.0


def test_a_cohort_stage_is_confirmed_by_the_cohort_s_own_connections(splits):
    split = splits["cohort"]
    assert split["ok"] is True, split
    assert split["cohort"] is True
    assert (split["opt_in"], split["to_engine"], split["sample"]) == (250, 0, 250), split


def test_a_cohort_stage_with_too_few_cohort_connections_is_not_confirmed(splits):
    split = splits["cohort_too_little"]
    assert split["ok"] is False, split
    assert "20 connections of the cohort reached an engine (at least 200 wanted)" in split["detail"]


def test_a_connection_sent_direct_by_weight_0_fails_the_cohort_stage(splits):
    split = splits["cohort_weight_ignored"]
    assert split["ok"] is False, split
    assert split["to_engine"] == 1 and split["opt_in"] == 300, split


def test_a_client_hash_route_at_a_cohort_stage_counts_its_addresses_on_the_proxy(splits):
    split = splits["cohort_by_client"]
    assert split["ok"] is True, split
    assert (split["addresses"], split["to_engine"], split["opt_in"]) == (7, 0, 250), split


def test_a_split_within_range_is_recorded_and_the_run_carries_on():
    step = measured("by_connection")
    assert [change["action"] for change in step["changes"]] == ["split_measured"]
    assert step["halt"] == {} and step["rollback"] == {}


def test_a_split_off_is_recorded_then_stops_the_run_before_the_hold_naming_the_node():
    step = measured("by_client_off")
    assert [change["action"] for change in step["changes"]] == ["split_measured"]
    halt = step["halt"]
    assert (halt["kind"], halt["failed"], halt["wave"]) == ("split_off", True, "canary")
    assert halt["message"].startswith(
        "Measured split not confirmed at stage 1 of wave canary (weight 50%, within 60 s): n1: "
    )
    assert halt["message"].endswith(
        "The hold did not start; re-run to measure again, or roll back."
    )


def test_a_cohort_stage_off_names_its_cohort():
    halt = measured("cohort_too_little")["halt"]
    assert "(weight 0%, cohort 192.0.2.0/28, within 60 s)" in halt["message"], halt


def test_the_split_settings_are_named_when_one_is_missing():
    with pytest.raises(FleetError) as missing:
        s.at_measured(staged(False), {}, {}, ["chat"], {"sigmas": 4}, "canary")
    assert missing.value.details == {"field": "split"}
    assert "missing min_connections, floor_pct, wait_s" in missing.value.message
