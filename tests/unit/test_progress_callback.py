"""The progress callback's final report: the wave lines and the stage table, fed with task
results shaped as canary.yml's tasks return them (records made with the rollout module)."""

import datetime
import types

from ansible_collections.zerolayer.fleet.plugins.callback import zerolayer_progress
from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout as r

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
    plugin.v2_runner_on_ok(result("set_fact", {"ansible_facts": {"_canary_measured_split": split}}))
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
    plugin.v2_playbook_on_stats(None)

    lines = plugin._display.lines
    assert (
        "[zerolayer]   wave wave_canary: completed at stage 2/2 (100%, completed)"
        " | last gates pass -> complete"
    ) in lines
    table = lines[lines.index("[zerolayer]   stages") + 1 :]
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
