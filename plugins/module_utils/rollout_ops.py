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

from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.gates import utc_now
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_records import (
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
    rollout.validate_rollout_id(rollout_id)
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


def _wave_status(record, fence_epoch, now):
    summary = rollout.summary(record, now)
    taken = record.get("fence_epoch")
    summary["fence_epoch_taken"] = taken
    summary["fenced"] = (
        taken is not None and taken < fence_epoch and record["outcome"] not in rollout.FINISHED
    )
    summary["nodes"] = record.get("nodes", {})
    # The current stage's measured split per node, where the runner measured one.
    summary["splits"] = (record.get("splits") or {}).get(str(record["stage"]["index"]), {})
    last = record["verdicts"][-1] if record["verdicts"] else {}
    summary["last_reason"] = last.get("reason")
    gates = last.get("gates") or {}
    # The record keeps {gate: verdict}; a raw canary_gate result has a list of gate results.
    if isinstance(gates, list):
        gates = {gate.get("name"): gate.get("verdict") for gate in gates if isinstance(gate, dict)}
    summary["last_gates"] = dict(gates)
    return summary


def status(store, rollout_id=None, scope=None):
    """The fence, the owners and every wave's standing (of one rollout, or of all)."""
    now = utc_now()
    fence = store.fence()
    ids = [rollout_id] if rollout_id else rollout_ids(store)
    rollouts = {}
    for one in ids:
        waves = waves_of(store, one)
        rollouts[one] = {
            wave: _wave_status(record, fence["epoch"], now)
            for wave, record in sorted(waves.items())
        }
    owners = {}
    for kv in store.client.get_prefix(store.key("owners", "")):
        holder = kv.json()
        holder["ttl_left_s"] = store.client.lease_ttl(kv.lease) if kv.lease else -1
        owners[kv.key[len(store.key("owners", "")) :]] = holder
    if scope is not None:
        owners = {name: holder for name, holder in owners.items() if name == scope}
    return {"fence": fence, "owners": owners, "rollouts": rollouts}


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
    return {"fence": fence, "waves": marked}


def history(store, rollout_id):
    """Every transition of every wave, oldest first: who did what, when, why."""
    entries = []
    for name, record in waves_of(store, rollout_id).items():
        for transition in record["transitions"]:
            entries.append(dict(transition, wave=name))
    return sorted(entries, key=lambda entry: (entry.get("at", ""), entry["wave"]))
