"""The canary's reconcile step (module_utils/rollout/reconcile.py, through
controller/canary_reconcile.py with records in files): every transition a run goes through,
driven the way canary.yml drives it, one instruction after another, with the acts' outcomes
scripted (a node's read-back, its measured split, the gates' decision, a rollback's report).
"""

import json

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import canary_reconcile
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import reconcile

ROUTES = ["chat"]
GROUPS = {"all": ["n1", "n2", "n3"], "wave_a": ["n1"], "wave_b": ["n2", "n3"]}
TWO_STAGES = [{"weight": 5, "hold": "10m"}, {"weight": 100, "hold": 0}]


def params(tmp_path, **overrides):
    found = {
        "endpoints": [],
        "rollout_id": "r1",
        "waves": ["wave_a", "wave_b"],
        "inventory_groups": GROUPS,
        "play_hosts": ["n1", "n2", "n3"],
        "schedule": TWO_STAGES,
        "wave_schedules": {},
        "gates": None,
        "restart": False,
        "epoch": 4,
        "take_epoch": False,
        "progress_deadline": "auto",
        "progress_deadline_abort": False,
        "gate_interval": 60,
        "pause_after_weight": 0,
        "routes": ROUTES,
        "split": {"min_connections": 0, "sigmas": 4, "floor_pct": 0.5, "wait_s": 10, "poll_s": 2},
        "request": "run",
        "fence": {"fence": {"epoch": 4}},
        "record_dir": str(tmp_path),
        "owner_scope": None,
        "owner_lease": None,
        "run": None,
        "readbacks": {},
        "split_reads": {},
        "verdict": {},
        "rollback_report": {},
        "actor": "tester@ctl",
    }
    found.update(overrides)
    return found


def route(weight_bp, generation=1, **extra):
    found = {"name": "chat", "weight_bp": weight_bp, "weight": weight_bp / 100.0}
    found.update(generation=generation, **extra)
    return found


class Run:
    """canary.yml's loop: each step hands the previous result's run back, with what the act
    saw."""

    def __init__(self, tmp_path, **overrides):
        self.tmp_path = tmp_path
        self.overrides = overrides
        self.last = None
        self.kinds = []

    def step(self, **observed):
        given = dict(self.overrides)
        given.update(observed)
        given["run"] = self.last["run"] if self.last else None
        self.last = canary_reconcile.run(params(self.tmp_path, **given), check_mode=False)
        self.kinds.append((self.last["kind"], self.last["wave"]))
        return self.last

    def confirm(self, weight_bp=None):
        """The act of a write: every node reads back the weight written."""
        wanted = self.last["weight_bp"] if weight_bp is None else weight_bp
        return self.step(readbacks={node: [route(wanted)] for node in self.last["nodes"]})

    def record(self, wave):
        return json.loads((self.tmp_path / "r1" / (wave + ".json")).read_text())


def verdict(decision, verdict_value="pass", reason="all gates pass"):
    return {"decision": decision, "verdict": verdict_value, "reason": reason, "gates": []}


# ---------------------------------------------------------------- the pass path


def test_a_run_goes_write_confirm_hold_stage_after_stage_wave_after_wave(tmp_path):
    run = Run(tmp_path)
    first = run.step()
    assert (first["kind"], first["wave"], first["nodes"]) == ("write", "wave_a", ["n1"])
    assert (first["stage"], first["weight"], first["weight_bp"], first["epoch"]) == (0, 5, 500, 4)
    assert first["cohort"] is None and first["changed"] is True
    assert run.record("wave_a")["stage"]["status"] == "started"

    hold = run.confirm()
    assert (hold["kind"], hold["stage"], hold["hold_s"]) == ("hold", 0, 600)
    assert hold["hold_started_at"] == run.record("wave_a")["stage"]["hold_started_at"]
    # The nodes' copies say the hold started.
    assert [(c["wave"], c["nodes"]) for c in hold["copies"]] == [("wave_a", ["n1"])]
    assert hold["copies"][0]["record"]["stage"]["status"] == "holding"
    assert (hold["record_key"], hold["wave_id"]) == ("r1/wave_a", "r1:wave_a")
    assert hold["gate_state"] == str(tmp_path / "r1" / "gates" / "wave_a.json")

    second = run.step(verdict=verdict("complete"))
    assert (second["kind"], second["stage"], second["weight"]) == ("write", 1, 100)
    assert run.record("wave_a")["completed_stages"][0]["how"] == "stage_completed"
    assert second["copies"][0]["record"]["stage"]["index"] == 1

    # 100 % without a hold: confirmed, the wave is completed and the next one starts.
    third = run.confirm()
    assert (third["kind"], third["wave"], third["nodes"], third["stage"]) == (
        "write", "wave_b", ["n2", "n3"], 0)  # fmt: skip
    assert run.record("wave_a")["outcome"] == "completed"
    assert [c["wave"] for c in third["copies"]] == ["wave_a"]
    assert third["copies"][0]["record"]["outcome"] == "completed"
    assert [w["wave"] for w in third["run"]["waves"]] == ["wave_a"]

    run.confirm()
    run.step(verdict=verdict("complete"))
    done = run.confirm()
    assert done["kind"] == "done" and done["halt"] == {}
    assert [w["wave"] for w in done["run"]["waves"]] == ["wave_a", "wave_b"]
    assert [w["outcome"] for w in done["run"]["waves"]] == ["completed", "completed"]
    assert run.record("wave_b")["outcome"] == "completed"
    assert run.kinds == [
        ("write", "wave_a"), ("hold", "wave_a"), ("write", "wave_a"), ("write", "wave_b"),
        ("hold", "wave_b"), ("write", "wave_b"), ("done", None)]  # fmt: skip


def test_a_reconcile_writes_the_waves_record_once_whatever_it_changed(tmp_path, monkeypatch):
    """The hold's verdict, the stage's end and the next stage's start: one write (one
    compare-and-swap in the store), so no reader sees the verdict without the stage's end."""
    run = Run(tmp_path)
    run.step()
    run.confirm()
    writes = []
    real_write = record_codec.write_record
    monkeypatch.setattr(
        record_codec,
        "write_record",
        lambda where, record: writes.append(where) or real_write(where, record),
    )
    written = run.step(verdict=verdict("complete"))
    assert [change["action"] for change in written["waves"][-1]["changes"]] == [
        "verdict", "stage_completed", "stage_started"]  # fmt: skip
    assert writes == [str(tmp_path / "r1" / "wave_a.json")]
    kept = run.record("wave_a")
    assert kept["verdicts"][-1]["decision"] == "complete"
    assert (kept["stage"]["index"], kept["stage"]["status"]) == (1, "started")


def test_a_rerun_of_a_completed_rollout_changes_nothing_and_is_done_at_once(tmp_path):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    run.step(verdict=verdict("complete"))
    run.confirm()
    run.confirm()
    run.step(verdict=verdict("complete"))
    run.confirm()
    again = Run(tmp_path).step()
    assert again["kind"] == "done" and again["changed"] is False
    assert [c["wave"] for c in again["copies"]] == ["wave_a", "wave_b"]


def test_a_measured_split_comes_between_the_read_back_and_the_hold(tmp_path):
    split = {"min_connections": 100, "sigmas": 4, "floor_pct": 0.5, "wait_s": 10, "poll_s": 2}
    run = Run(tmp_path, split=split)
    run.step()
    measure = run.confirm()
    assert (measure["kind"], measure["attempts"], measure["min_connections"]) == ("measure", 6, 100)
    assert measure["readbacks"] == {"n1": [route(500)]}
    assert measure["cohort_stage"] is False
    counted = {"n1": [route(500, counters={"lookups": 1000, "to_engine": 50})]}
    hold = run.step(split_reads=counted)
    assert hold["kind"] == "hold", hold["halt"]
    assert run.record("wave_a")["splits"]["0"]["n1"]["ok"] is True


def test_a_split_off_the_weight_stops_before_the_hold(tmp_path):
    split = {"min_connections": 100, "sigmas": 4, "floor_pct": 0.5, "wait_s": 10, "poll_s": 2}
    run = Run(tmp_path, split=split)
    run.step()
    run.step(readbacks={"n1": [route(500, generation=3)]})
    stop = run.step(split_reads={"n1": [route(500, counters={"lookups": 1000, "to_engine": 500})]})
    assert stop["kind"] == "stop" and stop["halt"]["kind"] == "split_off"
    assert stop["halt"]["failed"] is True
    assert "Measured split not confirmed at stage 1 of wave wave_a" in stop["halt"]["message"]
    kept = run.record("wave_a")
    assert kept["stage"]["status"] == "started"
    # The stop keeps what the nodes said for whoever looks: the read-back and the split.
    assert kept["nodes"]["n1"]["generation"] == 3
    assert kept["splits"]["0"]["n1"]["ok"] is False
    assert kept["splits"]["0"]["n1"]["measured_pct"] == 50.0


# ---------------------------------------------------------------- stops


def test_a_node_that_did_not_take_the_weight_stops_the_run_before_the_hold(tmp_path):
    run = Run(tmp_path)
    run.step(waves=["wave_b"])
    stop = run.step(waves=["wave_b"], readbacks={"n2": [route(500)], "n3": [route(0)]})
    assert stop["kind"] == "stop" and stop["halt"]["kind"] == "lagging"
    assert "n3" in stop["halt"]["message"] and "n2 " not in stop["halt"]["message"]
    assert stop["copies"] == []


@pytest.mark.parametrize(
    "decision, failed", [("paused", False), ("fenced", True), ("owner_lost", True)]
)
def test_a_hold_ended_elsewhere_stops_without_writing(tmp_path, decision, failed):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    before = run.record("wave_a")
    stop = run.step(verdict=verdict(decision, reason="someone acted"))
    assert (stop["kind"], stop["halt"]["kind"], stop["halt"]["failed"]) == (
        "stop", decision, failed)  # fmt: skip
    assert run.record("wave_a") == before and stop["changed"] is False


@pytest.mark.parametrize(
    "outcome, decision, failed", [("paused", "paused", False), ("aborted", "fenced", True)]
)
def test_a_hold_ended_by_a_pause_or_fence_made_elsewhere_stops_with_the_gates_reason(
    tmp_path, outcome, decision, failed
):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    # Another shell paused the rollout, or aborted it (raising the fence), during the hold.
    moved = run.record("wave_a")
    moved["outcome"] = outcome
    moved["paused"] = outcome == "paused"
    (tmp_path / "r1" / "wave_a.json").write_text(json.dumps(moved))
    stop = run.step(verdict=verdict(decision, reason="the fleet's fence epoch rose from 4 to 5"))
    assert (stop["halt"]["kind"], stop["halt"]["failed"]) == (decision, failed)
    assert "without writing anything more: the fleet's fence epoch rose" in stop["halt"]["message"]
    assert run.record("wave_a") == moved
    # A paused wave's nodes get the record as the other actor left it.
    assert [c["record"] for c in stop["copies"]] == ([moved] if outcome == "paused" else [])


def test_gates_that_fail_roll_back_then_the_run_stops_with_the_report(tmp_path):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    rollback = run.step(verdict=verdict("rollback", "fail", "error rate"))
    assert rollback["kind"] == "rollback"
    assert rollback["rollback"]["kind"] == "rolled_back"
    assert "gates failed at stage 1 (5%) of wave wave_a" in rollback["rollback"]["reason"]
    assert run.record("wave_a")["verdicts"][-1]["decision"] == "rollback"
    report = {"nodes_confirmed": 3, "nodes_total": 3, "wall_time_s": 0.8, "budget_s": 30,
              "unreachable": [], "not_confirmed": [], "store_updated": False}  # fmt: skip
    stop = run.step(rollback_report=report)
    assert stop["kind"] == "stop" and stop["halt"]["kind"] == "rolled_back"
    assert stop["halt"]["failed"] is True
    assert stop["halt"]["message"].startswith("Rollout r1:wave_a rolled back: gates failed")
    assert "3/3 nodes confirmed at weight 0 in 0.8 s (budget 30 s)" in stop["halt"]["message"]
    # Without a store the records are the files: each wave's nodes get theirs.
    assert [c["wave"] for c in stop["copies"]] == ["wave_a"]


def test_a_pause_planned_after_a_weight_stops_the_run_not_failed(tmp_path):
    run = Run(tmp_path, pause_after_weight=5)
    run.step()
    run.confirm()
    stop = run.step(verdict=verdict("complete"))
    assert (stop["kind"], stop["halt"]["kind"], stop["halt"]["failed"]) == ("stop", "paused", False)
    assert run.record("wave_a")["outcome"] == "paused"
    assert stop["copies"][0]["record"]["outcome"] == "paused"


def test_gates_that_cannot_see_pause_the_wave_and_fail_the_run(tmp_path):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    stop = run.step(verdict=verdict("pause", "hold", "no data"))
    assert (stop["kind"], stop["halt"]["kind"], stop["halt"]["failed"]) == ("stop", "paused", True)
    assert run.record("wave_a")["pause_reason"] == "no data"


def test_a_paused_wave_stops_a_plain_run_and_a_resume_carries_on(tmp_path):
    run = Run(tmp_path, pause_after_weight=5)
    run.step()
    run.confirm()
    run.step(verdict=verdict("complete"))
    stopped = Run(tmp_path, pause_after_weight=5).step()
    assert stopped["kind"] == "stop" and "is paused at stage 1/2" in stopped["halt"]["message"]
    assert stopped["changed"] is False
    resumed = Run(tmp_path, request="resume", pause_after_weight=5)
    first = resumed.step()
    assert (first["kind"], first["stage"]) == ("write", 1)
    assert resumed.record("wave_a")["outcome"] == "running"
    assert resumed.record("wave_a")["transitions"][-2]["action"] == "resume"


def test_a_request_applies_to_the_first_wave_in_progress_once(tmp_path):
    run = Run(tmp_path, request="pause")
    stop = run.step()
    assert (stop["kind"], stop["wave"], stop["halt"]["kind"]) == ("stop", "wave_a", "paused")
    assert run.record("wave_a")["paused"] is True
    assert stop["copies"][0]["wave"] == "wave_a"


def test_an_abort_rolls_back_and_marks_the_record(tmp_path):
    Run(tmp_path).step()
    run = Run(tmp_path, request="abort")
    rollback = run.step()
    assert rollback["kind"] == "rollback" and rollback["rollback"]["kind"] == "aborted"
    assert run.record("wave_a")["outcome"] == "aborted"
    stop = run.step(rollback_report={"nodes_confirmed": 2, "nodes_total": 3})
    assert stop["halt"]["kind"] == "aborted" and stop["halt"]["failed"] is True


def test_an_abort_with_the_store_out_of_reach_rolls_back_without_records(tmp_path):
    run = Run(
        tmp_path,
        endpoints=["https://127.0.0.1:1"],
        request="abort",
        fence={"msg": "the rollout store could not be reached"},
    )
    rollback = run.step()
    assert (rollback["kind"], rollback["wave"]) == ("rollback", "every wave")
    assert (
        "while the rollout store could not be read (the rollout store could not be "
        "reached); its records were not updated" in rollback["rollback"]["reason"]
    )
    stop = run.step(rollback_report={"nodes_confirmed": 3, "nodes_total": 3,
                                     "store_updated": False})  # fmt: skip
    assert stop["copies"] == [] and stop["halt"]["kind"] == "aborted"
    assert not (tmp_path / "r1").exists()


def test_an_interrupted_run_writes_and_confirms_its_stage_again_and_keeps_the_hold_start(tmp_path):
    run = Run(tmp_path)
    run.step()
    first_hold = run.confirm()
    again = Run(tmp_path)
    write = again.step()
    assert (write["kind"], write["stage"]) == ("write", 0)
    hold = again.confirm()
    assert hold["hold_started_at"] == first_hold["hold_started_at"]


# ---------------------------------------------------------------- bad input


def test_a_run_that_ended_is_not_reconciled_again(tmp_path):
    with pytest.raises(FleetError, match="run: the run already ended"):
        canary_reconcile.run(
            params(tmp_path, run={"last": {"kind": "done"}, "planned": [], "waves": [],
                                  "request_applied": True}), False)  # fmt: skip


def test_a_wave_that_is_no_inventory_group_is_refused_before_any_write(tmp_path):
    with pytest.raises(FleetError, match="not groups: wave_x"):
        canary_reconcile.run(params(tmp_path, waves=["wave_a", "wave_x"]), False)
    assert not (tmp_path / "r1").exists()


def test_a_split_without_its_settings_is_refused(tmp_path):
    with pytest.raises(FleetError, match="missing poll_s"):
        short = {"min_connections": 0, "sigmas": 4, "floor_pct": 0, "wait_s": 1}
        canary_reconcile.run(params(tmp_path, split=short), False)


def test_an_unknown_request_names_the_setting():
    with pytest.raises(FleetError, match="canary_action must be one of run, pause"):
        reconcile.new_run("go")


def test_check_mode_writes_nothing(tmp_path):
    found = canary_reconcile.run(params(tmp_path), check_mode=True)
    assert found["kind"] == "write" and found["changed"] is True
    assert not (tmp_path / "r1").exists()


# ---------------------------------------------------------------- a person's decisions


def test_a_promote_ends_the_hold_and_the_next_step_writes_the_next_stage(tmp_path):
    run = Run(tmp_path)
    run.step()
    run.confirm()
    promoted = Run(tmp_path, request="promote").step()
    assert (promoted["kind"], promoted["stage"], promoted["weight"]) == ("write", 1, 100)
    kept = json.loads((tmp_path / "r1" / "wave_a.json").read_text())
    assert kept["completed_stages"][0]["how"] == "promote"


def test_a_promote_full_goes_to_the_last_stage(tmp_path):
    schedule = [
        {"weight": 1, "hold": "1h"},
        {"weight": 5, "hold": "1h"},
        {"weight": 100, "hold": 0},
    ]
    Run(tmp_path, schedule=schedule).step()
    full = Run(tmp_path, schedule=schedule, request="promote_full").step()
    assert (full["kind"], full["stage"], full["weight"]) == ("write", 2, 100)


def test_a_cohort_stage_writes_its_prefixes_at_weight_zero_and_measures_the_cohort(tmp_path):
    schedule = [{"cohort": ["10.9.0.0/24"], "hold": "10m"}, {"weight": 100, "hold": 0}]
    split = {"min_connections": 10, "sigmas": 4, "floor_pct": 0.5, "wait_s": 4, "poll_s": 2}
    run = Run(tmp_path, schedule=schedule, split=split)
    write = run.step()
    assert (write["weight_bp"], write["cohort"]) == (0, ["10.9.0.0/24"])
    measure = run.step(readbacks={"n1": [route(0, always_direct=["10.9.0.0/24"])]})
    assert (measure["kind"], measure["cohort_stage"], measure["attempts"]) == ("measure", True, 3)
    # The stage after a cohort stage clears it: [] is written, not left alone.
    counted = route(
        0, always_direct=["10.9.0.0/24"], counters={"lookups": 20, "to_engine_opt_in": 20}
    )
    run.step(split_reads={"n1": [counted]})
    after = run.step(verdict=verdict("complete"))
    assert (after["kind"], after["weight_bp"], after["cohort"]) == ("write", 10000, [])


def test_a_read_back_missing_the_cohort_lags(tmp_path):
    schedule = [{"cohort": ["10.9.0.0/24"], "hold": "10m"}, {"weight": 100, "hold": 0}]
    run = Run(tmp_path, schedule=schedule)
    run.step()
    stop = run.step(readbacks={"n1": [route(0, always_direct=[])]})
    assert (
        stop["halt"]["kind"] == "lagging" and "always_direct 10.9.0.0/24" in stop["halt"]["message"]
    )


def test_a_wave_whose_last_stage_completed_without_its_mark_is_marked_completed(tmp_path):
    run = Run(tmp_path, waves=["wave_a"])
    run.step()
    run.confirm()
    run.step(verdict=verdict("complete"))
    kept = run.record("wave_a")
    # An earlier run ended between the last stage's end and the wave's mark.
    kept["stage"]["status"] = "completed"
    (tmp_path / "r1" / "wave_a.json").write_text(json.dumps(kept))
    done = Run(tmp_path, waves=["wave_a"]).step()
    assert done["kind"] == "done" and run.record("wave_a")["outcome"] == "completed"


def test_a_wave_schedule_of_its_own_is_planned_for_that_wave(tmp_path):
    own = {"wave_b": [{"weight": 20, "hold": 0}, {"weight": 100, "hold": 0}]}
    run = Run(tmp_path, waves=["wave_b"], wave_schedules=own)
    assert run.step()["weight"] == 20
    assert run.confirm()["weight"] == 100
