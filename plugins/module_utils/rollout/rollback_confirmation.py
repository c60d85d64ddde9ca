# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Each node's line in a rollback report: confirmed by its watcher's acknowledgement, by the
push, or not at all.

Built once on the controller from the acknowledgements counted and the results of the push
(which reached only the nodes that did not acknowledge), so the work per acknowledged node is
a dict, not an Ansible task.
"""

from __future__ import annotations

import json

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

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


def by_fast_push(node, result):
    """A node's entry from its fast push: the raw task's result (fast_push.yml), or None.

    The push runs `zerolayer-routectl rollback`, which prints one JSON line; the node is
    confirmed when that call exited 0 and says every route is at weight 0. Built here, once
    for all pushed nodes, instead of a task per node: at 1,000 simulated nodes a per-node
    set_fact cost 3.9 s of the controller for 50 pushed nodes.
    """
    if not isinstance(result, dict) or result.get("skipped"):
        return None
    output = _last_json_line(result.get("stdout"))
    rc = result.get("rc")
    confirmed = rc == 0 and output.get("rolled_back") is True
    error = None
    if not confirmed:
        stderr = result.get("stderr")
        error = (
            (stderr.strip() if isinstance(stderr, str) else "")
            or result.get("msg")
            or "exit status %s" % ("none" if rc is None else rc)
        )
    return {
        "node": node,
        "reached": result.get("unreachable") is not True,
        "confirmed": confirmed,
        "confirmed_by": "push",
        "routes": output.get("routes") if isinstance(output.get("routes"), list) else [],
        "fence_epoch": output.get("fence_epoch"),
        "node_elapsed_ms": output.get("elapsed_ms"),
        "error": error,
    }


def _last_json_line(stdout):
    """The last line of stdout that is a JSON object ({} when there is none)."""
    lines = stdout.splitlines() if isinstance(stdout, str) else []
    for line in reversed(lines):
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def by_push(node, result, mode):
    """A pushed node's entry, or None: fast, from its raw result; deep, deep_push.yml's note."""
    if mode == "fast":
        return by_fast_push(node, result)
    return result if isinstance(result, dict) and result.get("node") == node else None


def node_confirmations(targets, acked, pushed, mode, push_results=None):
    """One entry per target, in the targets' order.

    acked: {node: ack} counted from the store; pushed: {node: entry or None} that a sharded
    push handed back; push_results: {node: what this process's push left}: fast, the raw
    call's result; deep, deep_push.yml's note. A node in none of them did not answer.
    """
    if mode not in MODES:
        raise FleetError(
            "mode must be one of %s; got %r" % (", ".join(MODES), mode), {"field": "mode"}
        )
    entries = []
    for node in targets:
        if node in (acked or {}):
            entries.append(by_watcher(node, acked[node], mode))
            continue
        entry = (pushed or {}).get(node) or by_push(node, (push_results or {}).get(node), mode)
        entries.append(
            entry or {"node": node, "reached": False, "confirmed": False, "error": NO_RESULT}
        )
    return entries


def direct_drains(targets, watcher_reports, push_results, started_at_unix):
    """How the direct connections of pooled clients left each node after the rollback.

    watcher_reports: {node: acks/<node>/direct} (rollout_fence wait_direct); push_results:
    {node: the raw result of `zerolayer-routectl direct --wait S`} for the pushed nodes.
    Returns {"nodes": {node: {by, drained, left, first, drained_after_s,
    after_command_start_s}}, "left": {node: {route: count}}, "unreported": [nodes],
    "slowest_after_command_start_s"}: the time from the rollback command's start to the last
    node without a direct connection (the watcher's own clock; None where a push counted).
    """
    nodes, unreported = {}, []
    for node in targets:
        report = (watcher_reports or {}).get(node)
        by = "watcher"
        if not isinstance(report, dict) or "drained" not in report:
            result = (push_results or {}).get(node)
            report = _last_json_line(result.get("stdout")) if isinstance(result, dict) else {}
            by = "push"
        if "drained" not in report:
            unreported.append(node)
            continue
        after_start = None
        if by == "watcher" and report["drained"] and isinstance(report.get("at_unix"), float):
            after_start = round(report["at_unix"] - float(started_at_unix), 3)
        nodes[node] = {
            "by": by,
            "drained": report["drained"],
            "first": report.get("first", {}),
            "left": report.get("left", {}),
            "drained_after_s": report.get("drained_after_s"),
            "after_command_start_s": after_start,
        }
    times = [entry["after_command_start_s"] for entry in nodes.values()]
    return {
        "nodes": nodes,
        "left": {node: entry["left"] for node, entry in nodes.items() if not entry["drained"]},
        "unreported": unreported,
        "slowest_after_command_start_s": max(
            (time for time in times if time is not None), default=None
        ),
    }
