"""The rollout record: schedule validation, resume arithmetic, transitions, atomic writes."""

import datetime
import json

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_duration,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import record_change
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

T0 = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
ME = "sre@controller"
SHORT = [{"weight": 1, "hold": "10m"}, {"weight": 50, "hold": 600}, {"weight": 100}]


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def planned(schedule=None):
    record, changed, note = r.plan(None, "chat-1", schedule or SHORT, None, False, at(0), ME)
    assert (changed, note) == (True, "created")
    return record


def step(record, action, seconds, **params):
    return r.apply(record, action, params, at(seconds), ME)


def holding(seconds=100):
    record = planned()
    record, _changed = step(record, "stage_started", 10, stage=0)
    record, _changed = step(record, "hold_started", seconds)
    return record


# ---------------------------------------------------------------- durations and schedule


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0),
        (7200, 7200),
        (90.0, 90),
        ("2h", 7200),
        ("30m", 1800),
        ("90s", 90),
        ("90", 90),
        ("1h30m", 5400),
        ("1d", 86400),
        (" 5m ", 300),
    ],
)
def test_durations(value, seconds):
    assert parse_duration(value, "hold") == seconds


@pytest.mark.parametrize("value", [-1, "-5m", "2x", "", "h", "1.5h", True, None, 1.5, [60]])
def test_bad_durations_name_the_field_and_forms(value):
    with pytest.raises(FleetError) as caught:
        parse_duration(value, "schedule[0].hold")
    assert caught.value.details["field"] == "schedule[0].hold"
    assert "2h, 30m, 90s" in caught.value.message


def test_default_schedule_is_1_5_20_100_with_2h_4h_8h():
    schedule = r.validate_schedule(r.DEFAULT_SCHEDULE)
    assert [(s["weight"], s["hold_s"]) for s in schedule] == [
        (1, 7200),
        (5, 14400),
        (20, 28800),
        (100, 0),
    ]


def test_fractional_weights_keep_two_decimals():
    schedule = r.validate_schedule([{"weight": "0.25"}, {"weight": 12.5}, {"weight": 100}])
    assert [s["weight_bp"] for s in schedule] == [25, 1250, 10000]


@pytest.mark.parametrize(
    ("schedule", "field", "allowed"),
    [
        ("1,5,100", "schedule", "non-empty list"),
        ([], "schedule", "non-empty list"),
        ([5, {"weight": 100}], "schedule[0]", "weight and hold"),
        ([{"weight": 100, "pause": True}], "schedule[0]", "allowed keys: weight, hold"),
        ([{"hold": "1h"}, {"weight": 100}], "schedule[0].weight", "percentage"),
        ([{"weight": 0}, {"weight": 100}], "schedule[0].weight", "above 0"),
        ([{"weight": -1}, {"weight": 100}], "schedule[0].weight", "0 to 100"),
        ([{"weight": 120}], "schedule[0].weight", "0 to 100"),
        ([{"weight": 1.234}, {"weight": 100}], "schedule[0].weight", "two decimals"),
        ([{"weight": "five"}, {"weight": 100}], "schedule[0].weight", "0 to 100"),
        ([{"weight": True}, {"weight": 100}], "schedule[0].weight", "0 to 100"),
        (
            [{"weight": 5}, {"weight": 5}, {"weight": 100}],
            "schedule[1].weight",
            "strictly increase",
        ),
        (
            [{"weight": 20}, {"weight": 5}, {"weight": 100}],
            "schedule[1].weight",
            "strictly increase",
        ),
        ([{"weight": 1}, {"weight": 50}], "schedule[1].weight", "must be 100"),
        ([{"weight": 1, "hold": "2 hours"}, {"weight": 100}], "schedule[0].hold", "2h, 30m"),
        ([{"weight": 1, "hold": -60}, {"weight": 100}], "schedule[0].hold", "whole seconds >= 0"),
    ],
)
def test_bad_schedules_name_the_field_and_allowed_values(schedule, field, allowed):
    with pytest.raises(FleetError) as caught:
        r.validate_schedule(schedule)
    assert caught.value.details["field"] == field
    assert field in caught.value.message
    assert allowed in caught.value.message


def test_plan_validates_gates_before_anything():
    with pytest.raises(FleetError) as caught:
        r.plan(
            None,
            "chat-1",
            SHORT,
            [{"name": "a", "query": "q", "comparison": "=", "threshold": 1}],
            False,
            at(0),
            ME,
        )
    assert caught.value.details["field"] == "gates[0].comparison"


@pytest.mark.parametrize("rollout_id", ["", "has space", "-lead", "x" * 129, 7])
def test_bad_rollout_ids(rollout_id):
    with pytest.raises(FleetError) as caught:
        r.plan(None, rollout_id, SHORT, None, False, at(0), ME)
    assert caught.value.details["field"] == "rollout_id"


# ---------------------------------------------------------------- plan and resume


def test_new_record_records_who_and_when():
    record = planned()
    assert record["outcome"] == "running"
    assert record["stage"] == {
        "index": 0,
        "status": "pending",
        "started_at": None,
        "hold_started_at": None,
        "hold_extension_s": 0,
        "completed_at": None,
    }
    assert record["transitions"] == [
        {"action": "plan", "at": "2025-03-01T12:00:00Z", "by": ME, "stage": 0, "outcome": "running"}
    ]


def test_interrupted_hold_resumes_with_the_remaining_hold():
    record = holding(seconds=100)
    again, changed, note = r.plan(record, "chat-1", SHORT, None, False, at(400), ME)
    assert (changed, note) == (False, "resumed")
    point = r.resume_point(again, at(400))
    assert (point["stage"], point["stage_status"], point["weight"]) == (0, "holding", 1)
    assert point["hold_remaining_s"] == 600 - 300
    assert r.resume_point(again, at(5000))["hold_remaining_s"] == 0


def test_recorded_hold_extension_is_part_of_the_remaining_hold():
    record = holding(seconds=100)
    record, _changed = step(
        record, "verdict", 200, verdict={"verdict": "hold", "hold_extension_s": 120}
    )
    assert r.resume_point(record, at(400))["hold_remaining_s"] == 600 + 120 - 300


def test_a_completed_stage_resumes_at_the_next_with_its_full_hold():
    record = holding()
    record, _changed = step(record, "stage_completed", 800)
    point = r.resume_point(record, at(900))
    assert (point["stage"], point["stage_status"], point["hold_remaining_s"]) == (1, "pending", 600)


def test_a_completed_rollout_is_returned_unchanged():
    record = finished_rollout()
    again, changed, note = r.plan(record, "chat-1", SHORT, None, False, at(9999), ME)
    assert (again, changed, note) == (record, False, "completed")
    assert r.resume_point(record, at(9999)) is None


def test_a_different_schedule_for_a_rollout_in_progress_is_refused():
    record = holding()
    with pytest.raises(FleetError) as caught:
        r.plan(record, "chat-1", r.DEFAULT_SCHEDULE, None, False, at(500), ME)
    assert caught.value.details["field"] == "schedule"
    assert "restart: true" in caught.value.message


def test_restart_replaces_the_record_and_remembers_the_previous_one():
    record = holding()
    fresh, changed, note = r.plan(record, "chat-1", r.DEFAULT_SCHEDULE, None, True, at(500), ME)
    assert (changed, note) == (True, "restarted")
    assert fresh["stage"]["status"] == "pending"
    assert fresh["previous"] == {
        "rollout_id": "chat-1",
        "outcome": "running",
        "stage": 0,
        "updated_at": "2025-03-01T12:01:40Z",
    }


def test_another_rollout_while_one_runs_is_refused():
    with pytest.raises(FleetError) as caught:
        r.plan(holding(), "chat-2", SHORT, None, False, at(500), ME)
    assert caught.value.details["field"] == "rollout_id"
    assert "chat-1 is running" in caught.value.message


def test_another_rollout_after_one_finished_starts_fresh():
    record, changed, note = r.plan(finished_rollout(), "chat-2", SHORT, None, False, at(9999), ME)
    assert (changed, note, record["rollout_id"]) == (True, "created", "chat-2")
    assert record["previous"]["outcome"] == "completed"


def test_changed_gates_are_recorded_on_resume():
    gates = [{"name": "a", "query": "q", "comparison": "<", "threshold": 1}]
    record = holding()
    again, changed, _note = r.plan(record, "chat-1", SHORT, gates, False, at(500), ME)
    assert changed is True
    assert again["transitions"][-1]["action"] == "gates_changed"
    _record, changed, _note = r.plan(again, "chat-1", SHORT, gates, False, at(600), ME)
    assert changed is False


# ---------------------------------------------------------------- transitions


def finished_rollout():
    record = planned()
    for index, seconds in ((0, 0), (1, 1000), (2, 2000)):
        record, _changed = step(record, "stage_started", seconds + 1, stage=index)
        record, _changed = step(record, "hold_started", seconds + 2)
        record, _changed = step(record, "stage_completed", seconds + 900)
    record, changed = step(record, "completed", 3000)
    assert changed is True
    return record


def test_a_full_rollout_walks_every_stage():
    record = finished_rollout()
    assert record["outcome"] == "completed"
    assert [s["weight"] for s in record["completed_stages"]] == [1, 50, 100]
    assert all(t["by"] == ME and t["at"].endswith("Z") for t in record["transitions"])


def test_stage_started_is_idempotent_and_refuses_to_skip():
    record = planned()
    started, changed = step(record, "stage_started", 1, stage=0)
    assert changed is True
    again, changed = step(started, "stage_started", 2, stage=0)
    assert (again, changed) == (started, False)
    with pytest.raises(FleetError) as caught:
        step(started, "stage_started", 3, stage=1)
    assert "promote" in caught.value.message
    with pytest.raises(FleetError) as caught:
        step(started, "stage_started", 3, stage=7)
    assert caught.value.details["field"] == "stage"
    assert "from 0 to 2" in caught.value.message


def test_hold_start_is_kept_so_a_resume_holds_only_the_remainder():
    record = holding(seconds=100)
    again, changed = step(record, "hold_started", 500)
    assert changed is False
    assert again["stage"]["hold_started_at"] == "2025-03-01T12:01:40Z"


def test_hold_needs_a_started_stage():
    with pytest.raises(FleetError) as caught:
        step(planned(), "hold_started", 1)
    assert "stage_started" in caught.value.message


def test_weight_confirmations_name_the_lagging_nodes():
    record = holding()
    record, changed = step(
        record,
        "weight_confirmed",
        50,
        nodes={"n1": {"generation": 3, "weight": 1}, "n2": {"generation": 2, "weight": 0}},
    )
    assert changed is True
    assert r.lagging_nodes(record) == ["n2"]
    assert record["nodes"]["n1"] == {
        "generation": 3,
        "weight": 1,
        "weight_bp": 100,
        "stage": 0,
        "confirmed_at": "2025-03-01T12:00:50Z",
        "confirmed_by": ME,
    }
    again, changed = step(
        record, "weight_confirmed", 60, nodes={"n1": {"generation": 3, "weight": 1}}
    )
    assert (again, changed) == (record, False)


@pytest.mark.parametrize(
    ("nodes", "field"),
    [
        ({}, "nodes"),
        ({"n1": 5}, "nodes[n1]"),
        ({"n1": {"generation": -1, "weight": 1}}, "nodes[n1].generation"),
        ({"n1": {"generation": 1, "weight": 101}}, "nodes[n1].weight"),
    ],
)
def test_bad_confirmations_name_the_field(nodes, field):
    with pytest.raises(FleetError) as caught:
        step(holding(), "weight_confirmed", 1, nodes=nodes)
    assert caught.value.details["field"] == field


def test_verdicts_append_a_compact_entry():
    gate_result = {
        "verdict": "fail",
        "decision": "continue",
        "reason": "p99 failed",
        "hold_extension_s": 0,
        "changed": True,
        "gates": [{"name": "p99", "verdict": "fail", "value": 9}],
    }
    record, changed = step(holding(), "verdict", 300, verdict=gate_result)
    assert changed is True
    assert record["verdicts"][-1] == {
        "at": "2025-03-01T12:05:00Z",
        "by": ME,
        "stage": 0,
        "verdict": "fail",
        "decision": "continue",
        "reason": "p99 failed",
        "gates": {"p99": "fail"},
    }
    assert r.summary(record, at(300))["last_verdict"] == "fail"


def test_a_verdict_must_be_pass_fail_or_hold():
    with pytest.raises(FleetError) as caught:
        step(holding(), "verdict", 1, verdict={"verdict": "maybe"})
    assert caught.value.details["field"] == "verdict"
    assert "pass, fail, hold" in caught.value.message


def test_pause_and_resume_are_idempotent():
    record, changed = step(holding(), "pause", 200, reason="telemetry missing")
    assert (changed, record["outcome"], record["paused"]) == (True, "paused", True)
    assert step(record, "pause", 201)[1] is False
    resumed, changed = step(record, "resume", 300, reason="exporter fixed")
    assert (changed, resumed["outcome"], resumed["paused"]) == (True, "running", False)
    assert step(resumed, "resume", 301)[1] is False


def test_promote_ends_the_hold_now_and_clears_a_pause():
    record, _changed = step(holding(), "pause", 200)
    record, changed = step(record, "promote", 250, reason="looks fine")
    assert changed is True
    assert (record["stage"]["status"], record["paused"]) == ("completed", False)
    assert record["completed_stages"][-1]["how"] == "promote"
    assert r.resume_point(record, at(260))["stage"] == 1


def test_promote_full_jumps_to_the_last_stage():
    record, changed = step(holding(), "promote_full", 250)
    assert changed is True
    assert (record["stage"]["index"], record["stage"]["status"]) == (2, "pending")
    assert r.summary(record, at(250))["weight"] == 100
    assert step(record, "promote_full", 260)[1] is False


def test_rolled_back_records_the_measured_facts_and_is_final():
    record, changed = step(
        holding(), "rolled_back", 300, reason="p99 failed 3 times", details={"wall_time_s": 21.7}
    )
    assert changed is True
    assert record["outcome"] == "rolled_back"
    assert record["rollback"]["details"] == {"wall_time_s": 21.7}
    assert step(record, "rolled_back", 301)[1] is False
    for action in ("verdict", "stage_completed", "pause", "promote"):
        with pytest.raises(FleetError) as caught:
            step(record, action, 302, verdict={"verdict": "pass"})
        assert "rolled_back" in caught.value.message


def test_abort_then_rollback_keeps_the_abort_as_outcome():
    record, _changed = step(holding(), "abort", 300, reason="by hand")
    record, changed = step(record, "rolled_back", 320, details={"wall_time_s": 12})
    assert changed is True
    assert record["outcome"] == "aborted"
    assert record["rollback"]["details"] == {"wall_time_s": 12}
    assert step(record, "rolled_back", 330)[1] is False


def test_completed_needs_the_last_stage():
    with pytest.raises(FleetError) as caught:
        step(holding(), "completed", 300)
    assert "last stage" in caught.value.message


def test_rollout_id_must_match_the_record():
    with pytest.raises(FleetError) as caught:
        step(holding(), "pause", 1, rollout_id="chat-9")
    assert caught.value.details["field"] == "rollout_id"


def test_actions_need_a_record():
    with pytest.raises(FleetError) as caught:
        r.apply(None, "pause", {}, at(0), ME)
    assert "action=plan" in caught.value.message


# ---------------------------------------------------------------- the module's core


def params(path, action, **extra):
    values = {
        key: None
        for key in (
            "rollout_id",
            "schedule",
            "gates",
            "stage",
            "nodes",
            "verdict",
            "reason",
            "details",
            "record",
        )
    }
    values.update(
        {
            "path": str(path),
            "action": action,
            "restart": False,
            "actor": ME,
        }
    )
    values.update(extra)
    return values


def test_module_plan_writes_once_and_a_rerun_changes_nothing(tmp_path):
    path = tmp_path / "chat.json"
    first = record_change.run(params(path, "plan", rollout_id="chat-1"), check_mode=False)
    assert first["changed"] is True
    assert first["resume"]["hold_remaining_s"] == 7200
    written = path.read_bytes()
    second = record_change.run(params(path, "plan", rollout_id="chat-1"), check_mode=False)
    assert second["changed"] is False
    assert path.read_bytes() == written


def test_module_check_mode_writes_nothing(tmp_path):
    path = tmp_path / "chat.json"
    result = record_change.run(params(path, "plan", rollout_id="chat-1"), check_mode=True)
    assert result["changed"] is True
    assert not path.exists()


def test_module_bad_input_changes_nothing(tmp_path):
    path = tmp_path / "chat.json"
    record_change.run(params(path, "plan", rollout_id="chat-1"), check_mode=False)
    written = path.read_bytes()
    bad = [{"weight": 5}, {"weight": 1}, {"weight": 100}]
    with pytest.raises(FleetError):
        record_change.run(
            params(path, "plan", rollout_id="chat-1", schedule=bad, restart=True), check_mode=False
        )
    assert path.read_bytes() == written


def test_module_sync_writes_the_same_codec_and_converges(tmp_path):
    controller = tmp_path / "controller.json"
    node = tmp_path / "node" / "rollout.json"
    plan = record_change.run(params(controller, "plan", rollout_id="chat-1"), check_mode=False)
    first = record_change.run(params(node, "sync", record=plan["record"]), check_mode=False)
    second = record_change.run(params(node, "sync", record=plan["record"]), check_mode=False)
    assert (first["changed"], second["changed"]) == (True, False)
    assert node.read_bytes() == controller.read_bytes()


# ---------------------------------------------------------------- the fence epoch


def test_a_new_record_keeps_the_fence_epoch_it_was_planned_under():
    record, changed, _note = r.plan(None, "chat-1", SHORT, None, False, at(0), ME, epoch=3)
    assert changed and record["fence_epoch"] == 3
    again, changed, note = r.plan(record, "chat-1", SHORT, None, False, at(5), ME, epoch=3)
    assert (again, changed, note) == (record, False, "resumed")


def test_resuming_under_a_higher_fence_is_refused_and_changes_nothing():
    record, _changed, _note = r.plan(None, "chat-1", SHORT, None, False, at(0), ME, epoch=3)
    kept = json.dumps(record, sort_keys=True)
    with pytest.raises(FleetError) as refused:
        r.plan(record, "chat-1", SHORT, None, False, at(9), ME, epoch=4)
    assert refused.value.details == {"field": "epoch", "epoch": 3, "fence_epoch": 4}
    assert "took fence epoch 3" in refused.value.message and "now 4" in refused.value.message
    assert json.dumps(record, sort_keys=True) == kept


def test_take_epoch_resumes_a_fenced_rollout_on_purpose():
    record, _changed, _note = r.plan(None, "chat-1", SHORT, None, False, at(0), ME, epoch=3)
    taken, changed, note = r.plan(record, "chat-1", SHORT, None, False, at(9), ME, epoch=4,
                                  take_epoch=True)  # fmt: skip
    assert (changed, note, taken["fence_epoch"]) == (True, "resumed", 4)
    last = taken["transitions"][-1]
    assert (last["action"], last["epoch"], last["previous_epoch"]) == ("epoch_taken", 4, 3)


def test_a_record_from_before_the_store_adopts_the_epoch():
    record = planned()
    assert record["fence_epoch"] is None
    adopted, changed, _note = r.plan(record, "chat-1", SHORT, None, False, at(9), ME, epoch=2)
    assert changed and adopted["fence_epoch"] == 2


def test_a_restart_takes_the_new_epoch():
    record, _changed, _note = r.plan(None, "chat-1", SHORT, None, False, at(0), ME, epoch=3)
    fresh, _changed, note = r.plan(record, "chat-1", SHORT, None, True, at(9), ME, epoch=4)
    assert (note, fresh["fence_epoch"]) == ("restarted", 4)


@pytest.mark.parametrize("bad", [-1, True, "4"])
def test_a_bad_epoch_names_the_field(bad):
    with pytest.raises(FleetError) as failed:
        r.plan(None, "chat-1", SHORT, None, False, at(0), ME, epoch=bad)
    assert failed.value.details["field"] == "epoch"


def test_a_paused_rollout_cannot_start_its_next_stage():
    record = holding()
    record, _changed = step(record, "stage_completed", 800)
    record, _changed = step(record, "pause", 801, reason="paused from another shell")
    with pytest.raises(FleetError) as refused:
        step(record, "stage_started", 802, stage=1)
    assert refused.value.details["field"] == "action"
    assert "paused from another shell" in refused.value.message


# ---------------------------------------------------------------- progress deadline


def test_the_progress_deadline_auto_is_the_longest_hold_plus_three_intervals():
    schedule = r.validate_schedule(SHORT)
    assert r.progress_deadline(schedule, "auto", 60) == {"deadline_s": 780, "abort": False}
    assert r.progress_deadline(schedule, None, 5, True) == {"deadline_s": 615, "abort": True}
    assert r.progress_deadline(schedule, "90m", 60)["deadline_s"] == 5400
    assert r.progress_deadline(schedule, 45, 60)["deadline_s"] == 45


@pytest.mark.parametrize("value", [0, "0s", -5, "soon", True, [], "2x"])
def test_a_deadline_of_zero_or_less_or_not_a_duration_is_refused(value):
    with pytest.raises(FleetError) as error:
        r.progress_deadline(r.validate_schedule(SHORT), value, 60)
    assert error.value.details["field"] == "canary_progress_deadline"
    assert "auto" in error.value.message and "above 0" in error.value.message


@pytest.mark.parametrize(
    "interval, abort, field",
    [(0, False, "canary_gate_interval"), ("60", False, "canary_gate_interval"),
     (60, "yes", "canary_progress_deadline_abort")],
)  # fmt: skip
def test_the_deadline_refuses_a_bad_interval_or_abort(interval, abort, field):
    with pytest.raises(FleetError) as error:
        r.progress_deadline(r.validate_schedule(SHORT), "auto", interval, abort)
    assert error.value.details["field"] == field


def test_plan_keeps_the_deadline_and_a_resume_takes_a_changed_one_without_a_transition():
    progress = {"deadline_s": 780, "abort": False}
    record, _changed, _note = r.plan(
        None, "chat-1", SHORT, None, False, at(0), ME, progress=progress
    )
    assert record["progress_deadline"] == progress
    _again, changed, note = r.plan(
        record, "chat-1", SHORT, None, False, at(5), ME, progress=progress
    )
    assert (changed, note) == (False, "resumed")
    longer = {"deadline_s": 3600, "abort": True}
    resumed, changed, _note = r.plan(
        record, "chat-1", SHORT, None, False, at(9), ME, progress=longer
    )
    assert changed and resumed["progress_deadline"] == longer
    assert resumed["transitions"] == record["transitions"], "a setting, not progress"
    assert resumed["updated_at"] == record["updated_at"]
    kept, changed, _note = r.plan(resumed, "chat-1", SHORT, None, False, at(9), ME)
    assert not changed and kept["progress_deadline"] == longer


def test_progress_state_counts_from_the_last_record_write():
    record, _changed, _note = r.plan(
        None, "chat-1", SHORT, None, False, at(0), ME, progress={"deadline_s": 100, "abort": True}
    )
    record, _changed = step(record, "stage_started", 50, stage=0)
    assert r.progress_state(record, False, at(150))["stuck"] is False
    state = r.progress_state(record, False, at(151))
    assert state == {
        "deadline_s": 100,
        "abort": True,
        "last_progress_at": record["updated_at"],
        "idle_s": 101.0,
        "stuck": True,
    }
    assert r.progress_state(record, True, at(10_000))["stuck"] is False, "a live owner"
    record["fence_epoch"] = 1
    assert r.progress_state(record, False, at(10_000), fence_epoch=1)["stuck"] is True
    fenced = r.progress_state(record, False, at(10_000), fence_epoch=2)
    assert fenced["stuck"] is False, "a rollback since put its nodes at 0: fenced, not stuck"


def test_the_last_decision_is_the_latest_resume_or_promote_and_nothing_else():
    record = planned()
    assert r.last_decision_at(record) is None
    record, _c = r.apply(record, "stage_started", {"stage": 0}, at(10), "ci")
    record, _c = r.apply(record, "pause", {"reason": "look"}, at(20), "ci")
    assert r.last_decision_at(record) is None, "a pause is no fresh start"
    record, _c = r.apply(record, "resume", {"reason": "go"}, at(30), "ci")
    assert r.last_decision_at(record) == format_timestamp(at(30))
    record, _c = r.apply(record, "promote", {"reason": "enough"}, at(40), "ci")
    assert r.last_decision_at(record) == format_timestamp(at(40))
    record, _c = r.apply(record, "stage_started", {"stage": 1}, at(50), "ci")
    assert r.last_decision_at(record) == format_timestamp(at(40))
