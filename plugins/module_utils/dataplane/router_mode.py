# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The router's mode on this node: active, or kept detached by a deep rollback.

A deep rollback is for a program that misbehaves in the kernel, so attaching it again by
itself (the boot unit, `systemctl restart zerolayer-router`, a run of the ebpf_router role)
could turn one bad program into a crash loop. The mode is kept in the node's fence file,
outside bpffs, so a reboot keeps it too. Every attach honours it; only an explicit restore
(router restore=true, `zerolayer-routectl attach --restore`, playbooks/restore.yml) leaves
"detached".

The record lives under the fence file's "router" key:
    {"mode": "detached", "epoch": 7, "at": "2025-01-01T00:00:00Z", "reason": "..."}
"""

from __future__ import annotations

import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    fence_file_lock,
    read_fence,
    write_fence,
)

MODE_KEY = "router"
ACTIVE = "active"
DETACHED = "detached"
DEFAULT_DETACH_REASON = "deep rollback"
RESTORE_HINT = (
    "restore it with zerolayer.fleet.router restore=true, `zerolayer-routectl attach "
    "--restore` or playbooks/restore.yml"
)


def read_mode(fence_file):
    """The node's router mode record; {"mode": "active"} when none was ever recorded."""
    record = read_fence(fence_file).get(MODE_KEY)
    if record is None:
        return {"mode": ACTIVE}
    if not isinstance(record, dict) or record.get("mode") not in (ACTIVE, DETACHED):
        # Read as "active" it could re-attach a program a deep rollback took away.
        raise FleetError(
            "fence file %s: its %r record must be an object with mode %r or %r; got %r. "
            "Fix it by hand: set mode %r only if the router may run again"
            % (fence_file, MODE_KEY, ACTIVE, DETACHED, record, ACTIVE),
            {"field": "fence_file", "path": fence_file},
        )
    return record


def is_detached(fence_file):
    return read_mode(fence_file)["mode"] == DETACHED


def detached_without_maps(layout):
    """Whether a deep rollback detached this node's router and its maps are gone: then
    nothing goes direct, and a later rollback has only the node's fence to raise. Maps
    missing for any other reason (a wrong pin_dir, a router never attached) are not this:
    a rollback must fail there rather than report a node it did not reach."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import maps_pinned

    return is_detached(layout.fence_file) and not maps_pinned(layout)


def detached_record(fence_file, reason=None, seeds=None):
    """For fence.raise_fence(record=...): the keys that keep the router detached.

    seeds (seed_weight, seed_slot) are kept with the record, so that a restore asked to
    keep them (keep_seeds) decides every tuple as before; a plain restore draws new ones.
    A repeat at the same epoch keeps the first record (its time and reason). A deep rollback
    on a node already detached (no maps left to read seeds from) carries the kept seeds on.
    """
    current = read_mode(fence_file)
    if seeds is None and current["mode"] == DETACHED:
        seeds = kept_seeds(current)

    def record(epoch):
        if current["mode"] == DETACHED and current.get("epoch") == epoch:
            return {}
        detached = {
            "mode": DETACHED,
            "epoch": epoch,
            "at": _now(),
            "reason": reason or DEFAULT_DETACH_REASON,
        }
        if seeds is not None:
            detached["seeds"] = list(seeds)
        return {MODE_KEY: detached}

    return record


def kept_seeds(record):
    """The seeds a deep rollback kept with its record, or None."""
    seeds = record.get("seeds")
    valid = (
        isinstance(seeds, list)
        and len(seeds) == 2
        and all(
            isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < 1 << 64
            for seed in seeds
        )
    )
    return tuple(seeds) if valid else None


def shown(record):
    """A mode record as results and reports show it: the kept seeds decide which engine
    every client's connections reach after a restore (a hash over addresses and ports is
    only as unguessable as its seed), so they stay in the node's fence file, and what is
    shown is whether there are any (seeds_kept)."""
    if not isinstance(record, dict) or "seeds" not in record:
        return record
    kept = {key: value for key, value in record.items() if key != "seeds"}
    kept["seeds_kept"] = kept_seeds(record) is not None
    return kept


def shown_fence(fence):
    """A fence file's content as results and reports show it (its mode record shown())."""
    if not isinstance(fence, dict) or MODE_KEY not in fence:
        return fence
    return dict(fence, **{MODE_KEY: shown(fence[MODE_KEY])})


def record_active(fence_file, reason="restore", check_mode=False):
    """Leave "detached" (an explicit restore); returns the record that was left."""
    with fence_file_lock(fence_file):
        fence = read_fence(fence_file)
        left = read_mode(fence_file)
        if left["mode"] != ACTIVE and not check_mode:
            active = {"mode": ACTIVE, "epoch": fence["epoch"], "at": _now(), "reason": reason}
            write_fence(fence_file, dict(fence, **{MODE_KEY: active}))
    return left


def kept_detached_message(record, fence_file):
    return (
        "the router is kept detached by the deep rollback at fence epoch %s (%s, reason: %s; "
        "recorded in %s): nothing was attached. Once the program is fixed, %s"
        % (
            record.get("epoch", "unknown"),
            record.get("at", "unknown time"),
            record.get("reason", "none given"),
            fence_file,
            RESTORE_HINT,
        )
    )


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
