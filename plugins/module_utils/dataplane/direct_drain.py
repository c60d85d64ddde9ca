# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The node's side of the direct drain: the one writer of the marker that tells the engines
which direct-path connections must leave, and the count of those still open.

The router decides per connection, at the SYN, so lowering a weight moves new connections
only; pooled keep-alive clients would stay on the direct path. Every lowering therefore
also writes this marker, after the weight: the engines' HTTP servers read it
(roles/model_engine/files/zerolayer_direct_drain.py, which documents the format and the
close rule) and end their direct connections gracefully. A raise writes it too, so that
a new canary after a rollback stops the closing.

The marker never holds a rollback back: the weights are written first, and a marker that
cannot be written is reported (False), never raised.

A rollback is complete for pooled clients when no direct connection is left. Those are the
established connections on a service port held by a process that does not listen on it:
the router handed them to an engine's own listener, so their local port is the service
port, while the proxy's client connections belong to the processes listening there.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_text_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.locks import flock_within
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import read_fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.proc_sockets import (
    TCP_ESTABLISHED,
    TCP_LISTEN,
    in_netns,
    socket_fds,
    tcp_rows,
)

MARKER_VERSION = 1
# Engines run as their own user and read it: outside the fence's root-only directory.
DEFAULT_DIRECT_DRAIN_FILE = "/run/zerolayer/direct-drain.json"
# A writer waits this long for another's read-modify-write, then writes anyway: a lost
# update costs one marker entry, a wait would cost the rollback time.
LOCK_WAIT_S = 0.5
_LOCK_POLL_S = 0.005


def read_marker(path):
    """The marker as written; an empty one when there is none or it is not readable."""
    try:
        with open(path, encoding="utf-8") as handle:
            marker = json.load(handle)
    except (OSError, ValueError):
        return {"version": MARKER_VERSION, "ports": {}}
    if not isinstance(marker, dict) or marker.get("version") != MARKER_VERSION:
        return {"version": MARKER_VERSION, "ports": {}}
    marker.setdefault("ports", {})
    return marker


def _write_marker(path, marker):
    write_text_atomic(path, json.dumps(marker, sort_keys=True) + "\n", mode=0o644)


@contextlib.contextmanager
def _marker_lock(path):
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o755, exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        # Not taken within LOCK_WAIT_S: write unlocked rather than hold the caller up.
        flock_within(fd, LOCK_WAIT_S, _LOCK_POLL_S)
        yield
    finally:
        os.close(fd)


def _epoch_of(layout, epoch):
    if epoch is not None:
        return epoch
    try:
        return read_fence(layout.fence_file).get("epoch", 0)
    except (OSError, ValueError, FleetError):  # the marker names the epoch; none is no failure
        return None


def _update(layout, change):
    """Apply change(marker, now) under the marker's lock; True when written."""
    try:
        with _marker_lock(layout.direct_drain_file):
            marker = read_marker(layout.direct_drain_file)
            # Strictly later than the last write, even within one millisecond: the later of
            # "all" and a port's entry governs, and a tie would go to "all".
            now = max(round(time.time(), 3), round(marker.get("written_unix", 0) + 0.001, 3))
            change(marker, now)
            marker["written_unix"] = now
            _write_marker(layout.direct_drain_file, marker)
        return True
    except (OSError, FleetError):
        return False


def note_all_zero(layout, reason, epoch=None):
    """Every route went to weight 0 (a fast rollback, an abort) or the router was detached:
    every direct connection must leave. Returns whether the marker was written."""
    epoch = _epoch_of(layout, epoch)

    def change(marker, now):
        marker["all"] = {"since_unix": now, "epoch": epoch, "reason": reason}

    return _update(layout, change)


def note_weight(layout, port, before_bp, after_bp, reason, epoch=None):
    """One route's weight changed from before_bp to after_bp: a lowering starts the drain
    of its direct connections, a raise ends it for connections made from now on. Returns
    whether the marker was written (None: nothing to note, the weight did not change)."""
    if before_bp == after_bp:
        return None
    epoch = _epoch_of(layout, epoch)

    def change(marker, now):
        key = str(port)
        previous = marker["ports"].get(key)
        everything = marker.get("all")
        if after_bp < before_bp:
            since = now
        else:
            # A raise moves nothing: it keeps the moment of the last lowering in force
            # for the connections made before it.
            since = max(
                previous["since_unix"] if previous else 0,
                everything["since_unix"] if everything else 0,
            )
        marker["ports"][key] = {
            "since_unix": since,
            "updated_unix": now,
            "weight_bp": after_bp,
            "epoch": epoch,
            "reason": reason,
        }

    return _update(layout, change)


def note_engine_replaced(layout, port, weight_bp, reason, epoch=None):
    """A route's engine socket was replaced (an engine upgrade's swap): the direct
    connections made before it, which the old engine holds, leave and are decided again;
    the weight stays as it is. Returns whether the marker was written."""
    return _note_redecide(layout, port, weight_bp, reason, epoch)


def note_cohort_lowered(layout, port, weight_bp, reason, epoch=None):
    """A route's cohorts now send fewer clients direct (an opt-in prefix gone, an opt-out one
    added) at the same weight: its direct connections made before now leave and are decided
    again. Returns whether the marker was written."""
    return _note_redecide(layout, port, weight_bp, reason, epoch)


def _note_redecide(layout, port, weight_bp, reason, epoch):
    epoch = _epoch_of(layout, epoch)

    def change(marker, now):
        marker["ports"][str(port)] = {
            "since_unix": now,
            "updated_unix": now,
            "weight_bp": weight_bp,
            "epoch": epoch,
            "reason": reason,
        }

    return _update(layout, change)


def _tcp_rows_of_this_thread(proc):
    rows = []
    for name in ("thread-self/net/tcp", "thread-self/net/tcp6"):
        try:
            with open(os.path.join(proc, name)) as handle:
                rows.extend(tcp_rows(handle.read()))
        except FileNotFoundError:
            continue
    return rows


def direct_connections(service_ports, netns_path=None, proc="/proc"):
    """{service port: established direct-path connections on it now}, in the router's
    network namespace (netns_path; None: this process's)."""
    ports = set(service_ports)
    established, listening = {}, {}
    rows = in_netns(netns_path, lambda: _tcp_rows_of_this_thread(proc))
    for local_port, state, inode in rows:
        if local_port in ports:
            if state == TCP_ESTABLISHED:
                established[inode] = local_port
            elif state == TCP_LISTEN:
                listening[inode] = local_port
    direct = {}
    if established:
        for entry in os.listdir(proc):
            if not entry.isdigit():
                continue
            try:
                held = socket_fds(int(entry), proc)
            except PermissionError:
                # Another user's process (an engine's): only root can see whose sockets
                # those are, and a count of one's own would read 0, wrongly.
                raise FleetError(
                    "counting direct connections reads every process's fds in %s: run it as "
                    "root (zerolayer-routectl, the fence watcher)" % proc,
                    {"field": "proc"},
                ) from None
            listens_on = {listening[inode] for inode in held if inode in listening}
            for inode in held:
                port = established.get(inode)
                if port is not None and port not in listens_on:
                    direct[inode] = port
    counts = dict.fromkeys(sorted(ports), 0)
    for port in direct.values():
        counts[port] += 1
    return counts


def direct_connections_by_route(routes, netns_path=None):
    """{route name: its direct connections now}; routes: {name: service port}."""
    counts = direct_connections(routes.values(), netns_path)
    return {name: counts[port] for name, port in routes.items()}


def wait_until_drained(routes, wait_s, netns_path=None, poll_s=0.1, clock=time.monotonic):
    """Count each route's direct connections until none is left, for at most wait_s.

    routes: {name: service port}. Returns {"first": {name: count} of the first count,
    "left": {name: count} of those still open at the end (none: {}), "drained": bool,
    "drained_after_s": seconds until none was left (None when some were), "waited_s"}.
    """
    started = clock()
    first = None
    while True:
        by_name = direct_connections_by_route(routes, netns_path)
        if first is None:
            first = by_name
        left = {name: count for name, count in by_name.items() if count}
        waited = clock() - started
        if not left or waited >= wait_s:
            return {
                "first": first,
                "left": left,
                "drained": not left,
                "drained_after_s": None if left else round(waited, 3),
                "waited_s": round(waited, 3),
            }
        time.sleep(min(poll_s, max(0.0, wait_s - waited)))
