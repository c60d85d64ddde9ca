# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The canary's reconcile step: what the run does next, as one instruction.

canary.yml repeats reconcile -> act -> confirm. Each reconcile takes one wave's record as
read from where it lives (the store, or a file without one), what this run has done so far
(`run`, handed back by the previous step) and what the last act saw (the nodes' read-backs,
their measured split, the gates' last decision, the rollback's report), makes the record
changes that follow, and returns one instruction:

  write     write the stage's weight (and cohort) with the run's epoch on `nodes`, then read
            it back;
  measure   count the new connections each node's router splits, until enough came;
  hold      evaluate the gates every interval until they decide;
  rollback  roll every node of the rollout back now (fence first), then report;
  stop      end the run with `halt` (a message, and whether the run failed);
  done      every wave is completed.

Every instruction may carry `copies`: records to copy to their wave's nodes first (the
route exporter serves those copies). The decisions at each point are rollout_steps'; this
module strings them together in the order a stage goes: started -> weight written and read
back -> split measured -> hold -> verdict -> stage end, wave after wave. Plain Python, no
Ansible and no I/O: controller/canary_reconcile.py reads and writes the records around it.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_steps,
)

KINDS = ("write", "measure", "hold", "rollback", "stop", "done")
# The run's own acts whose outcome the next reconcile reads, per stage.
STAGE_ACTS = ("write", "measure", "hold")


def wave_id(rollout_id, wave):
    """A wave's rollout id in its record, events and gate history."""
    return "%s:%s" % (rollout_id, wave)


def new_run(request):
    """What a run has done before its first reconcile: nothing; a request other than `run`
    is still to apply (to the first wave in progress)."""
    if request not in rollout_steps.REQUESTS:
        raise FleetError(
            "canary_action must be one of %s; got %r"
            % (", ".join(rollout_steps.REQUESTS), request),
            {"field": "canary_action"},
        )
    return {"planned": [], "request_applied": request == "run", "last": {}, "waves": []}


class Settings:
    """What every wave of the run is reconciled with (the canary's settings)."""

    def __init__(self, params):
        self.rollout_id = params["rollout_id"]
        self.schedule = params.get("schedule")
        self.wave_schedules = params.get("wave_schedules") or {}
        self.gates = params.get("gates")
        self.restart = bool(params.get("restart"))
        self.epoch = params.get("epoch")
        self.take_epoch = bool(params.get("take_epoch"))
        self.request = params.get("request") or "run"
        self.pause_after_weight = float(params.get("pause_after_weight") or 0)
        self.routes = list(params.get("routes") or [])
        self.split = dict(params.get("split") or {})
        self.progress_deadline = params.get("progress_deadline", rollout.PROGRESS_DEADLINE_AUTO)
        self.progress_deadline_abort = bool(params.get("progress_deadline_abort"))
        self.gate_interval = params.get("gate_interval") or 60

    def wave_id(self, wave):
        return wave_id(self.rollout_id, wave)

    def schedule_of(self, wave):
        return self.wave_schedules.get(wave, self.schedule)

    def progress_of(self, wave):
        return rollout.planned_progress(
            self.schedule_of(wave),
            self.progress_deadline,
            self.gate_interval,
            self.progress_deadline_abort,
        )

    def split_attempts(self):
        """How many reads of the counters fit the split's wait (one at once, then one a poll)."""
        return int(self.split.get("wait_s") or 0) // max(1, int(self.split.get("poll_s") or 1)) + 1


def instruction(kind, wave=None, **fields):
    if kind not in KINDS:
        raise FleetError(
            "instruction kind must be one of %s; got %r" % (", ".join(KINDS), kind),
            {"field": "kind"},
        )
    found = {"kind": kind, "wave": wave, "copies": [], "halt": {}, "rollback": {}}
    found.update(fields)
    return found


class WaveStep:
    """One wave's record while a reconcile changes it: the changes in order, made on the
    record read (written once, by the caller, when anything changed)."""

    def __init__(self, wave, nodes, record, settings, run, now, actor):
        self.wave = wave
        self.nodes = list(nodes)
        self.record = record
        self.settings = settings
        self.run = run
        self.now = now
        self.actor = actor
        self.changed = False
        self.changes = []
        self.wave_id = settings.wave_id(wave)

    # ------------------------------------------------------------ record changes

    def apply(self, changes):
        for change in changes:
            self.record, done = rollout.apply(
                self.record, change["action"], change, self.now, self.actor
            )
            self.changed = self.changed or done
            if done:
                self.changes.append(dict(change))

    def plan(self):
        record, changed, _note = rollout.plan(
            self.record,
            self.wave_id,
            self.settings.schedule_of(self.wave),
            self.settings.gates,
            self.settings.restart,
            self.now,
            self.actor,
            epoch=self.settings.epoch,
            take_epoch=self.settings.take_epoch,
            progress=self.settings.progress_of(self.wave),
        )
        self.record = record
        self.changed = self.changed or changed
        if changed:
            self.changes.append({"action": "plan"})
        self.run["planned"].append(self.wave)

    # ------------------------------------------------------------ instructions

    def _copy(self):
        return [{"wave": self.wave, "nodes": self.nodes, "record": self.record}]

    def _stop(self, halt):
        """The run stops. A paused wave's nodes get the record as read (it says paused,
        whoever paused it: their route exporter serves it); every other stop leaves the
        copies as they are."""
        self.run["last"] = {"kind": "stop", "wave": self.wave}
        copies = self._copy() if halt.get("kind") == "paused" else []
        return instruction("stop", self.wave, halt=halt, copies=copies)

    def _stage_fields(self):
        index = self.record["stage"]["index"]
        return index, self.record["schedule"][index]

    def _write(self):
        """The stage the record is at (or the next, once it is completed) starts; its weight
        goes to the wave's nodes. A resumed run writes and confirms its stage again."""
        index = rollout.resume_point(self.record, self.now)["stage"]
        self.apply([{"action": "stage_started", "stage": index}])
        planned = self.record["schedule"][index]
        self.run["last"] = {"kind": "write", "wave": self.wave, "stage": index}
        return instruction(
            "write",
            self.wave,
            nodes=self.nodes,
            stage=index,
            weight=planned["weight"],
            weight_bp=planned["weight_bp"],
            # None leaves the routes' always_direct as they are (a schedule without cohorts).
            cohort=planned.get("cohort"),
            epoch=self.settings.epoch,
        )

    def _measure(self, readbacks):
        index, planned = self._stage_fields()
        self.run["last"] = {
            "kind": "measure",
            "wave": self.wave,
            "stage": index,
            "readbacks": readbacks,
        }
        return instruction(
            "measure",
            self.wave,
            nodes=self.nodes,
            stage=index,
            weight=planned["weight"],
            cohort_stage=bool(planned.get("cohort")),
            readbacks=readbacks,
            min_connections=int(self.settings.split.get("min_connections") or 0),
            attempts=self.settings.split_attempts(),
        )

    def _hold_or_end(self):
        """The stage's weight is confirmed: its hold starts (a resumed run keeps the first
        start), the nodes' copies say so; a stage without a hold ends at once."""
        index, planned = self._stage_fields()
        self.apply([{"action": "hold_started"}])
        if planned["hold_s"] > 0:
            self.run["last"] = {"kind": "hold", "wave": self.wave, "stage": index}
            return instruction(
                "hold",
                self.wave,
                nodes=self.nodes,
                stage=index,
                weight=planned["weight"],
                hold_s=planned["hold_s"],
                hold_started_at=self.record["stage"]["hold_started_at"],
                copies=self._copy(),
            )
        return self._stage_end()

    def _stage_end(self):
        """The stage's end: paused as planned, or the next stage (or the wave completed);
        the nodes' copies say what ended."""
        planned = self._stage_fields()[1]
        ended = rollout_steps.at_stage_end(
            planned["hold_s"],
            planned["weight"],
            self.settings.pause_after_weight,
            self.wave_id,
            self.wave,
        )
        self.apply(ended["changes"])
        if ended["halt"]:
            return self._stop(ended["halt"])
        self.run["last"] = {}
        found = self.next_step()
        if found is not None:
            found["copies"] = self._copy()
        return found

    def _after_last_act(self, observed):
        """The outcome of this run's last act on the current stage."""
        last = self.run["last"]
        index, planned = self._stage_fields()
        if last["kind"] == "write":
            confirmed = rollout_steps.at_confirmed(
                self.record, observed.get("readbacks") or {}, self.settings.routes, self.wave
            )
            self.apply(confirmed["changes"])
            if confirmed["halt"]:
                return self._stop(confirmed["halt"])
            if int(self.settings.split.get("min_connections") or 0) > 0:
                readbacks = {
                    node: rollout_steps.routes_read(read, self.settings.routes)
                    for node, read in sorted((observed.get("readbacks") or {}).items())
                }
                return self._measure(readbacks)
            return self._hold_or_end()
        if last["kind"] == "measure":
            measured = rollout_steps.at_measured(
                self.record,
                last.get("readbacks") or {},
                observed.get("split_reads") or {},
                self.settings.routes,
                self.settings.split,
                self.wave,
            )
            self.apply(measured["changes"])
            if measured["halt"]:
                return self._stop(measured["halt"])
            return self._hold_or_end()
        # The hold's end: the gates' last decision.
        decided = rollout_steps.at_hold_end(
            observed.get("verdict"), self.wave_id, self.wave, index, planned["weight"]
        )
        self.apply(decided["changes"])
        if decided["halt"]:
            return self._stop(decided["halt"])
        if decided["rollback"]:
            return self._rollback(decided["rollback"])
        return self._stage_end()

    def _rollback(self, rollback):
        self.run["last"] = {
            "kind": "rollback",
            "wave": self.wave,
            "wave_id": self.wave_id,
            "rollback": rollback,
        }
        return instruction("rollback", self.wave, wave_id=self.wave_id, rollback=rollback)

    # ------------------------------------------------------------ the wave

    def next_step(self):
        """The wave's next stage, or None once its last stage is completed (the record is
        marked completed then: go on to the next wave)."""
        if self.record["stage"]["status"] == "completed" and rollout.is_last_stage(self.record):
            self.apply([{"action": "completed"}])
            return None
        return self._write()

    def reconcile(self, observed):
        """Plan the wave once a run, apply a person's request once a run, stop at a wave
        that is stopped, else the stage's next instruction (None: the wave is completed)."""
        if self.wave not in self.run["planned"]:
            self.plan()
        summary = rollout.summary(self.record, self.now)
        if not self.run["request_applied"] and summary["outcome"] in ("running", "paused"):
            self.run["request_applied"] = True
            requested = rollout_steps.on_request(self.settings.request, self.wave_id, self.wave)
            self.apply(requested["changes"])
            if requested["halt"]:
                return self._stop(requested["halt"])
            if requested["rollback"]:
                return self._rollback(requested["rollback"])
            summary = rollout.summary(self.record, self.now)
        # What this run's last act saw comes first: a hold that a pause or a fence raised
        # elsewhere ended stops with the gates' own reason, not as a wave found stopped.
        last = self.run["last"]
        if (
            last.get("kind") in STAGE_ACTS
            and last.get("wave") == self.wave
            and last.get("stage") == self.record["stage"]["index"]
        ):
            return self._after_last_act(observed)
        stopped = rollout_steps.at_wave(summary, self.wave_id, self.wave)
        if stopped["halt"]:
            return self._stop(stopped["halt"])
        if self.record["outcome"] == "completed":
            return None
        return self.next_step()

    def wave_done(self):
        """The wave's line in the run's report; its nodes get the completed record."""
        entry = dict(rollout.summary(self.record, self.now))
        entry["wave"] = self.wave
        self.run["waves"].append(entry)
        self.run["last"] = {}
        return self._copy()


def rollback_halt(last, report):
    """How the run stops after its rollback (the report of rollback_report.yml)."""
    kind = last["rollback"]["kind"]
    reason = last["rollback"]["reason"]
    confirmed = int(report.get("nodes_confirmed") or 0)
    total = int(report.get("nodes_total") or 0)
    message = (
        "Rollout %s %s: %s. Fast rollback: %s/%s nodes confirmed at weight 0 in %s s "
        "(budget %s s); unreachable %s, not confirmed %s."
        % (
            last.get("wave_id"),
            "rolled back" if kind == "rolled_back" else "aborted",
            reason,
            confirmed,
            total,
            report.get("wall_time_s"),
            report.get("budget_s"),
            report.get("unreachable"),
            report.get("not_confirmed"),
        )
    )
    return rollout_steps.halt(
        kind, kind == "rolled_back" or confirmed < total, last.get("wave"), message
    )
