# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
name: zerolayer_progress
type: notification
short_description: One line per canary gate evaluation, and a final rollout report
description:
  - Follows the canary and rollback playbooks (C(playbooks/canary.yml), C(playbooks/rollback.yml))
    from the results of their tasks and prints compact progress lines next to the normal output.
  - For every evaluation of M(zerolayer.fleet.canary_gate) (each retry of the hold loop included)
    one line with the wave, the stage as n/N, the weight, the measured split of the stage (min and
    max over the nodes, or per node for up to O(split_nodes) nodes), each gate's verdict, the
    decision and the hold time left.
  - A cohort stage (weight 0, only the clients of its source CIDRs on the direct path) is shown
    by its cohort's prefix count, for example "cohort (2 prefixes) at weight 0", and its split
    as the cohort's connections handed to an engine, for example "opt-in 412 conn.", per node up
    to O(split_nodes) nodes.
  - A line when a stage's weight is confirmed (read back and measured), one per fast or deep
    rollback report, and at the end of the run a report of every wave's outcome.
  - The final report ends with a short table, one row per wave and stage that ran, the same
    table as C(zerolayer rollout report ID) prints (module_utils C(stage_table)), with the weight,
    the measured split over the wave's nodes with its agreeing range (from the run's facts; the
    rollout record does not keep it), the gate verdicts counted by kind with the last decision,
    the time spent in the stage (paused time named) and how the stage ended. After
    M(zerolayer.fleet.drill_report), the drill's own table (the client's split per stage) too.
  - It reads results only; it changes nothing and needs nothing from the playbooks beyond their
    usual tasks.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
requirements:
  - Enabled, for example C(ANSIBLE_CALLBACKS_ENABLED=zerolayer.fleet.zerolayer_progress) or
    C(callbacks_enabled = zerolayer.fleet.zerolayer_progress) in C(ansible.cfg).
options:
  split_nodes:
    description: Show the measured split per node up to this many nodes; above it, min and max.
    type: int
    default: 4
    ini:
      - section: callback_zerolayer_progress
        key: split_nodes
    env:
      - name: ZEROLAYER_PROGRESS_SPLIT_NODES
  prefix:
    description: Text that starts every line, so a log can be filtered for them.
    type: str
    default: "[zerolayer]"
    ini:
      - section: callback_zerolayer_progress
        key: prefix
    env:
      - name: ZEROLAYER_PROGRESS_PREFIX
"""

EXAMPLES = r"""
# ansible.cfg
# [defaults]
# callbacks_enabled = zerolayer.fleet.zerolayer_progress
#
# Output while a stage holds:
# [zerolayer] wave wave_canary | stage 2/4 | weight 5% | split 4.8..5.3% (3 nodes)
#   | route_decision_p99=pass success_rate=pass gpu_memory_spike=pass | pass -> continue
#   | hold 3h12m left
#
# ... and while a cohort stage holds:
# [zerolayer] wave wave_canary | stage 1/5 | cohort (2 prefixes) at weight 0
#   | opt-in 412 conn. (zl-node-01 200, zl-node-02 212) | ... | pass -> continue | hold 21m left
#
# The end of the final report (one line per wave and stage, shortened here):
# [zerolayer]   stages
# [zerolayer]     WAVE         STAGE  WEIGHT  SPLIT                  RANGE       VERDICTS ...
# [zerolayer]     wave_canary  1/4        1%  0.96..1.12% (3 nodes)  0.50-1.60%  pass 40 ...
"""

# ansible-doc reads DOCUMENTATION and EXAMPLES before any import.
import time  # noqa: E402

from ansible.plugins.callback import CallbackBase  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.cohorts import (  # noqa: E402
    format_cohort,
    schedule_cohort,
    stage_cohort,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.stage_table import (  # noqa: E402
    format_opt_in,
    format_seconds,
    format_stage_weight,
    format_weight,
    render_table,
    rollout_rows,
    unix,
    wave_of,
)

ROLLOUT_STATE = "rollout_state"
CANARY_RECONCILE = "canary_reconcile"
CANARY_GATE = "canary_gate"
DRILL_REPORT = "drill_report"


def short_action(task):
    """The module's short name, whatever way the task named it."""
    action = getattr(task, "resolved_action", None) or task.action or ""
    return action.rsplit(".", 1)[-1]


def format_cohort_split(split, per_node_limit):
    """A cohort stage's split: the cohort's connections handed to an engine over the nodes,
    per node up to per_node_limit nodes, and the weight's direct connections where any."""
    entries = {node: entry for node, entry in sorted(split.items()) if isinstance(entry, dict)}
    text = format_opt_in(sum(int(entry.get("opt_in") or 0) for entry in entries.values()))
    if len(entries) <= per_node_limit:
        text += " (%s)" % ", ".join(
            "%s %d" % (node, int(entry.get("opt_in") or 0)) for node, entry in entries.items()
        )
    else:
        text += " (%d nodes)" % len(entries)
    by_weight = sum(int(entry.get("to_engine") or 0) for entry in entries.values())
    if by_weight:
        text += ", %d sent direct by the weight" % by_weight
    return text


def format_split(split, per_node_limit):
    """Measured split from canary.yml's {node: {measured_pct, connections, ok}}."""
    if not split:
        return "split -"
    if any(isinstance(entry, dict) and entry.get("cohort") for entry in split.values()):
        return format_cohort_split(split, per_node_limit)
    measured = {
        node: entry.get("measured_pct")
        for node, entry in sorted(split.items())
        if isinstance(entry, dict)
    }
    known = [value for value in measured.values() if value is not None]
    if len(measured) <= per_node_limit:
        parts = [
            "%s %s" % (node, "-" if value is None else "%.2f%%" % float(value))
            for node, value in measured.items()
        ]
        return "split " + ", ".join(parts)
    if not known:
        return "split - (%d nodes)" % len(measured)
    return "split %.2f..%.2f%% (%d nodes)" % (
        min(float(v) for v in known),
        max(float(v) for v in known),
        len(measured),
    )


class CallbackModule(CallbackBase):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "notification"
    CALLBACK_NAME = "zerolayer.fleet.zerolayer_progress"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self):
        super().__init__()
        self.waves = {}
        self.split = {}
        self.rollbacks = []
        # For the final table: each wave's latest record, its measured splits by stage index
        # (the record does not keep them), and the drill's own tables.
        self.records = {}
        self.splits = {}
        self.drill_tables = []

    # ------------------------------------------------------------ state

    def _wave(self, rollout_id):
        name = wave_of(rollout_id)
        return self.waves.setdefault(name, {"wave": name})

    def _cohort(self, name, stage, given=None):
        """The cohort of a wave's stage (index): as a result gave it, else from the wave's
        latest record; [] for a stage by weight or a record without cohort stages."""
        if isinstance(given, list):
            return stage_cohort({"cohort": given})
        return schedule_cohort((self.records.get(name) or {}).get("schedule"), stage)

    def _stage_weight(self, name, stage, weight, given=None):
        """'5%', or 'cohort (2 prefixes)' for a cohort stage."""
        return format_stage_weight(weight, self._cohort(name, stage, given))

    def _weight_label(self, name, stage, weight, given=None):
        """'weight 5%', or 'cohort (2 prefixes) at weight 0' for a cohort stage."""
        cohort = self._cohort(name, stage, given)
        if cohort:
            return "%s at weight %g" % (format_cohort(cohort), float(weight or 0))
        return "weight %s" % format_weight(weight)

    def _line(self, text):
        # Standard error, so stdout stays what the stdout callback makes of it (JSON for a
        # script that asked for it) while the operator still sees the progress.
        self._display.display("%s %s" % (self.get_option("prefix"), text), stderr=True)

    def _note_rollout_state(self, result):
        summary = result.get("summary")
        if not isinstance(summary, dict):
            return
        wave = self._wave(summary.get("rollout_id"))
        previous_stage = wave.get("stage_number")
        wave.update(summary)
        if previous_stage != summary.get("stage_number"):
            self.split.pop(wave["wave"], None)
        self._note_record(wave["wave"], result.get("record"))
        # The canary's reconcile records the measured split, among a wave's changes.
        for change in result.get("changes") or []:
            if change.get("action") == "split_measured":
                self._note_split(change.get("splits"))

    def _note_record(self, name, record):
        if not isinstance(record, dict) or not isinstance(record.get("transitions"), list):
            return
        known = self.records.get(name)
        # A node's copy (action sync) can come in after a newer controller write.
        if known is None or unix(record["updated_at"], "updated_at") >= unix(
            known["updated_at"], "updated_at"
        ):
            self.records[name] = record

    def _note_split(self, split):
        if not isinstance(split, dict):
            return
        # The split belongs to the wave whose stage was just started.
        current = max(
            self.waves.values(),
            key=lambda wave: wave.get("updated_at") or "",
            default=None,
        )
        name = current["wave"] if current else "-"
        self.split[name] = split
        if current and isinstance(current.get("stage"), int):
            self.splits.setdefault(name, {})[current["stage"]] = split
        stage = "%s/%s" % (current.get("stage_number", "?"), current.get("stage_count", "?"))
        off = sorted(node for node, entry in split.items() if not entry.get("ok"))
        self._line(
            "wave %s | stage %s | %s | weight confirmed | %s%s"
            % (
                name,
                stage,
                self._weight_label(
                    name,
                    current.get("stage") if current else None,
                    current.get("weight") if current else None,
                    current.get("cohort") if current else None,
                ),
                format_split(split, self.get_option("split_nodes")),
                " | OFF: %s" % ", ".join(off) if off else " | within tolerance",
            )
        )

    def _show_evaluation(self, result, final):
        wave = self._wave(result.get("rollout_id"))
        stage = result.get("stage")
        stage_count = wave.get("stage_count", "?")
        gates = " ".join(
            "%s=%s" % (gate.get("name"), gate.get("verdict"))
            for gate in result.get("gates") or []
            if isinstance(gate, dict)
        )
        wave["last_verdict"] = result.get("verdict")
        wave["last_decision"] = result.get("decision")
        self._line(
            "wave %s | stage %s/%s | %s | %s | %s | %s -> %s | hold %s left%s"
            % (
                wave["wave"],
                (stage + 1) if isinstance(stage, int) else "?",
                stage_count,
                self._weight_label(wave["wave"], stage, result.get("weight"), result.get("cohort")),
                format_split(self.split.get(wave["wave"]), self.get_option("split_nodes")),
                gates or "no gates",
                result.get("verdict"),
                result.get("decision"),
                format_seconds(result.get("hold_remaining_s")),
                (" (%s)" % result.get("decision_reason"))
                if final and result.get("decision") in ("rollback", "pause")
                else "",
            )
        )

    def _note_rollback(self, facts):
        report = facts.get("_rollback_report")
        if not isinstance(report, dict):
            return
        self.rollbacks.append(report)
        self._line(
            "%s rollback | %s/%s nodes confirmed | %ss (budget %ss, %s) | unreachable %s"
            " | not confirmed %s"
            % (
                report.get("mode"),
                report.get("nodes_confirmed"),
                report.get("nodes_total"),
                report.get("wall_time_s"),
                report.get("budget_s"),
                "within" if report.get("within_budget") else "OVER",
                ", ".join(report.get("unreachable") or []) or "none",
                ", ".join(report.get("not_confirmed") or []) or "none",
            )
        )

    def _handle(self, result, final):
        data = result._result
        if not isinstance(data, dict) or (data.get("failed") and "verdict" not in data):
            return
        action = short_action(result._task)
        if action == CANARY_GATE and "decision" in data:
            self._show_evaluation(data, final)
        elif action == DRILL_REPORT and isinstance(data.get("table"), str):
            self.drill_tables.append(((data.get("report") or {}).get("drill_id"), data["table"]))
        elif action == ROLLOUT_STATE:
            self._note_rollout_state(data)
        elif action == CANARY_RECONCILE:
            # Each wave the step reconciled, in order, with the changes made to its record.
            for wave in data.get("waves") or []:
                if isinstance(wave, dict):
                    self._note_rollout_state(wave)
        facts = data.get("ansible_facts")
        if isinstance(facts, dict):
            self._note_rollback(facts)

    # ------------------------------------------------------------ hooks

    def v2_runner_on_ok(self, result):
        self._handle(result, final=True)

    def v2_runner_item_on_ok(self, result):
        self._handle(result, final=True)

    def v2_runner_retry(self, result):
        self._handle(result, final=False)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._handle(result, final=True)

    def v2_playbook_on_stats(self, stats):
        if not self.waves and not self.rollbacks and not self.drill_tables:
            return
        self._line("report")
        for name, wave in sorted(self.waves.items()):
            if "outcome" not in wave:
                continue
            self._line(
                "  wave %s: %s at stage %s/%s (%s, %s)%s%s"
                % (
                    name,
                    wave.get("outcome"),
                    wave.get("stage_number"),
                    wave.get("stage_count"),
                    self._stage_weight(
                        name, wave.get("stage"), wave.get("weight"), wave.get("cohort")
                    ),
                    wave.get("stage_status"),
                    " | last gates %s -> %s" % (wave.get("last_verdict"), wave.get("last_decision"))
                    if wave.get("last_verdict")
                    else "",
                    " | paused: %s" % wave.get("pause_reason") if wave.get("paused") else "",
                )
            )
        for report in self.rollbacks:
            self._line(
                "  %s rollback: %s/%s nodes in %ss (budget %ss)"
                % (
                    report.get("mode"),
                    report.get("nodes_confirmed"),
                    report.get("nodes_total"),
                    report.get("wall_time_s"),
                    report.get("budget_s"),
                )
            )
        if self.records:
            self._line("  stages")
            try:
                lines = render_table(rollout_rows(self.records, time.time(), self.splits))
            except FleetError as exc:
                # A record it cannot read must not hide the rest of the report.
                lines = ["cannot tabulate the records: %s" % exc.message]
            for line in lines:
                self._line("    %s" % line)
        for drill_id, table in self.drill_tables:
            self._line("  drill %s" % drill_id)
            for line in table.splitlines():
                self._line("    %s" % line)
