# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollback's push, sharded over several controller processes.

One ansible-playbook process drives every node of a play from one main process: the
templating and the result handling of each node run there, one after the other, so past a
few dozen nodes the push waits for one CPU of the controller, however many forks it has.
When many nodes lag (their fence watcher did not confirm), rollback.yml splits them into
shards and pushes each shard from a process of its own (playbooks/rollback_push.yml, the
same plays it runs itself for a small lagging set), all at once; each shard writes what its
nodes confirmed to a JSON file, and the rollback's report reads them all.

plan() decides the shards; merge() turns the shards' files, or their failure, into one
confirmation per node. Both are plain functions; run() starts and waits for the processes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollback_confirmation import (
    MODES,
)

MIN_SHARD_NODES = 1


class ShardError(FleetError):
    """Bad input to the sharded push; field names the option at fault."""

    def __init__(self, message, field):
        super().__init__(message, {"field": field})
        self.field = field


def plan(nodes, shard_nodes, processes):
    """The shards to push: [] when the play pushes them itself (no more than shard_nodes
    lag, or one process is allowed), else at most `processes` lists of at least shard_nodes
    nodes each, nodes dealt in turn so that every shard gets a share of each group. A shard
    process costs about a second of start-up (interpreter, inventory, playbook), about what
    pushing to a few dozen nodes costs: shard_nodes is that break-even."""
    if shard_nodes < MIN_SHARD_NODES:
        raise ShardError(
            "shard_nodes must be at least %d; got %r" % (MIN_SHARD_NODES, shard_nodes),
            "shard_nodes",
        )
    if processes < 1:
        raise ShardError("processes must be at least 1; got %r" % (processes,), "processes")
    nodes = list(dict.fromkeys(nodes))
    if processes == 1 or len(nodes) <= shard_nodes:
        return []
    count = min(processes, len(nodes) // shard_nodes)
    if count < 2:
        return []
    return [nodes[index::count] for index in range(count)]


def unconfirmed(node, error):
    """What the report says of a node whose shard gave no answer for it."""
    return {
        "node": node,
        "reached": False,
        "confirmed": False,
        "confirmed_by": "push",
        "error": error,
    }


def merge(shards, outcomes):
    """One confirmation per node of every shard. outcomes[i] is shard i's result: the dict
    its file held ({node: confirmation}), or an error string when the shard failed. A node
    its shard did not report on is named unconfirmed, with why."""
    merged = {}
    for index, nodes in enumerate(shards):
        outcome = outcomes[index]
        for node in nodes:
            if isinstance(outcome, dict) and isinstance(outcome.get(node), dict):
                merged[node] = outcome[node]
            elif isinstance(outcome, dict):
                merged[node] = unconfirmed(node, "push shard %d wrote nothing for it" % index)
            else:
                merged[node] = unconfirmed(node, "push shard %d failed: %s" % (index, outcome))
    return merged


def shard_argv(playbook_command, inventories, playbook, vars_file):
    """The command line of one shard's process."""
    argv = list(playbook_command)
    for source in inventories:
        argv += ["-i", source]
    return [*argv, playbook, "-e", "@" + vars_file]


def shard_vars(push_vars, mode, nodes, results_file):
    """The extra vars of one shard: its nodes as the push play of its mode reads them."""
    if mode not in MODES:
        raise ShardError("mode must be one of %s; got %r" % (", ".join(MODES), mode), "mode")
    return dict(
        push_vars, rollback_push_results_file=results_file, **{"_rollback_push_" + mode: nodes}
    )


def _tail(path, size=1500):
    try:
        with open(path, "rb") as stream:
            stream.seek(0, os.SEEK_END)
            stream.seek(max(0, stream.tell() - size))
            return stream.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _stop(process):
    """End a shard's process group (its forks too): SIGTERM, then SIGKILL."""
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=10)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run(shards, playbook_command, inventories, playbook, push_vars, mode, timeout_s, env=None):
    """Push every shard from a process of its own, all at once; wait for all of them, at
    most timeout_s. Returns ({node: confirmation}, [per-shard summary])."""
    workdir = tempfile.mkdtemp(prefix="zerolayer-push-")
    processes = []
    outcomes = []
    summaries = []
    try:
        for index, nodes in enumerate(shards):
            vars_file = os.path.join(workdir, "shard-%d.vars.json" % index)
            results_file = os.path.join(workdir, "shard-%d.results.json" % index)
            log_file = os.path.join(workdir, "shard-%d.log" % index)
            with open(vars_file, "w") as stream:
                json.dump(shard_vars(push_vars, mode, nodes, results_file), stream)
            argv = shard_argv(playbook_command, inventories, playbook, vars_file)
            with open(log_file, "wb") as log:
                process = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    # A group of its own, so that a shard past its time ends with its forks.
                    start_new_session=True,
                )
            processes.append((process, results_file, log_file, time.monotonic()))
        deadline = time.monotonic() + timeout_s
        for index, (process, results_file, log_file, started) in enumerate(processes):
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop(process)
                outcomes.append("no answer within %.0f s" % timeout_s)
                summaries.append({"shard": index, "nodes": len(shards[index]), "rc": None})
                continue
            elapsed = round(time.monotonic() - started, 3)
            summaries.append(
                {"shard": index, "nodes": len(shards[index]), "rc": process.returncode,
                 "seconds": elapsed}
            )  # fmt: skip
            try:
                with open(results_file) as stream:
                    outcomes.append(json.load(stream))
            except (OSError, ValueError):
                outcomes.append(
                    "exit status %d, no results; %s" % (process.returncode, _tail(log_file))
                )
    finally:
        for process, _results, _log, _started in processes:
            if process.poll() is None:
                _stop(process)
        for name in os.listdir(workdir):
            os.unlink(os.path.join(workdir, name))
        os.rmdir(workdir)
    return merge(shards, outcomes), summaries
