# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A rollout's history as events in the rollout store: one structured event per transition.

Every event is a small JSON document: type, at, rollout_id, wave, stage (1-based), weight,
nodes, reason, actor and detail. An event of a record's cohort stage (weight 0, only the
clients of its source CIDRs on the direct path) has the cohort in its detail, and its line
says "cohort (N prefixes) at 0%" where another stage's says its weight. Two kinds of writer
make them:

- a record write (rollout_records.StoreRecords.write) turns the wave's new transitions
  into events and puts them in the same etcd transaction as the record, so the
  history can never miss a transition nor show one that did not happen;
- the gate evaluator (canary_gate) emits a change of gate verdicts as it sees one, and the
  playbooks emit the acts that are not record transitions (a fleet rollback with its
  measured time, a split measured, an engine upgrade, a drill).

Keys: events/<rollout_id>/<wave>.<revision>.<n> for a wave's events (the record's revision
the write replaced, unique because the write is a compare-and-swap), and
events/<rollout_id>/~<time_ns>.<random> for emitted ones; events of no one rollout (a
fleet-wide rollback) use the rollout id FLEET, which no rollout id can take.
Order is the store's own: the revision each event was created at.
"""

from __future__ import annotations

import binascii
import json
import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.cohorts import (
    format_cohort,
    schedule_cohort,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

FLEET = "_fleet"

# Event type: what it says. The order is a rollout's usual order.
EVENT_TYPES = {
    "started": "a wave's rollout was planned (new, or restarted)",
    "gates_changed": "the gates of a running rollout were replaced",
    "epoch_taken": "a rollout carried on under a newer fence epoch, on purpose",
    "stage_started": "a stage began: its weight is being written to the nodes",
    "weight_confirmed": "nodes read back the stage's weight",
    "split_verified": "the measured split of every node agrees with its weight",
    "split_off": "the measured split of a node disagrees with its weight",
    "hold_started": "the stage's hold began",
    "gate_verdicts_changed": "a gate's verdict differs from its last evaluation in the stage",
    "hold_done": "the stage's hold passed and the stage is complete",
    "promoted": "a person skipped the rest of a hold (or every stage: promote --full)",
    "paused": "the rollout was paused, by a person or by gates that could not decide",
    "resumed": "a person resumed the rollout",
    "aborted": "a person aborted the rollout",
    "rolled_back": "the rollout's own runner rolled back after a gate failed",
    "completed": "the wave reached its last stage and is done",
    "stuck": "a running wave had no progress and no runner past its progress deadline",
    "fleet_rolled_back": "a fleet rollback (fast or deep) finished, with its measured time",
    "engine_upgraded": "an engine was replaced by socket swap",
    "engine_swapped_back": "an engine upgrade was undone: the old engine serves again",
    "drill_finished": "a rollback drill finished, passed or failed",
    "notification_test": "a test event (zerolayer notifications test): every sink gets it",
}

TRANSITION_TYPES = {
    "plan": "started",
    "gates_changed": "gates_changed",
    "epoch_taken": "epoch_taken",
    "stage_started": "stage_started",
    "weight_confirmed": "weight_confirmed",
    "split_measured": "split_verified",
    "hold_started": "hold_started",
    "stage_completed": "hold_done",
    "promote": "promoted",
    "promote_full": "promoted",
    "pause": "paused",
    "resume": "resumed",
    "abort": "aborted",
    "rolled_back": "rolled_back",
    "completed": "completed",
}

# Transition fields that are the event's own fields, not its detail.
_TRANSITION_FIELDS = ("action", "at", "by", "stage", "outcome", "reason", "nodes", "weight")


def validate_event_type(value, field="type"):
    if value not in EVENT_TYPES:
        raise FleetError(
            "%s must be one of %s; got %r" % (field, ", ".join(EVENT_TYPES), value),
            {"field": field, "value": value},
        )
    return value


def _weight_of(record, index):
    schedule = record.get("schedule") or []
    if isinstance(index, int) and 0 <= index < len(schedule):
        return schedule[index].get("weight")
    return None


def event(
    kind,
    rollout_id,
    at,
    actor,
    wave=None,
    stage=None,
    weight=None,
    nodes=None,
    reason=None,
    **detail,
):
    """One event; stage is 1-based (as people count stages), None when it has none."""
    validate_event_type(kind)
    return {
        "type": kind,
        "at": at,
        "rollout_id": rollout_id,
        "wave": wave,
        "stage": stage,
        "weight": weight,
        "nodes": sorted(nodes) if nodes else [],
        "reason": reason,
        "actor": actor,
        "detail": {key: value for key, value in detail.items() if value is not None},
    }


def _canonical(entry):
    return json.dumps(entry, sort_keys=True)


def _from_transition(record, rollout_id, wave, transition):
    index = transition.get("stage")
    nodes = transition.get("nodes") or []
    detail = {k: v for k, v in transition.items() if k not in _TRANSITION_FIELDS}
    detail["outcome"] = transition.get("outcome")
    if transition.get("action") == "promote_full":
        detail["full"] = True
    # A cohort stage's weight is 0: the event says which clients went direct all the same.
    cohort = schedule_cohort(record.get("schedule"), index)
    if cohort:
        detail.setdefault("cohort", cohort)
    kind = TRANSITION_TYPES[transition["action"]]
    if kind == "split_verified" and transition.get("off"):
        kind = "split_off"
    return event(
        kind,
        rollout_id,
        transition.get("at"),
        transition.get("by"),
        wave=wave,
        stage=index + 1 if isinstance(index, int) else None,
        weight=_weight_of(record, index),
        nodes=nodes,
        reason=transition.get("reason"),
        **detail,
    )


def verdicts_changed(record_key, stage, weight, previous, evaluation, at, actor):
    """The gate_verdicts_changed event of one gate evaluation, or None when nothing changed.

    previous: {gate: verdict} of the stage's evaluation before (None: this is its first);
    evaluation: {"gates": {gate: verdict}, "verdict", "decision", "reason"}.
    """
    gates = evaluation.get("gates") or {}
    if previous == gates:
        return None
    rollout_id, wave = record_key.split("/", 1)
    before = previous or {}
    return event(
        "gate_verdicts_changed",
        rollout_id,
        at,
        actor,
        wave=wave,
        stage=stage,
        weight=weight,
        reason=evaluation.get("reason"),
        gates=gates,
        previous=previous,
        changed=sorted(
            name for name in set(gates) | set(before) if gates.get(name) != before.get(name)
        ),
        verdict=evaluation.get("verdict"),
        decision=evaluation.get("decision"),
    )


def record_events(record_key, before, after):
    """The events of one record write: one per new transition.

    Gate verdicts are not among them: the record keeps only each hold's last evaluation,
    and canary_gate tells of every change as it evaluates (verdicts_changed). The rollout
    id and wave come from the record's key <rollout_id>/<wave> (a canary's record names
    itself <rollout_id>:<wave>).
    """
    if not after:
        return []
    rollout_id, wave = record_key.split("/", 1)
    fresh_record = not before or before.get("created_at") != after.get("created_at")
    old_transitions = set() if fresh_record else {_canonical(t) for t in before["transitions"]}
    return [
        _from_transition(after, rollout_id, wave, transition)
        for transition in after.get("transitions") or []
        if transition.get("action") in TRANSITION_TYPES
        and _canonical(transition) not in old_transitions
    ]


def record_event_keys(store, record_key, base_revision, events):
    """[(key, event)] for the events of a write that replaces base_revision of record_key."""
    rollout_id, wave = record_key.split("/", 1)
    return [
        (store.key("events", rollout_id, "%s.%012d.%03d" % (wave, base_revision, n)), entry)
        for n, entry in enumerate(events)
    ]


def emit(store, entry):
    """Put one event that no record write makes; returns it."""
    validate_event_type(entry.get("type"))
    name = "~%d.%s" % (time.time_ns(), binascii.hexlify(os.urandom(4)).decode())
    store.client.put(store.key("events", entry.get("rollout_id") or FLEET, name), json.dumps(entry))
    return entry


def list_events(store, rollout_id=None, with_fleet=True):
    """Events oldest first: of one rollout (and the fleet's, within its span) or of all."""
    prefix = store.key("events", rollout_id, "") if rollout_id else store.key("events", "")
    found = [(kv.create_revision, kv.key, kv.json()) for kv in store.client.get_prefix(prefix)]
    if rollout_id and with_fleet and found:
        first = min(revision for revision, _key, _entry in found)
        found.extend(
            (kv.create_revision, kv.key, kv.json())
            for kv in store.client.get_prefix(store.key("events", FLEET, ""))
            if kv.create_revision > first
        )
    return [entry for _revision, _key, entry in sorted(found, key=lambda item: item[:2])]


def summary_line(entry):
    """One line a person reads: what happened, where, why, by whom."""
    where = [entry.get("rollout_id") or "fleet"]
    if entry.get("wave"):
        where.append("wave %s" % entry["wave"])
    if entry.get("stage"):
        where.append("stage %s" % entry["stage"])
    detail = entry.get("detail") or {}
    cohort = detail.get("cohort") if isinstance(detail.get("cohort"), list) else None
    if cohort:
        where.append("%s at %s%%" % (format_cohort(cohort), entry.get("weight") or 0))
    elif entry.get("weight") is not None:
        where.append("%s%%" % entry["weight"])
    line = "%s: %s" % (entry["type"].replace("_", " "), ", ".join(where))
    if detail.get("mode"):
        line += " (%s" % detail["mode"]
        if detail.get("seconds") is not None:
            line += ", %.2f s" % detail["seconds"]
        line += ")"
    if entry.get("nodes"):
        shown = entry["nodes"][:5]
        more = len(entry["nodes"]) - len(shown)
        line += "; nodes %s%s" % (", ".join(shown), " and %d more" % more if more > 0 else "")
    if entry.get("reason"):
        line += "; %s" % entry["reason"]
    if entry.get("actor"):
        line += " [by %s]" % entry["actor"]
    return line
