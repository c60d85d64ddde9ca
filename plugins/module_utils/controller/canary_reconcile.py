# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""One reconcile step of the canary, as the canary_reconcile action makes it.

Reads the record of the wave the run is at, once, from where it lives (the store, or a file
without one), lets rollout/reconcile.py decide the record's changes and the one instruction
that follows, confirms before an instruction that raises traffic that this runner still owns
the rollout scope, writes the record (a compare-and-swap in the store) and hands the events
to the notification sinks. After a rollback it reads every record of the rollout, rolled
back, for the nodes' copies. The controller's layer: it reaches the store and the reports.
"""

from __future__ import annotations

import copy
import os

from ansible.module_utils.parsing.convert_bool import boolean
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import utc_now
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import record_change
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    reconcile,
    rollout,
    rollout_records,
    rollout_steps,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
    store_options,
)

ARGUMENT_SPEC = dict(
    **store_options(required=False),
    rollout_id=dict(type="str", required=True),
    waves=dict(type="list", elements="str", required=True),
    inventory_groups=dict(type="dict", required=True),
    play_hosts=dict(type="list", elements="str", required=True),
    **record_change.PLAN_OPTIONS,
    wave_schedules=dict(type="dict", default={}),
    pause_after_weight=dict(type="float", default=0),
    routes=dict(type="list", elements="str", required=True),
    split=dict(type="dict", required=True),
    request=dict(type="str", choices=list(rollout_steps.REQUESTS), default="run"),
    fence=dict(type="dict", default={}),
    record_dir=dict(type="path", required=True),
    owner_scope=dict(type="str"),
    owner_lease=dict(type="int"),
    run=dict(type="dict"),
    readbacks=dict(type="dict", default={}),
    split_reads=dict(type="dict", default={}),
    verdict=dict(type="dict", default={}),
    rollback_report=dict(type="dict", default={}),
    actor=dict(type="str"),
)
REQUIRED_TOGETHER = [("owner_scope", "owner_lease")]
SPLIT_KEYS = (*rollout_steps.SPLIT_SETTINGS, "poll_s")


def _check_split(split):
    missing = [key for key in SPLIT_KEYS if key not in split]
    if missing:
        raise FleetError(
            "split must give %s; missing %s" % (", ".join(SPLIT_KEYS), ", ".join(missing)),
            {"field": "split"},
        )


class Waves:
    """Where the run's waves and their records are: the nodes of each (its inventory group
    among the play's hosts), the record's key in the store, the controller's copy."""

    def __init__(self, params):
        self.rollout_id = params["rollout_id"]
        self.names = params["waves"]
        self.groups = params["inventory_groups"]
        self.play_hosts = params["play_hosts"]
        self.record_dir = params["record_dir"]
        missing = [wave for wave in self.names if wave not in self.groups]
        if missing:
            raise FleetError(
                "waves must name inventory groups; not groups: %s" % ", ".join(missing),
                {"field": "waves"},
            )

    def nodes(self, wave):
        return [host for host in self.groups.get(wave) or [] if host in self.play_hosts]

    def key(self, wave):
        return "%s/%s" % (self.rollout_id, wave)

    def path(self, wave):
        return os.path.join(self.record_dir, self.rollout_id, wave + ".json")

    def gate_state(self, wave):
        return os.path.join(self.record_dir, self.rollout_id, "gates", wave + ".json")

    def records(self, store, wave):
        if store is None:
            return rollout_records.FileRecords(self.path(wave))
        return rollout_records.StoreRecords(store, self.key(wave), self.path(wave))

    def where(self, wave):
        """What the hold and the report need to find the wave's record."""
        return {
            "wave_id": reconcile.wave_id(self.rollout_id, wave),
            "record_key": self.key(wave),
            "record_path": self.path(wave),
            "gate_state": self.gate_state(wave),
        }

    def all_records(self, store):
        """{wave: record} of every record of the rollout, from the store or the files."""
        if store is None:
            return rollout_records.mirror_copies(os.path.join(self.record_dir, self.rollout_id))
        return {
            name.split("/", 1)[1]: record
            for name, record in rollout_records.list_records(store, self.rollout_id).items()
        }


def _after_rollback(params, waves, run, store):
    """The rollback is done: each node's copy of its wave's record says rolled back too
    (not when the store took no mark: its records say what they said), and the run stops."""
    report = params["rollback_report"]
    copies = []
    if store is None or boolean(report.get("store_updated", False), strict=False):
        for wave, record in sorted(waves.all_records(store).items()):
            nodes = waves.nodes(wave)
            if nodes and record is not None:
                copies.append({"wave": wave, "nodes": nodes, "record": record})
    halt = reconcile.rollback_halt(run["last"], report)
    run["last"] = {"kind": "stop", "wave": run["last"].get("wave")}
    return reconcile.instruction("stop", halt["wave"], halt=halt, copies=copies)


def _abort_without_store(params, run):
    """An abort when the fence could not be read: every node goes back, each fencing
    itself one above its own epoch; no record can be marked."""
    run["request_applied"] = True
    rollback = {
        "kind": "aborted",
        "reason": "aborted by request (canary_action=abort) while the rollout store could not be "
        "read (%s); its records were not updated" % (params["fence"].get("msg") or "").strip(),
    }
    run["last"] = {
        "kind": "rollback",
        "wave": "every wave",
        "wave_id": params["rollout_id"],
        "rollback": rollback,
    }
    return reconcile.instruction(
        "rollback", "every wave", wave_id=params["rollout_id"], rollback=rollback
    )


def run(params, check_mode):
    """The next instruction, with the record changes that led to it written (outside check
    mode); the result also carries `run`, for the next reconcile."""
    _check_split(params["split"])
    now = utc_now()
    actor = params["actor"] or rollout.default_actor()
    waves = Waves(params)
    settings = reconcile.Settings(params)
    run_state = (
        copy.deepcopy(params["run"]) if params["run"] else reconcile.new_run(params["request"])
    )
    store = store_from_params(params) if params["endpoints"] else None
    observed = {
        "readbacks": params["readbacks"],
        "split_reads": params["split_reads"],
        "verdict": params["verdict"],
    }
    touched, events, changed, copies = [], [], False, []
    last = run_state["last"]
    if last.get("kind") == "rollback":
        found = _after_rollback(params, waves, run_state, store)
    elif last.get("kind") in ("stop", "done"):
        raise FleetError(
            "run: the run already ended (%s); start a new one" % last["kind"], {"field": "run"}
        )
    elif (
        store is not None
        and "fence" not in params["fence"]
        and params["request"] == "abort"
        and not run_state["request_applied"]
    ):
        found = _abort_without_store(params, run_state)
    else:
        finished = [entry["wave"] for entry in run_state["waves"]]
        found = None
        for wave in waves.names:
            if wave in finished:
                continue
            records = waves.records(store, wave)
            before, token = records.read()
            step = reconcile.WaveStep(
                wave, waves.nodes(wave), before, settings, run_state, now, actor
            )
            found = step.reconcile(observed)
            if found is not None and found["kind"] == "write" and params["owner_lease"]:
                # A runner whose lease lapsed may have lost the scope to another: it writes
                # neither the record nor a weight.
                store.confirm_owner(params["owner_scope"], params["owner_lease"])
            if step.changed and not check_mode:
                events += records.write(step.record, token)
            changed = changed or step.changed
            touched.append(
                {
                    "wave": wave,
                    "record": step.record,
                    "summary": rollout.summary(step.record, now),
                    "changes": step.changes,
                }
            )
            if found is not None:
                found.update(waves.where(wave))
                break
            copies += step.wave_done()
        if found is None:
            run_state["last"] = {"kind": "done"}
            found = reconcile.instruction("done")
    found["copies"] = copies + found["copies"]
    found["run"] = run_state
    current = touched[-1] if touched else {}
    found.update(
        changed=changed,
        record=current.get("record"),
        summary=current.get("summary"),
        waves=touched,
        events=events,
    )
    if events:
        found["notifications"] = notify.hand_off(store)
    return found
