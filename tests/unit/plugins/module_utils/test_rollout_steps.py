"""Every transition of the rollout's state machine (module_utils/rollout_steps.py), and the
module's action=step making a step's record changes in one write."""

import json

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout_steps as s
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.modules import rollout_state

from .test_rollout import params as rollout_params

WAVE = "canary"
WAVE_ID = "r1:canary"


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
    assert step["rollback"] == {} and not step["reset_history"]


@pytest.mark.parametrize("request_", ["resume", "promote", "promote_full"])
def test_resume_and_promote_are_recorded_and_start_a_fresh_gate_history(request_):
    step = s.on_request(request_, WAVE_ID, WAVE)
    assert step["changes"] == [
        {"action": request_, "reason": "by request (canary_action=%s)" % request_}
    ]
    assert step["reset_history"] and step["halt"] == {} and step["rollback"] == {}


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


def test_an_unknown_point_names_the_field():
    with pytest.raises(FleetError) as caught:
        s.decide("hold", {}, None)
    assert caught.value.details["field"] == "point"


# ---------------------------------------------------------------- the module's action=step


def params(path, action, **extra):
    return rollout_params(path, action, wave=WAVE, wave_id=WAVE_ID, **extra)


def holding_record(path):
    schedule = [{"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]
    rollout_state.run(params(path, "plan", rollout_id=WAVE_ID, schedule=schedule), False)
    rollout_state.run(params(path, "stage_started", stage=0), False)
    rollout_state.run(params(path, "hold_started"), False)


def test_the_module_makes_a_steps_changes_in_one_write(tmp_path, monkeypatch):
    path = tmp_path / "canary.json"
    holding_record(path)
    writes = []
    real_write = rollout_state.rollout.write_record
    monkeypatch.setattr(
        rollout_state.rollout,
        "write_record",
        lambda where, record: writes.append(record) or real_write(where, record),
    )
    result = rollout_state.run(
        params(path, "step", point="verdict", verdict=verdict("complete"), stage=0, weight=5),
        False,
    )
    assert result["changed"] and len(writes) == 1
    assert [change["action"] for change in result["step"]["changes"]] == [
        "verdict",
        "stage_completed",
    ]
    kept = json.loads(path.read_text())
    assert kept["stage"]["status"] == "completed"
    assert kept["verdicts"][-1]["decision"] == "complete"


def test_the_module_in_check_mode_decides_and_writes_nothing(tmp_path):
    path = tmp_path / "canary.json"
    holding_record(path)
    before = path.read_text()
    result = rollout_state.run(params(path, "step", point="request", request="pause"), True)
    assert result["changed"] and result["step"]["halt"]["kind"] == "paused"
    assert path.read_text() == before


def test_the_module_reads_the_wave_and_changes_nothing_when_it_carries_on(tmp_path):
    path = tmp_path / "canary.json"
    holding_record(path)
    before = path.read_text()
    result = rollout_state.run(params(path, "step", point="wave"), False)
    assert not result["changed"] and result["step"] == s.step()
    assert result["resume"]["stage"] == 0
    assert path.read_text() == before


def test_a_step_needs_a_record(tmp_path):
    with pytest.raises(FleetError) as caught:
        rollout_state.run(params(tmp_path / "none.json", "step", point="wave"), False)
    assert caught.value.details["field"] == "action"
