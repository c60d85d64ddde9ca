"""Every transition of the rollout's state machine (module_utils/rollout/rollout_steps.py). The
canary's reconcile strings them together and writes their changes (test_canary_reconcile.py)."""

import datetime

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout_steps as s,
)

WAVE = "canary"
WAVE_ID = "r1:canary"
T0 = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)


def actions(step):
    return [change["action"] for change in step["changes"]]


def summary(outcome, paused=False, pause_reason=None):
    return {
        "outcome": outcome,
        "paused": paused,
        "pause_reason": pause_reason,
        "stage_number": 2,
        "stage_count": 4,
        "weight": 5,
    }


# ---------------------------------------------------------------- the wave as read


@pytest.mark.parametrize("outcome", ["running", "completed"])
def test_a_running_or_completed_wave_carries_on(outcome):
    assert s.at_wave(summary(outcome), WAVE_ID, WAVE) == s.step()


def test_a_paused_wave_stops_the_run_naming_why_and_how_to_go_on():
    step = s.at_wave(summary("paused", True, "gates blind"), WAVE_ID, WAVE)
    assert step["changes"] == [] and step["rollback"] == {}
    halt = step["halt"]
    assert (halt["kind"], halt["failed"], halt["wave"]) == ("paused", True, WAVE)
    assert halt["message"] == (
        "Rollout r1:canary is paused at stage 2/4 (5%): gates blind. Nothing was changed. "
        "Continue with -e canary_action=resume (or promote, promote_full, abort)."
    )


@pytest.mark.parametrize("outcome", ["rolled_back", "aborted"])
def test_a_finished_wave_stops_the_run_and_asks_for_a_new_rollout(outcome):
    halt = s.at_wave(summary(outcome), WAVE_ID, WAVE)["halt"]
    assert (halt["kind"], halt["failed"]) == (outcome, True)
    assert "is %s at stage 2/4 (5%%). Nothing was changed." % outcome in halt["message"]
    assert "another canary_rollout_id" in halt["message"]


# ---------------------------------------------------------------- a person's decision


def test_run_asks_for_nothing():
    assert s.on_request("run", WAVE_ID, WAVE) == s.step()


def test_pause_is_recorded_and_stops_the_run_without_failing_it():
    step = s.on_request("pause", WAVE_ID, WAVE)
    assert step["changes"] == [
        {"action": "pause", "reason": "paused by request (canary_action=pause)"}
    ]
    assert (step["halt"]["kind"], step["halt"]["failed"]) == ("paused", False)
    assert step["rollback"] == {}


@pytest.mark.parametrize("request_", ["resume", "promote", "promote_full"])
def test_resume_and_promote_are_recorded_and_the_run_carries_on(request_):
    step = s.on_request(request_, WAVE_ID, WAVE)
    assert step["changes"] == [
        {"action": request_, "reason": "by request (canary_action=%s)" % request_}
    ]
    assert step["halt"] == {} and step["rollback"] == {}


def test_abort_is_recorded_then_rolls_back_at_once():
    step = s.on_request("abort", WAVE_ID, WAVE)
    assert actions(step) == ["abort"]
    assert step["rollback"] == {
        "kind": "aborted",
        "reason": "aborted by request (canary_action=abort)",
    }
    # The rollback halts the run itself, with its measured report.
    assert step["halt"] == {}


def test_an_unknown_request_names_the_setting_and_the_allowed_values():
    with pytest.raises(FleetError) as caught:
        s.on_request("skip", WAVE_ID, WAVE)
    assert caught.value.details["field"] == "canary_action"
    assert "run, pause, resume, promote, promote_full, abort" in caught.value.message


# ---------------------------------------------------------------- the end of a hold


def verdict(decision, **extra):
    return {"verdict": "pass", "decision": decision, "decision_reason": "why", **extra}


def test_a_passed_hold_records_the_verdict_and_completes_the_stage_in_one_step():
    step = s.at_hold_end(verdict("complete"), WAVE_ID, WAVE, 1, 5)
    assert actions(step) == ["verdict", "stage_completed"]
    assert step["changes"][0]["verdict"]["decision"] == "complete"
    assert step["halt"] == {} and step["rollback"] == {}


def test_gates_that_cannot_decide_record_the_verdict_and_pause_failing_the_run():
    step = s.at_hold_end(verdict("pause", verdict="hold", reason="no samples"), WAVE_ID, WAVE, 1, 5)
    assert actions(step) == ["verdict", "pause"]
    assert step["changes"][1]["reason"] == "why"
    halt = step["halt"]
    assert (halt["kind"], halt["failed"]) == ("paused", True)
    assert "paused at stage 2 (5%): why (no samples)" in halt["message"]
    assert step["rollback"] == {}


def test_a_failed_gate_records_the_verdict_and_rolls_back():
    step = s.at_hold_end(
        verdict("rollback", verdict="fail", reason="p99 2.1 > 1.2"), WAVE_ID, WAVE, 2, 20
    )
    assert actions(step) == ["verdict"]
    assert step["rollback"] == {
        "kind": "rolled_back",
        "reason": "gates failed at stage 3 (20%) of wave canary: why; p99 2.1 > 1.2",
    }
    assert step["halt"] == {}


@pytest.mark.parametrize(
    ("decision", "failed", "hint"),
    [
        ("paused", False, "Continue with -e canary_action=resume."),
        ("moved", False, ""),
        ("stopped", True, ""),
        ("fenced", True, "-e canary_take_epoch=true"),
        ("owner_lost", True, "(zerolayer rollout status) before resuming"),
    ],
)
def test_a_hold_ended_by_someone_else_writes_nothing_and_says_so(decision, failed, hint):
    step = s.at_hold_end(verdict(decision), WAVE_ID, WAVE, 0, 1)
    assert step["changes"] == [] and step["rollback"] == {}
    halt = step["halt"]
    assert (halt["kind"], halt["failed"]) == (decision, failed)
    assert "stopped at stage 1 (1%) without writing anything more: why." in halt["message"]
    assert hint in halt["message"]


@pytest.mark.parametrize("decision", ["continue", None, "promote"])
def test_a_decision_that_cannot_end_a_hold_is_refused(decision):
    with pytest.raises(FleetError) as caught:
        s.at_hold_end(verdict(decision), WAVE_ID, WAVE, 0, 1)
    assert caught.value.details["field"] == "verdict"
    expected = "complete, pause, rollback, paused, stopped, fenced, moved, owner_lost"
    assert expected in caught.value.message


# ---------------------------------------------------------------- the end of a stage


@pytest.mark.parametrize(
    ("hold_s", "weight", "pause_after", "expected", "halted"),
    [
        (600, 5, 0, [], False),
        (0, 100, 0, ["stage_completed"], False),
        (600, 20, 20, ["pause"], True),
        (0, 20, 20, ["stage_completed", "pause"], True),
        (600, 5, 20, [], False),
        (600, 0.5, 0.5, ["pause"], True),
    ],
)
def test_a_stage_ends_closed_when_it_had_no_hold_and_paused_where_planned(
    hold_s, weight, pause_after, expected, halted
):
    step = s.at_stage_end(hold_s, weight, pause_after, WAVE_ID, WAVE)
    assert actions(step) == expected
    assert bool(step["halt"]) is halted
    if halted:
        assert (step["halt"]["kind"], step["halt"]["failed"]) == ("paused", False)
        assert "paused after the %g%% stage as planned" % weight in step["halt"]["message"]


# ---------------------------------------------------------------- the read-back


def started(schedule):
    """A wave's record at its first stage, started."""
    record, _c, _n = rollout.plan(None, WAVE_ID, schedule, None, False, T0, "ci")
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, T0, "ci")
    return record


def read(name="chat", weight=5, generation=3, always_direct=None):
    """One route as route_info returns it."""
    return {
        "name": name,
        "weight": weight,
        "weight_bp": round(weight * 100),
        "generation": generation,
        "always_direct": always_direct or [],
    }


AT_5 = [{"weight": 5, "hold": 60}, {"weight": 100}]
COHORT = ["192.0.2.0/28"]
WITH_COHORT = [{"cohort": COHORT, "hold": 60}, {"weight": 100}]


def test_every_node_at_the_weight_is_recorded_by_its_first_route_and_the_run_carries_on():
    reads = {"n1": [read(), read("embed", generation=9)], "n2": [read(generation=4)]}
    step = s.at_confirmed(started(AT_5), reads, ["chat"], WAVE)
    assert step["changes"] == [
        {
            "action": "weight_confirmed",
            "nodes": {"n1": {"generation": 3, "weight": 5}, "n2": {"generation": 4, "weight": 5}},
        }
    ]
    assert step["halt"] == {} and step["rollback"] == {}


@pytest.mark.parametrize(
    "n2_read, why",
    [
        ([read(weight=1)], "another weight"),
        ([], "no route"),
        ([read()], "one of two routes"),
    ],
)
def test_a_node_that_missed_the_weight_is_recorded_and_stops_the_run_before_the_hold(n2_read, why):
    routes = ["chat", "embed"] if why == "one of two routes" else ["chat"]
    n1_read = [read(), read("embed")] if len(routes) == 2 else [read()]
    step = s.at_confirmed(started(AT_5), {"n1": n1_read, "n2": n2_read}, routes, WAVE)
    confirmed = step["changes"][0]["nodes"]
    assert ("n2" in confirmed) is bool(n2_read), why
    halt = step["halt"]
    assert (halt["kind"], halt["failed"], halt["wave"]) == ("lagging", True, WAVE)
    assert halt["message"].startswith(
        "Nodes lagging at stage 1 of wave canary: every route must read back 5%; read back: n2 "
    )
    assert "n1" not in halt["message"].split("read back:")[1], "n1 took the weight"
    assert halt["message"].endswith(
        "The stage did not start its hold; re-run to try again, or roll back."
    )


def test_a_cohort_stage_needs_its_cohort_on_every_route():
    reads = {"n1": [read(weight=0, always_direct=COHORT)], "n2": [read(weight=0)]}
    halt = s.at_confirmed(started(WITH_COHORT), reads, ["chat"], WAVE)["halt"]
    assert (
        "must read back 0% with always_direct 192.0.2.0/28; read back: n2 {'chat': 0}"
        in (halt["message"])
    )


def test_a_node_confirmed_earlier_and_left_out_of_this_run_stops_it():
    """--limit, or a node gone from the wave: its confirmation is an earlier stage's."""
    record = started(AT_5)
    record, _c = rollout.apply(
        record, "weight_confirmed", {"nodes": {"n3": {"generation": 1, "weight": 1}}}, T0, "ci"
    )
    record["nodes"]["n3"]["stage"] = -1
    halt = s.at_confirmed(record, {"n1": [read()]}, ["chat"], WAVE)["halt"]
    assert halt["kind"] == "lagging" and "read back: n3 not read by this run." in halt["message"]
