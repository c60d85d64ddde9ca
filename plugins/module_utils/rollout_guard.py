# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""What a running canary checks before each step: its record, and the fleet's fence.

An operator's pause (from another shell, AWX, or the command line) lands in the rollout's
record; a rollback or abort raises the fence in the rollout store. The runner reads both
at every gate evaluation and before it writes, so a decision made elsewhere is honoured
within one gate interval, and never undone by a hold that ends afterwards.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.etcd_v3 import StoreUnavailable

# Decisions that end the runner's hold without a gate evaluation.
STOPS = ("paused", "stopped", "fenced")


def record_standing(record_path):
    """(decision, reason) when the record says the rollout no longer runs, else None."""
    if not record_path:
        return None
    record = rollout.read_record(record_path)
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


def standing(record_path, store, epoch):
    """The first reason to stop (or to wait for the store), or None to go on."""
    return fence_standing(store, epoch) or record_standing(record_path)
