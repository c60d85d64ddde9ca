# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Each node's line in a rollback report: confirmed by its watcher's acknowledgement, by the
push, or not at all.

Built once on the controller from the acknowledgements counted and the results of the push
(which reached only the nodes that did not acknowledge), so the work per acknowledged node is
a dict, not an Ansible task.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError

MODES = ("fast", "deep")
NO_RESULT = "no result: the node left the run before the rollback"


def by_watcher(node, ack, mode):
    """A node's entry from its fence watcher's acknowledgement (rollout_store.acknowledged)."""
    seen = ack.get("read_back") if isinstance(ack.get("read_back"), dict) else {}
    entry = {
        "node": node,
        "reached": True,
        "confirmed": True,
        "confirmed_by": "watcher",
        # The controller's own clock: seconds from the start of the count to the ack seen.
        "seen_after_s": ack.get("seen_after_s"),
        "fence_epoch": seen.get("node_epoch"),
        # The node's own clock: how long it took from the fence seen to the ack written.
        "node_elapsed_ms": ack.get("took_ms"),
        "error": None,
    }
    if mode == "deep":
        entry.update(
            router_removed=seen.get("attached") is False,
            # None: the node names no proxy unit; its ports were still asked.
            proxy_running=seen.get("proxy_running"),
            paths=seen.get("paths") if isinstance(seen.get("paths"), dict) else {},
        )
    else:
        weights = seen.get("weights_bp") if isinstance(seen.get("weights_bp"), dict) else {}
        entry["routes"] = [
            {"route": name, "weight_bp": weight} for name, weight in sorted(weights.items())
        ]
    return entry


def node_confirmations(targets, acked, pushed, mode):
    """One entry per target, in the targets' order.

    acked: {node: ack} counted from the store; pushed: {node: entry or None} from the push
    (an entry the push task noted, None where it noted nothing: the node left the run).
    """
    if mode not in MODES:
        raise FleetError(
            "mode must be one of %s; got %r" % (", ".join(MODES), mode), {"field": "mode"}
        )
    entries = []
    for node in targets:
        if node in (acked or {}):
            entries.append(by_watcher(node, acked[node], mode))
        elif (pushed or {}).get(node):
            entries.append(pushed[node])
        else:
            entries.append({"node": node, "reached": False, "confirmed": False, "error": NO_RESULT})
    return entries
