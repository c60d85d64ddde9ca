"""The progress callback's final report: the wave lines and the stage table, fed with task
results shaped as canary.yml's tasks return them (records made with the rollout module)."""

import datetime
import types

from ansible_collections.zerolayer.fleet.plugins.callback import zerolayer_progress
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

T0 = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
ME = "runner@ctl"
SCHEDULE = [{"weight": 1, "hold": 60}, {"weight": 100, "hold": 0}]
OPTIONS = {"prefix": "[zerolayer]", "split_nodes": 4}


class Lines:
    """Stands in for Ansible's display: keeps what the callback prints."""

    def __init__(self):
        self.lines = []

    def display(self, text, stderr=False):
        self.lines.append(text)


def callback():
    plugin = zerolayer_progress.CallbackModule()
    plugin._display = Lines()
    plugin.get_option = OPTIONS.get
    return plugin


def result(action, data):
    task = types.SimpleNamespace(action=action, resolved_action="zerolayer.fleet." + action)
    return types.SimpleNamespace(_task=task, _result=data)


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def state(plugin, record, seconds):
    data = {"record": record, "summary": r.summary(record, at(seconds))}
    plugin.v2_runner_on_ok(result("rollout_state", data))


def measured(plugin, record, split):
    """The canary's reconcile that measured the split, as canary_reconcile returns it."""
    wave = {
        "wave": "wave_canary",
        "record": record,
        "summary": r.summary(record, at(0)),
        "changes": [{"action": "split_measured", "splits": split}],
    }
    plugin.v2_runner_on_ok(result("canary_reconcile", {"waves": [wave]}))


def final_report(plugin):
    """(every line shown, the stage table's lines) once the play has ended."""
    plugin.v2_playbook_on_stats(None)
    lines = plugin._display.lines
    return lines, lines[lines.index("[zerolayer]   stages") + 1 :]


def test_the_final_report_ends_with_the_stage_table_and_the_measured_split():
    plugin = callback()
    record, _c, _n = r.plan(None, "chat:wave_canary", SCHEDULE, None, False, at(0), ME)
    state(plugin, record, 0)
    record, _c = r.apply(record, "stage_started", {"stage": 0}, at(10), ME)
    state(plugin, record, 10)
    split = {
        "zl-node-01": {"ok": True, "measured_pct": 1.1, "low_pct": 0.5, "high_pct": 1.6,
                       "connections": 400},
    }  # fmt: skip
    measured(plugin, record, split)
    record, _c = r.apply(record, "hold_started", {}, at(20), ME)
    verdict = {"verdict": "pass", "decision": "complete", "reason": "all 1 gates passed"}
    record, _c = r.apply(record, "verdict", {"verdict": verdict}, at(80), ME)
    record, _c = r.apply(record, "stage_completed", {}, at(81), ME)
    record, _c = r.apply(record, "stage_started", {"stage": 1}, at(82), ME)
    record, _c = r.apply(record, "completed", {}, at(90), ME)
    state(plugin, record, 90)
    drill_table = "WAVE  STAGE\nw     1/2"
    plugin.v2_runner_on_ok(
        result("drill_report", {"table": drill_table, "report": {"drill_id": "d-1"}})
    )
    lines, table = final_report(plugin)
    assert (
        "[zerolayer]   wave wave_canary: completed at stage 2/2 (100%, completed)"
        " | last gates pass -> complete"
    ) in lines
    assert table[0].split()[1:] == ["WAVE", "STAGE", "WEIGHT", "SPLIT", "RANGE", "VERDICTS",
                                    "TIME", "END"]  # fmt: skip
    first, second = table[1], table[2]
    assert first.startswith("[zerolayer]     wave_canary  1/2")
    assert "1.10%" in first and "0.50-1.60%" in first and "pass 1 -> complete" in first
    assert "1m11s" in first and first.endswith("completed")
    assert second.split()[1:4] == ["wave_canary", "2/2", "100%"] and " - " in second
    assert table[3:] == ["[zerolayer]   drill d-1", "[zerolayer]     WAVE  STAGE",
                         "[zerolayer]     w     1/2"]  # fmt: skip


def test_a_node_copy_older_than_the_record_seen_does_not_replace_it():
    plugin = callback()
    old, _c, _n = r.plan(None, "chat:wave_canary", SCHEDULE, None, False, at(0), ME)
    new, _c = r.apply(old, "stage_started", {"stage": 0}, at(0.5), ME)
    state(plugin, new, 1)
    state(plugin, old, 1)
    assert plugin.records["wave_canary"] is new


def test_nothing_seen_prints_nothing():
    plugin = callback()
    plugin.v2_playbook_on_stats(None)
    assert plugin._display.lines == []


def test_a_record_it_cannot_read_is_named_and_the_report_goes_on():
    plugin = callback()
    record, _c, _n = r.plan(None, "chat:wave_canary", SCHEDULE, None, False, at(0), ME)
    record, _c = r.apply(record, "stage_started", {"stage": 0}, at(10), ME)
    state(plugin, record, 10)
    plugin.records["wave_canary"]["transitions"][-1]["at"] = "yesterday"
    plugin.v2_playbook_on_stats(None)
    assert plugin._display.lines[-1].startswith("[zerolayer]     cannot tabulate the records:")
    assert "transitions[].at" in plugin._display.lines[-1]


# A cohort stage first (weight 0: only the clients of its CIDRs go direct), as the rollout
# module normalises it: every stage has a "cohort" list.
COHORT = ["10.1.0.0/16", "192.0.2.7/32"]
COHORT_SCHEDULE = [
    {"weight": 0, "weight_bp": 0, "hold_s": 60, "cohort": COHORT},
    {"weight": 1, "weight_bp": 100, "hold_s": 60, "cohort": []},
    {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
]


def cohort_split(opt_in, to_engine=0):
    return {"ok": to_engine == 0, "cohort": True, "opt_in": opt_in, "connections": opt_in + 50,
            "to_engine": to_engine, "weight_pct": 0.0, "measured_pct": 0.0, "low_pct": 0.0,
            "high_pct": 0.0, "addresses": 0}  # fmt: skip


def test_a_cohort_stage_is_shown_as_its_cohort_with_the_opt_in_connections():
    plugin = callback()
    record, _c, _n = r.plan(None, "chat:wave_canary", SCHEDULE, None, False, at(0), ME)
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    record, _c = r.apply(record, "stage_started", {"stage": 0}, at(10), ME)
    state(plugin, record, 10)
    split = {"zl-node-01": cohort_split(200), "zl-node-02": cohort_split(212)}
    measured(plugin, record, split)
    assert plugin._display.lines[-1] == (
        "[zerolayer] wave wave_canary | stage 1/3 | cohort (2 prefixes) at weight 0"
        " | weight confirmed | opt-in 412 conn. (zl-node-01 200, zl-node-02 212)"
        " | within tolerance"
    )
    read_back = {"weight": 0, "generation": 2}
    nodes = {node: read_back for node in split}
    record, _c = r.apply(record, "weight_confirmed", {"nodes": nodes}, at(11), ME)
    record, _c = r.apply(record, "split_measured", {"splits": split}, at(12), ME)
    record, _c = r.apply(record, "hold_started", {}, at(20), ME)
    state(plugin, record, 20)
    evaluation = {"rollout_id": "chat:wave_canary", "stage": 0, "weight": 0, "verdict": "pass",
                  "decision": "continue", "hold_remaining_s": 30,
                  "gates": [{"name": "success_rate", "verdict": "pass"}]}  # fmt: skip
    plugin.v2_runner_on_ok(result("canary_gate", evaluation))
    assert plugin._display.lines[-1] == (
        "[zerolayer] wave wave_canary | stage 1/3 | cohort (2 prefixes) at weight 0"
        " | opt-in 412 conn. (zl-node-01 200, zl-node-02 212) | success_rate=pass"
        " | pass -> continue | hold 30s left"
    )
    lines, table = final_report(plugin)
    assert (
        "[zerolayer]   wave wave_canary: running at stage 1/3 (cohort (2 prefixes), holding)"
        " | last gates pass -> continue"
    ) in lines
    assert "cohort (2 prefixes)" in table[1] and "opt-in 412 conn. (2 nodes)" in table[1]


def test_the_next_stage_after_a_cohort_is_shown_by_its_weight():
    plugin = callback()
    record, _c, _n = r.plan(None, "chat:wave_canary", SCHEDULE, None, False, at(0), ME)
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    record, _c = r.apply(record, "stage_started", {"stage": 0}, at(10), ME)
    record, _c = r.apply(record, "stage_completed", {}, at(80), ME)
    record, _c = r.apply(record, "stage_started", {"stage": 1}, at(81), ME)
    state(plugin, record, 81)
    evaluation = {"rollout_id": "chat:wave_canary", "stage": 1, "weight": 1, "verdict": "hold",
                  "decision": "continue", "hold_remaining_s": 60, "gates": []}  # fmt: skip
    plugin.v2_runner_on_ok(result("canary_gate", evaluation))
    assert "| stage 2/3 | weight 1% | split - | no gates |" in plugin._display.lines[-1]


def test_a_cohort_split_over_many_nodes_is_summed_and_names_the_weights_hits():
    split = {"n%d" % n: cohort_split(100) for n in range(5)}
    assert zerolayer_progress.format_split(split, 4) == "opt-in 500 conn. (5 nodes)"
    split["n0"] = cohort_split(90, to_engine=3)
    assert zerolayer_progress.format_split(split, 8) == (
        "opt-in 490 conn. (n0 90, n1 100, n2 100, n3 100, n4 100), 3 sent direct by the weight"
    )
    # A weight stage's split (with the cohorts' counts the split now keeps) is as before.
    plain = {"n1": {"ok": True, "measured_pct": 1.1, "opt_in": 0, "opt_out": 0}}
    assert zerolayer_progress.format_split(plain, 4) == "split n1 1.10%"
