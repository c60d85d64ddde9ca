# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A person's actions on a rollout, as writes to the rollout store.

status, pause, resume, promote, promote --full, abort and history act on the records of
one rollout id (one record per wave, rollouts/<id>/<wave>) and on the fleet's fence. The
runner re-reads its record and the fence at every gate evaluation, so what is done here is
honoured within one gate interval. Each function checks everything before it writes, and
every record write is a compare-and-swap (rollout_records.StoreRecords).

Outcomes are FleetError details["outcome"]: "bad_input" (unknown id or wave, a bad
argument), "refused" (the rollout's state forbids it: promote on a finished rollout, resume
of a fenced one), "unreachable" (the store). The command line turns them into exit codes.
"""

from __future__ import annotations

import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    parse_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
    list_records,
)

ACTIONS = ("status", "pause", "resume", "promote", "promote_full", "abort", "history")


def _bad(message, field):
    return FleetError(message, {"field": field, "outcome": "bad_input"})


def _refused(message, field="action"):
    return FleetError(message, {"field": field, "outcome": "refused"})


def rollout_ids(store):
    return sorted({name.split("/", 1)[0] for name in list_records(store)})


def waves_of(store, rollout_id, wave=None):
    """{wave: record} of rollout_id; unknown ids and waves are refused, naming the known."""
    record_codec.validate_rollout_id(rollout_id)
    found = {
        name.split("/", 1)[1]: record for name, record in list_records(store, rollout_id).items()
    }
    if not found:
        known = ", ".join(rollout_ids(store)) or "none"
        raise _bad(
            "rollout_id %r is not a known rollout (known: %s); nothing was changed"
            % (rollout_id, known),
            "rollout_id",
        )
    if wave is not None:
        if wave not in found:
            raise _bad(
                "wave %r is not a wave of rollout %s (its waves: %s); nothing was changed"
                % (wave, rollout_id, ", ".join(sorted(found))),
                "wave",
            )
        found = {wave: found[wave]}
    return found


def _wave_status(record, fence, now, owned=False):
    """One wave's standing; owned: a live runner holds a scope for its rollout."""
    summary = rollout.summary(record, now)
    taken = record.get("fence_epoch")
    summary["fence_epoch_taken"] = taken
    superseded = taken is not None and taken < fence["epoch"]
    summary["fenced"] = superseded and record["outcome"] not in rollout.FINISHED
    # A completed rollout's nodes went back to the proxy when a rollback raised the fence
    # above its epoch (every node's watcher zeroes every route): not "completed 100 %".
    summary["rolled_back_by"] = (
        _fence_summary(fence)
        if superseded and record["outcome"] == "completed"
        else _marked_rollback(record)
    )
    summary["created_at"] = record.get("created_at")
    summary["nodes"] = record.get("nodes", {})
    # The current stage's measured split per node, where the runner measured one.
    summary["splits"] = (record.get("splits") or {}).get(str(record["stage"]["index"]), {})
    # The schedule, and the current stage's cohort ([] for a stage by weight, and for a record
    # from before cohort stages): what status shows of a cohort stage.
    summary["schedule"] = record["schedule"]
    summary["cohort"] = list(rollout.current_stage(record).get("cohort") or [])
    last = record["verdicts"][-1] if record["verdicts"] else {}
    summary["last_reason"] = last.get("reason")
    gates = last.get("gates") or {}
    # The record keeps {gate: verdict}; a raw canary_gate result has a list of gate results.
    if isinstance(gates, list):
        gates = {gate.get("name"): gate.get("verdict") for gate in gates if isinstance(gate, dict)}
    summary["last_gates"] = dict(gates)
    summary["progress"] = rollout.progress_state(record, owned, now, fence["epoch"])
    return summary


def _marked_rollback(record):
    """The fence of the rollback that marked this record (mark_rolled_back keeps its epoch in
    the details), in _fence_summary's form; None for a record not marked so."""
    rollback = record.get("rollback") or {}
    details = rollback.get("details") or {}
    try:
        epoch = int(details.get("fence_epoch"))
    except (TypeError, ValueError):
        return None
    return {
        "epoch": epoch,
        "action": details.get("mode"),
        "actor": rollback.get("by"),
        "at": rollback.get("at"),
        "reason": rollback.get("reason"),
    }


def _fence_summary(fence):
    return {key: fence.get(key) for key in ("epoch", "action", "actor", "at", "reason")}


def in_progress(waves):
    """Whether any wave of a rollout ({wave: status}) is neither finished nor fenced."""
    return any(
        row["outcome"] not in rollout.FINISHED and not row["fenced"] for row in waves.values()
    )


def _rollouts_status(store, fence, now, rollout_id=None, owned=frozenset()):
    """{rollout_id: {wave: standing}} of one rollout (unknown ids refused, naming the known),
    or of every rollout, from one read of the records."""
    if rollout_id:
        found = {rollout_id: waves_of(store, rollout_id)}
    else:
        found = {}
        for name, record in list_records(store).items():
            one, wave = name.split("/", 1)
            found.setdefault(one, {})[wave] = record
    return {
        one: {
            wave: _wave_status(record, fence, now, one in owned)
            for wave, record in sorted(waves.items())
        }
        for one, waves in sorted(found.items())
    }


def status(store, rollout_id=None, scope=None):
    """The fence, the owners and every wave's standing: of one rollout, or of every rollout
    in progress (the finished ones are counted; rollouts() lists them)."""
    now = utc_now()
    fence = store.fence()
    owners = {}
    for kv in store.client.get_prefix(store.key("owners", "")):
        holder = kv.json()
        holder["ttl_left_s"] = store.client.lease_ttl(kv.lease) if kv.lease else -1
        owners[kv.key[len(store.key("owners", "")) :]] = holder
    # A live owner holds the rollout: no wave of it is stuck, whatever its last write.
    owned = {h.get("rollout_id") for h in owners.values() if h["ttl_left_s"] >= 0}
    every = _rollouts_status(store, fence, now, rollout_id, owned)
    if rollout_id:
        rollouts, finished = every, None
    else:
        rollouts = {one: waves for one, waves in every.items() if in_progress(waves)}
        finished = len(every) - len(rollouts)
    if scope is not None:
        owners = {name: holder for name, holder in owners.items() if name == scope}
    _add_nodes_after_rollback(store, fence, rollouts)
    _add_live_weights(store, rollouts)
    report = {"fence": fence, "owners": owners, "rollouts": rollouts}
    if finished is not None:
        report["finished_rollouts"] = finished
    return report


def _add_nodes_after_rollback(store, fence, rollouts):
    """For each rolled-back wave, what its nodes' fence watchers acknowledged of the fence
    that rolled it back: the weights they read back then (0 when it took), or unconfirmed."""
    rows = [row for waves in rollouts.values() for row in waves.values() if row["rolled_back_by"]]
    if not rows:
        return
    nodes = {node for row in rows for node in row["nodes"]}
    acks = store.acknowledged(fence["epoch"], nodes)
    for row in rows:
        row["nodes_after_rollback"] = {
            node: (
                {
                    "confirmed": True,
                    "epoch": acks[node]["epoch"],
                    "weights_bp": (acks[node].get("read_back") or {}).get("weights_bp"),
                }
                if node in acks
                else {"confirmed": False}
            )
            for node in sorted(row["nodes"])
        }


def _add_live_weights(store, rollouts):
    """Beside each wave's recorded weight per node, the weights the node has now, as its
    fence watcher last read it (store.live_readings). Judged only for a wave in progress
    (running or paused, not fenced), against the record's weight: once a wave finished or
    was fenced, a later rollout may own its nodes, and whether its rollback took is what
    nodes_after_rollback says."""
    nodes = {node for waves in rollouts.values() for row in waves.values() for node in row["nodes"]}
    readings = store.live_readings(nodes) if nodes else {}
    now = time.time()
    for waves in rollouts.values():
        for row in waves.values():
            judged = row["outcome"] not in rollout.FINISHED and not row["fenced"]
            row["live"] = {
                node: _live_entry(
                    readings.get(node), entry.get("weight_bp") if judged else None, now
                )
                for node, entry in sorted(row["nodes"].items())
            }


def _live_entry(reading, expected_bp, now):
    """{weights_bp, node_epoch, attached, read_at_unix, age_s, differs}; weights_bp None for a
    node with no live watcher. differs: None where not judged (expected_bp None, or nothing
    read: a node that says nothing never agrees), else whether a route is off expected_bp."""
    if reading is None:
        return {"weights_bp": None, "differs": None}
    weights = reading["weights_bp"]
    at = reading.get("at_unix")
    return {
        "weights_bp": weights,
        "node_epoch": reading.get("node_epoch"),
        "attached": reading.get("attached"),
        "read_at_unix": at,
        "age_s": round(now - at, 1) if isinstance(at, (int, float)) else None,
        "differs": None
        if expected_bp is None
        else any(weight != expected_bp for weight in weights.values()),
    }


def rollouts(store, limit=20, since=None):
    """Every rollout, newest first (by its first wave's creation): one row each with its
    overall standing; at most limit rows, none created before since (a datetime)."""
    now = utc_now()
    fence = store.fence()
    rows = []
    for one, waves in _rollouts_status(store, fence, now).items():
        created = min((row["created_at"] or "") for row in waves.values())
        if since is not None and created and parse_timestamp(created, "created_at") < since:
            continue
        rows.append(rollout_row(one, waves, created))
    rows.sort(key=lambda row: row["created_at"] or "", reverse=True)
    return {"fence": fence, "rollouts": rows[:limit], "total": len(rows)}


def rollout_row(rollout_id, waves, created):
    """One rollout's row of the list, from its waves' status rows (_wave_status)."""
    taken = [row["fence_epoch_taken"] for row in waves.values()]
    rolled_back = [row["rolled_back_by"] for row in waves.values() if row["rolled_back_by"]]
    weight = max(row["weight"] for row in waves.values())
    return {
        "rollout_id": rollout_id,
        "standing": _standing(waves),
        "created_at": created or None,
        "updated_at": max((row["updated_at"] or "") for row in waves.values()) or None,
        "weight": weight,
        # At weight 0 a wave at its cohort stage still sends its cohort direct: say so,
        # not a bare 0 that reads as "nothing moved yet".
        "cohort": weight == 0 and any(row.get("cohort") for row in waves.values()),
        "waves": {wave: row["outcome"] for wave, row in waves.items()},
        "fence_epoch_taken": min((e for e in taken if e is not None), default=None),
        "rolled_back_by": rolled_back[0] if rolled_back else None,
    }


def _standing(waves):
    """One word for a rollout: in progress, paused, fenced, or how it ended."""
    if in_progress(waves):
        return "paused" if any(row["paused"] for row in waves.values()) else "in progress"
    if any(row["fenced"] for row in waves.values()):
        return "fenced"
    if any(row["rolled_back_by"] for row in waves.values()):
        return "rolled back"
    outcomes = {row["outcome"] for row in waves.values()}
    for ended in ("aborted", "rolled_back", "completed"):
        if ended in outcomes:
            return ended.replace("_", " ")
    return "/".join(sorted(outcomes))


def _apply_to_waves(store, rollout_id, wave, action, reason, actor, choose):
    """Apply action to the waves choose() picks; every check first, then the writes."""
    now = utc_now()
    waves = waves_of(store, rollout_id, wave)
    planned = []
    for name, _record in sorted(waves.items()):
        records = StoreRecords(store, "%s/%s" % (rollout_id, name))
        record, token = records.read()
        if not choose(name, record):
            continue
        try:
            after, changed = rollout.apply(record, action, {"reason": reason}, now, actor)
        except FleetError as exc:
            raise _refused("%s of wave %s refused: %s" % (action, name, exc.message)) from None
        planned.append((name, records, after, token, changed))
    if not planned:
        raise _refused(
            "%s refused: no wave of rollout %s is in a state that takes it (%s); nothing was "
            "changed"
            % (
                action,
                rollout_id,
                ", ".join("%s %s" % (n, r["outcome"]) for n, r in sorted(waves.items())),
            )
        )
    done = {}
    for name, records, after, token, changed in planned:
        events = records.write(after, token) if changed else []
        done[name] = {"changed": changed, "outcome": after["outcome"], "events": events}
    return done


def events_of(waves):
    """The events the writes of an action stored, every wave's, oldest first."""
    found = [entry for wave in waves.values() for entry in wave.get("events") or []]
    return sorted(found, key=lambda entry: entry.get("at") or "")


def _active(_name, record):
    return record["outcome"] not in rollout.FINISHED


def pause(store, rollout_id, reason, actor, wave=None):
    """Pause every wave in progress: the runner stops within one gate interval."""
    return _apply_to_waves(store, rollout_id, wave, "pause", reason, actor, _active)


def _first_active(store, rollout_id, wave):
    """The wave a runner works on: the named one, else the first not finished."""
    if wave is not None:
        return wave
    waves = waves_of(store, rollout_id)
    for name, record in sorted(waves.items(), key=lambda item: item[1]["created_at"]):
        if record["outcome"] not in rollout.FINISHED:
            return name
    raise _refused(
        "rollout %s has no wave in progress (%s); start a new rollout instead"
        % (rollout_id, ", ".join("%s %s" % (n, r["outcome"]) for n, r in sorted(waves.items())))
    )


def resume(store, rollout_id, reason, actor, wave=None):
    """Clear a pause. A rollout fenced by a rollback since it started is refused."""
    fence = store.fence()
    for name, record in waves_of(store, rollout_id, wave).items():
        taken = record.get("fence_epoch")
        if (
            taken is not None
            and taken < fence["epoch"]
            and record["outcome"] not in rollout.FINISHED
        ):
            raise _refused(
                "resume refused: wave %s of rollout %s took fence epoch %d, the fleet's fence is "
                "now %d (%s by %s at %s). Its nodes are fenced; nothing was changed. Start a new "
                "rollout, or run canary.yml with -e canary_take_epoch=true to carry on on purpose."
                % (
                    name,
                    rollout_id,
                    taken,
                    fence["epoch"],
                    fence.get("action"),
                    fence.get("actor"),
                    fence.get("at"),
                ),
                "epoch",
            )
    return _apply_to_waves(
        store, rollout_id, wave, "resume", reason, actor, lambda _n, r: r["paused"]
    )


def promote(store, rollout_id, reason, actor, full=False, wave=None):
    """End the current hold of the wave in progress (full: go to 100 % on every wave)."""
    if full:
        return _apply_to_waves(store, rollout_id, wave, "promote_full", reason, actor, _active)
    target = _first_active(store, rollout_id, wave)
    return _apply_to_waves(store, rollout_id, target, "promote", reason, actor, _active)


def abort(store, rollout_id, reason, actor):
    """The fence first (no node can be raised after this), then every wave marked aborted.

    Returns the raised fence; pushing weight 0 to the nodes is the caller's next step
    (rollback.yml with rollback_fence_epoch, or the nodes' own watchers).
    """
    waves = waves_of(store, rollout_id)
    fence = store.raise_fence("abort", "%s: %s" % (rollout_id, reason), actor)
    now = utc_now()
    marked = {}
    for name in sorted(waves):
        records = StoreRecords(store, "%s/%s" % (rollout_id, name))
        record, token = records.read()
        if record["outcome"] in rollout.FINISHED:
            marked[name] = {"changed": False, "outcome": record["outcome"], "events": []}
            continue
        after, changed = rollout.apply(record, "abort", {"reason": reason}, now, actor)
        events = records.write(after, token)
        marked[name] = {"changed": changed, "outcome": after["outcome"], "events": events}
    # The abort's fence takes every node back to the proxy (each watcher zeroes every route):
    # the completed rollouts it superseded read rolled back from now on.
    others = mark_rolled_back(
        store,
        fence["epoch"],
        "abort of %s: %s" % (rollout_id, reason),
        {"mode": "abort", "fence_epoch": fence["epoch"]},
        actor,
    )
    return {"fence": fence, "waves": marked, "completed_rolled_back": others["marked"]}


# A record another actor changes between the read and the write is read again this often.
MARK_ATTEMPTS = 3


def superseded_by(record, fence_epoch):
    """Whether a rollback that raised the fence to fence_epoch took this wave's nodes back to
    the proxy: the wave wrote its weights at an older epoch (every watcher zeroes every route
    at a fast or deep fence, in the wave's scope or not)."""
    taken = record.get("fence_epoch")
    return taken is not None and taken < fence_epoch


def mark_rolled_back(
    store, fence_epoch, reason, details, actor, rollout_id=None, mirror_dir=None, check=False
):
    """Mark rolled back, in the store, the records that a rollback's fence at fence_epoch
    superseded, whichever controller started their rollout (the store is the list of
    records; no controller's files are read):

    - every completed record: its nodes went back to the proxy (every watcher zeroes every
      route), so it must not read "completed 100 %";
    - every record of rollout_id (the rollout the rollback was run for), whatever its state
      (an aborted wave keeps its outcome and gains the rollback).

    A running or paused record of another rollout is left as it is: it reads "fenced", its
    runner stops at its next gate, and it may be resumed on purpose under the new epoch
    (canary_take_epoch), which a rolled-back record may not.

    mirror_dir: the controller's copies (<dir>/<rollout_id>/<wave>.json), rewritten where one
    exists, for its reports. Returns {"marked": [keys], "unchanged": [keys], "not_marked":
    {key: why}}: one record that cannot be written does not stop the others.
    """
    if isinstance(fence_epoch, bool) or not isinstance(fence_epoch, int) or fence_epoch < 1:
        raise _bad(
            "fence_epoch must be a whole number >= 1; got %r" % (fence_epoch,), "fence_epoch"
        )
    if rollout_id is not None:
        record_codec.validate_rollout_id(rollout_id)
    result = {"marked": [], "unchanged": [], "not_marked": {}}
    now = utc_now()
    for key, record in sorted(list_records(store).items()):
        ours = rollout_id is not None and key.split("/", 1)[0] == rollout_id
        if not superseded_by(record, fence_epoch) or not (ours or record["outcome"] == "completed"):
            continue
        mirror = os.path.join(mirror_dir, key + ".json") if mirror_dir else None
        records = StoreRecords(store, key, mirror if mirror and os.path.exists(mirror) else None)
        try:
            changed = _mark_one(records, reason, details, actor, now, check)
        except FleetError as exc:
            result["not_marked"][key] = exc.message
            continue
        result["marked" if changed else "unchanged"].append(key)
    return result


def _mark_one(records, reason, details, actor, now, check):
    for attempt in range(MARK_ATTEMPTS):
        record, token = records.read()
        if record is None:  # removed since the list was read
            return False
        after, changed = rollout.apply(
            record, "rolled_back", {"reason": reason, "details": details}, now, actor
        )
        if not changed or check:
            return changed
        try:
            records.write(after, token)
            return True
        except FleetError:
            if attempt == MARK_ATTEMPTS - 1:
                raise
    return False


def history(store, rollout_id):
    """Every transition of every wave, oldest first: who did what, when, why."""
    entries = []
    for name, record in waves_of(store, rollout_id).items():
        for transition in record["transitions"]:
            entries.append(dict(transition, wave=name))
    return sorted(entries, key=lambda entry: (entry.get("at", ""), entry["wave"]))
