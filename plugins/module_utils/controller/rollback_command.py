# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The fleet's rollback as the operator's command: `zerolayer rollback [--deep]`, and the
push after `zerolayer rollout abort -i INVENTORY`.

What a person waits for in an incident is the command, from its start to its exit.
rollback.yml starts ansible-playbook, parses its plays, checks settings and, after the last
node confirmed, writes the report, records the event and copies the records, each a task:
about 2 s after the last confirmation at 10 nodes (docs/benchmarks.md). Here everything
runs in one Python process, in this order:

1. the nodes named from the inventory, read in process (plugin_utils/inventory_hosts.py:
   ansible-core's own inventory code, so the same plugins and groups as a playbook sees);
2. the fence raised in the rollout store and the acknowledgements counted, by the same core
   as rollback.yml's first task (rollout_fence_core): watchers without presence are not
   waited for, and their nodes are pushed at once, in a thread beside the count, since the
   raise's own read of presence says that nothing on them can acknowledge;
3. ansible-playbook started where some node did not confirm, with the rollback's own push
   plays (rollback_push.yml), sharded as rollback.yml shards them;
4. after the last confirmation, the report, the records the fence superseded marked rolled
   back in the store, and the event, in process (tens of milliseconds).

A store that cannot be written does not hold the rollback back: every node is pushed, and
fences itself one above its own epoch, as with rollback.yml.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import os
import sys
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    FleetError,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    push_shards,
    rollout_ops,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollback_confirmation import (
    MODES,
    node_confirmations,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC as FENCE_ARGUMENT_SPEC,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    fence_call,
    wait_acks,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_failure,
    store_from_params,
)

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
PUSH_PLAYBOOK = os.path.join(REPO, "playbooks", "rollback_push.yml")
# rollout_settings' defaults, which rollback.yml reads: rollback_ack_wait_s,
# rollback_deep_ack_wait_s, rollback_ack_quiet_s, rollback_fast_budget_s,
# rollback_deep_budget_s, rollback_push_shard_nodes, rollback_push_timeout_s
# (tests/unit/plugins/module_utils/controller/test_rollback_command.py keeps the two equal).
ACK_WAIT_S = {"fast": 2.0, "deep": 10.0}
ACK_QUIET_S = 0.5
BUDGET_S = {"fast": 30, "deep": 300}
SHARD_NODES = 50
PUSH_TIMEOUT_S = 120.0
# What the deep push play falls back on where a node's inventory names neither
# canary_pin_dir nor rollback_proxy_service (rollout_settings' defaults of both).
DEEP_DEFAULTS = {"pin_dir": "/sys/fs/bpf/zerolayer", "proxy_unit": "nginx.service"}
# A rollback waits for the store at most this long, then goes on without it
# (rollout_store_rollback_timeout).
STORE_TIMEOUT_S = 2.0


def default_report_dir(environ=None):
    """Where rollback.yml writes its reports (rollout_settings' canary_record_dir)."""
    home = (os.environ if environ is None else environ).get("HOME", "/root")
    return os.path.join(home, ".local", "state", "zerolayer", "rollouts")


def default_report_path(mode, now=time.time, environ=None):
    """rollback.yml's name for a report: rollback-<mode>-<UTC time>.json."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now()))
    return os.path.join(default_report_dir(environ), "rollback-%s-%s.json" % (mode, stamp))


def _fence_params(store_settings, mode, nodes, reason, actor, ack_wait_s, epoch=None):
    """rollout_fence's parameters for this rollback: the module's defaults (so an option
    added there has its value here too), the store's settings, then the rollback's own."""
    params = {name: spec.get("default") for name, spec in FENCE_ARGUMENT_SPEC.items()}
    params.update(store_settings)
    params["timeout"] = STORE_TIMEOUT_S
    params.update(
        action="raise" if epoch is None else "wait_acks",
        epoch=epoch,
        nodes=list(nodes),
        wait_s=ack_wait_s,
        quiet_s=ACK_QUIET_S,
        rollback_mode=mode,
        reason=reason,
        actor=actor,
        at_least=0,
        require_store=False,
    )
    return params


def raise_and_count(store_settings, mode, nodes, reason, actor, ack_wait_s, epoch=None,
                    on_absent=None):  # fmt: skip
    """rollout_fence's raise (epoch None) or, for a fence an abort raised, its count: the
    fence, who acknowledged, who lags, whose watcher was absent. A store that fails in any
    way leaves every node lagging (each gets the push); so do no store configured and a
    wait of 0. on_absent(epoch, nodes): see rollout_fence_core.fence_call."""
    if not store_settings.get("endpoints"):
        return {"fence": None, "store_updated": False, "acked": {}, "lagging": list(nodes),
                "store_error": "no rollout store configured", "absent": None}  # fmt: skip
    params = _fence_params(store_settings, mode, nodes, reason, actor, ack_wait_s, epoch)
    if epoch is None:
        result = fence_call(params, on_absent=on_absent)
    else:
        result = dict(wait_acks(params, on_absent), fence={"epoch": epoch}, store_updated=True)
    if not result.get("store_updated") or "lagging" not in result:
        # Not counted (the store failed, or no wait was asked): every node gets the push.
        result.update(acked={}, lagging=list(nodes))
    return result


def push(nodes, mode, epoch, reason, inventories, processes=0, env=None):
    """Push the nodes with rollback.yml's own push plays (rollback_push.yml), from one
    ansible-playbook process per shard: ({node: confirmation}, [per-shard summary]).
    epoch None: each node fences itself one above its own epoch (the store was not
    written)."""
    if not nodes:
        return {}, []
    processes = processes or os.cpu_count() or 1
    shards = push_shards.plan(nodes, SHARD_NODES, processes) or [list(dict.fromkeys(nodes))]
    push_vars = {
        "_rollback_epoch": "" if epoch is None else epoch,
        "_rollback_deep_settings": DEEP_DEFAULTS,
        "rollback_reason": reason,
    }
    return push_shards.run(
        shards,
        [sys.executable, "-m", "ansible.cli.playbook"],
        list(inventories),
        PUSH_PLAYBOOK,
        push_vars,
        mode,
        PUSH_TIMEOUT_S,
        env=env,
    )


class AbsentPush:
    """The push to the nodes whose watcher kept no presence at the raise, run in a thread of
    its own as soon as the raise names them, beside the count that cannot hear from them.
    push_nodes(nodes, epoch) -> ({node: confirmation}, [per-shard summary])."""

    def __init__(self, push_nodes):
        self.push_nodes = push_nodes
        self.nodes = []
        self.started_at = None
        self._future = None

    def start(self, epoch, nodes):
        self.nodes = list(nodes)
        self.started_at = time.time()
        beside = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        self._future = beside.submit(self.push_nodes, self.nodes, epoch)
        # The push still runs to its end; the thread goes with it.
        beside.shutdown(wait=False)

    def wait(self):
        """What the push confirmed, once it ended; its error raised here."""
        return self._future.result() if self._future is not None else ({}, [])


def report(mode, reason, nodes, counted, pushed, shards, started_at, confirmed_at):
    """The rollback's report, in the keys of rollback.yml's (docs/canary.md), with
    command_s added by the caller at its exit."""
    entries = node_confirmations(nodes, counted.get("acked") or {}, pushed, mode)
    fence = counted.get("fence") or {}
    wall = round(confirmed_at - started_at, 3)
    return {
        "mode": mode,
        "reason": reason,
        "started_at": format_timestamp(
            datetime.datetime.fromtimestamp(started_at, datetime.timezone.utc)
        ),
        "started_at_unix": round(started_at, 3),
        "finished_at_unix": round(confirmed_at, 3),
        "wall_time_s": wall,
        "budget_s": BUDGET_S[mode],
        "within_budget": wall <= BUDGET_S[mode],
        "fence_epoch": fence.get("epoch") if counted.get("store_updated") else None,
        "store_updated": bool(counted.get("store_updated")),
        "store_error": counted.get("store_error", ""),
        "store_error_kind": counted.get("store_error_kind", ""),
        "nodes_total": len(entries),
        "nodes_confirmed": sum(1 for entry in entries if entry.get("confirmed")),
        "confirmed_by_watcher": [e["node"] for e in entries if e.get("confirmed_by") == "watcher"],
        "pushed": [e["node"] for e in entries if e.get("confirmed_by") == "push"],
        "watchers_absent": counted.get("absent"),
        "count_waited_s": counted.get("waited_s"),
        "push_shards": shards,
        "unreachable": [e["node"] for e in entries if not e.get("reached")],
        "not_confirmed": [
            e["node"] for e in entries if e.get("reached") and not e.get("confirmed")
        ],
        "nodes": entries,
    }


def roll_back(store_settings, nodes, mode, reason, actor, inventories, started_at,
              ack_wait_s=None, epoch=None, env=None, clock=time.time):  # fmt: skip
    """Fence, count, push the nodes that did not confirm; the report (see report()).
    epoch: the fence an abort raised already (counted, not raised again)."""
    if mode not in MODES:
        raise FleetError(
            "mode must be one of %s; got %r" % (", ".join(MODES), mode), {"field": "mode"}
        )
    wait = ACK_WAIT_S[mode] if ack_wait_s is None else ack_wait_s
    if wait < 0:
        raise FleetError(
            "--ack-wait must be 0 or more seconds; got %r" % wait, {"field": "ack_wait"}
        )
    absent = AbsentPush(
        lambda absent_nodes, raised: push(absent_nodes, mode, raised, reason, inventories, env=env)
    )
    counted = raise_and_count(store_settings, mode, nodes, reason, actor, wait, epoch,
                              on_absent=absent.start)  # fmt: skip
    fence_epoch = None
    if counted.get("store_updated"):
        fence_epoch = (counted.get("fence") or {}).get("epoch")
    lagging_set = set(counted.get("lagging") or []) - set(absent.nodes)
    lagging = [node for node in nodes if node in lagging_set]
    pushed, shards = push(lagging, mode, fence_epoch, reason, inventories, env=env)
    pushed_at_once, shards_at_once = absent.wait()
    pushed = {**pushed_at_once, **pushed}
    # With no node pushed, the rollback ended when the count saw the last acknowledgement.
    confirmed_at = counted.get("ended_at_unix") if not (lagging or absent.nodes) else None
    result = report(mode, reason, nodes, counted, pushed, shards_at_once + shards, started_at,
                    confirmed_at or clock())  # fmt: skip
    # The nodes pushed beside the count, and when that push started after the command's.
    result["pushed_with_the_count"] = list(absent.nodes)
    result["push_with_the_count_started_s"] = (
        round(absent.started_at - started_at, 3) if absent.started_at is not None else None
    )
    return result


def write_report(result, path):
    """The report as a JSON file (its directory made); returns the path."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    temporary = "%s.tmp-%d" % (path, os.getpid())
    with open(temporary, "w") as stream:
        json.dump(result, stream, indent=2, sort_keys=True)
        stream.write("\n")
    os.replace(temporary, path)
    return path


def record_after(store_settings, result, actor, rollout_id=None, mirror_dir=None):
    """After the act, for the reports: the records the fence superseded marked rolled back
    in the store, and the fleet_rolled_back event handed to the notification sender.
    Returns what was done; a store that fails here is said, never raised (the nodes are
    rolled back whatever it answers)."""
    done = {"marked": None, "event_stored": False, "error": None}
    if not store_settings.get("endpoints"):
        done["error"] = "no rollout store configured"
        return done
    details = {key: result[key] for key in ("mode", "fence_epoch", "wall_time_s",
               "nodes_confirmed", "unreachable", "not_confirmed") if key in result}  # fmt: skip
    details["report"] = result.get("report_file")
    try:
        store = store_from_params(dict(store_settings, timeout=STORE_TIMEOUT_S))
        if result["store_updated"] and result["fence_epoch"]:
            done["marked"] = rollout_ops.mark_rolled_back(
                store,
                int(result["fence_epoch"]),
                "%s rollback: %s" % (result["mode"], result["reason"]),
                details,
                actor,
                rollout_id=rollout_id,
                mirror_dir=mirror_dir,
            )
        entry = rollout_events.event(
            "fleet_rolled_back", rollout_id, format_timestamp(utc_now()), actor,
            nodes=[entry["node"] for entry in result["nodes"]], reason=result["reason"],
            mode=result["mode"], seconds=result["wall_time_s"], budget_s=result["budget_s"],
            within_budget=result["within_budget"], fence_epoch=result["fence_epoch"],
            nodes_confirmed=result["nodes_confirmed"], nodes_total=result["nodes_total"],
            by_watcher=len(result["confirmed_by_watcher"]), unreachable=result["unreachable"],
            not_confirmed=result["not_confirmed"], report=result.get("report_file"),
        )  # fmt: skip
        rollout_events.emit(store, entry)
        done["event_stored"] = True
        done["notifications"] = notify.hand_off(store)
    except MODULE_FAILURES as exc:
        done["error"] = store_failure(exc)["store_error"]
    return done


def summary_line(result):
    """One line for the person at the terminal."""
    what = "at weight 0" if result["mode"] == "fast" else "on the proxy path, router removed"
    line = "%s rollback: %d/%d nodes confirmed %s in %.2f s (budget %d s: %s); %d by their " \
        "fence watcher, %d by push" % (
            result["mode"], result["nodes_confirmed"], result["nodes_total"], what,
            result["wall_time_s"], result["budget_s"],
            "within" if result["within_budget"] else "OVER",
            len(result["confirmed_by_watcher"]), len(result["pushed"]),
        )  # fmt: skip
    if result.get("pushed_with_the_count"):
        line += " (%d of them beside the count: no watcher present)" % len(
            result["pushed_with_the_count"]
        )
    if not result["store_updated"]:
        line += "; the store was not updated (%s): each node took its own fence" % (
            result["store_error"] or "no answer"
        )
    else:
        line += "; fence epoch %s" % result["fence_epoch"]
    if result["unreachable"] or result["not_confirmed"]:
        line += "; unreachable %s, not confirmed %s" % (
            result["unreachable"],
            result["not_confirmed"],
        )
    if result.get("report_file"):
        line += "; report %s" % result["report_file"]
    return line
