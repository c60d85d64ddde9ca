# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""What a running canary checks before each step: its record, and the fleet's fence.

An operator's pause (from another shell, AWX, or the command line) lands in the rollout's
record; a rollback or abort raises the fence in the rollout store. The runner reads both
at every gate evaluation and before it writes, so a decision made elsewhere is honoured
within one gate interval, and never undone by a hold that ends afterwards.

The runner's own lease on the rollout scope is read at the same time: a runner whose
heartbeat could not renew it (a partition longer than the TTL, a stalled controller) may
have lost the scope to a second runner, and must not learn that only at its next write.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import OwnerLost

# Decisions that end the runner's hold without a gate evaluation and stop it there.
STOPS = ("paused", "stopped", "fenced", "moved", "owner_lost")


def read_record(records):
    """(record, None), or (None, stop) when the store cannot be read; (None, None) without
    records or before the first write."""
    if records is None:
        return None, None
    try:
        record, _token = records.read()
    except StoreUnavailable as exc:
        return None, ("store_unreachable", exc.message)
    return record, None


def record_standing(record, stage=None):
    """(decision, reason) when the record says the rollout no longer runs, else None."""
    if record is None:
        return None
    if record["outcome"] == "paused" or record.get("paused"):
        last = next((t for t in reversed(record["transitions"]) if t["action"] == "pause"), {})
        return (
            "paused",
            "paused by %s at %s: %s"
            % (last.get("by", "someone"), last.get("at", "?"), record.get("pause_reason")),
        )
    if record["outcome"] in rollout.FINISHED:
        return ("stopped", "the rollout is %s" % record["outcome"])
    if stage is not None and record["stage"]["index"] != stage:
        last = record["transitions"][-1]
        return (
            "moved",
            "%s by %s at %s moved the rollout to stage %d; run canary.yml to carry on from there"
            % (
                last["action"],
                last.get("by", "someone"),
                last.get("at", "?"),
                record["stage"]["index"] + 1,
            ),
        )
    if stage is not None and record["stage"]["status"] == "completed":
        last = record["transitions"][-1]
        return (
            "complete",
            "%s by %s at %s ended the hold"
            % (last["action"], last.get("by", "someone"), last.get("at", "?")),
        )
    return None


def fence_standing(store, epoch):
    """(decision, reason) when the fleet's fence rose above epoch, or the store is gone."""
    if store is None or epoch is None:
        return None
    try:
        fence = store.fence()
    except StoreUnavailable as exc:
        return ("store_unreachable", exc.message)
    if fence["epoch"] > epoch:
        return (
            "fenced",
            "the fleet's fence epoch rose from %d to %d (%s by %s at %s: %s); this runner "
            "writes nothing more"
            % (
                epoch,
                fence["epoch"],
                fence.get("action", "rollback"),
                fence.get("actor", "someone"),
                fence.get("at", "?"),
                fence.get("reason", ""),
            ),
        )
    return None


def owner_standing(store, scope, lease):
    """(decision, reason) when this runner's lease no longer holds scope, or the store is gone."""
    if store is None or scope is None or lease is None:
        return None
    try:
        store.confirm_owner(scope, lease)
    except OwnerLost as exc:
        return ("owner_lost", exc.message)
    except StoreUnavailable as exc:
        return ("store_unreachable", exc.message)
    return None


def standing_and_record(records, store, epoch, stage=None, owner=None):
    """(stop, record): stop is the first reason to stop, to end the hold (a person promoted
    it), or to wait for the store, None to go on; record is the wave's record as read (None
    when it was not read). stage is the index the runner holds; owner, (scope, lease) of
    this runner when it took the scope."""
    scope, lease = owner or (None, None)
    stop = fence_standing(store, epoch) or owner_standing(store, scope, lease)
    if stop is not None:
        return stop, None
    record, unreadable = read_record(records)
    return unreadable or record_standing(record, stage), record
