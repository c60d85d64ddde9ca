# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Reading and writing routes: plain functions, usable without Ansible.

A weight change is one BPF_MAP_UPDATE_ELEM of the route's 4-byte weight in zl_weights
(layout 1 kept it in the route's entry): a connection sees the old weight or the new one.
Every check runs before the first write, so bad input changes nothing.

Writers hold the router's writer lock; a fast rollback does not wait for it. It raises
the node's fence and writes 0 into every weight, blind. A writer whose critical section
saw the fence rise under it (it may have written a weight after the rollback's zero)
writes the zeros again as it leaves (fenced_writer): whatever the interleaving, the last
weight written after a rollback is 0.
"""

from __future__ import annotations

import contextlib
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils import bpf_syscall, direct_drain
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.fence import (
    REREAD_ACTION,
    admit,
    raise_fence,
    read_fence,
    store_epoch_reader,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import (
    COUNTERS_MAP,
    FAMILIES_MAP,
    ROUTES_MAP,
    SOCKETS_MAP,
    WEIGHTS_MAP,
    has_map,
    opened_map,
    require_maps,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.route_codec import (
    COUNTERS_VALUE,
    FAMILIES_VALUE,
    MAX_ROUTES,
    MAX_SLOTS,
    PORT_KEY,
    ROUTE_VALUE,
    WEIGHT_VALUE,
    Route,
    decode_route,
    encode_port,
    encode_route,
    parse_weight,
    socket_key,
    validate_port,
    validate_route_name,
)


def read_route_entries(layout):
    """The route map's entries as stored (on layout 2 their weight field is the legacy 0)."""
    with opened_map(layout, ROUTES_MAP, read_only=True) as fd:
        entries = []
        for key in bpf_syscall.map_keys(fd, PORT_KEY.size):
            raw = bpf_syscall.map_lookup(fd, key, ROUTE_VALUE.size)
            if raw is not None:  # deleted while we walked the map
                entries.append(decode_route(raw))
    return entries


def read_routes(layout):
    """All routes, ordered by port, each with its live weight (read-only fds)."""
    routes = read_route_entries(layout)
    if has_map(layout, WEIGHTS_MAP):
        with opened_map(layout, WEIGHTS_MAP, read_only=True) as fd:
            routes = [
                route.replace(
                    weight_bp=WEIGHT_VALUE.unpack(
                        bpf_syscall.map_lookup(
                            fd, PORT_KEY.pack(route.route_index), WEIGHT_VALUE.size
                        )
                    )[0]
                )
                for route in routes
            ]
    return sorted(routes, key=lambda route: route.port)


def roll_back_weights(layout, names=None):
    """Weight 0 on every route: blind writes (zero_weights) on layout 2, a fenced set_route
    per route on pins of layout 1 (names: the routes, read from the map when not given, and
    only then). Returns {route name: why it failed} (one bad route must not stop the others)."""
    if zero_weights(layout):
        return {}
    if names is None:
        names = [route.name for route in read_routes(layout)]
    failures = {}
    for name in names:
        try:
            set_route(layout, name, weight=0)
        except FleetError as exc:
            failures[name] = exc.message
    return failures


# How long a rollback zeroes again while its read-back still shows a weight. Only a writer
# that admitted its epoch before the fence can write one (once, then it writes the zeros
# itself as it leaves its lock): its critical section is a few map writes, milliseconds.
ROLLBACK_SETTLE_S = 2.0


def roll_back_and_read(layout, names=None, settle_s=ROLLBACK_SETTLE_S):
    """roll_back_weights, then the read-back that proves it: (failures, routes as read).

    A weight that a writer admitted before the fence may land between the zeros and the
    read-back. The rollback then writes the zeros again and reads again, up to settle_s,
    without waiting for any lock; a weight still above 0 after that is reported, not hidden.
    """
    deadline = time.monotonic() + settle_s
    failures = roll_back_weights(layout, names)
    while True:
        confirmed = read_routes(layout)
        if all(route.weight_bp == 0 for route in confirmed) or time.monotonic() >= deadline:
            return failures, confirmed
        time.sleep(0.005)
        failures = roll_back_weights(layout, names)


def zero_weights(layout):
    """Weight 0 on every route index, one blind 4-byte write each, taking no lock; then
    the direct-drain marker, so that the engines end their pooled direct connections.

    Every index, not only the routes read a moment ago: a route created meanwhile starts
    at 0 as well. Returns False on pins of layout 1 (no zl_weights: use set_route).
    """
    if not has_map(layout, WEIGHTS_MAP):
        return False
    zero = WEIGHT_VALUE.pack(0)
    with opened_map(layout, WEIGHTS_MAP) as fd:
        for index in range(MAX_ROUTES):
            bpf_syscall.map_update(fd, PORT_KEY.pack(index), zero)
    direct_drain.note_all_zero(layout, "weight 0 on every route")
    return True


@contextlib.contextmanager
def fenced_writer(layout, what, epoch=None):
    """The writer lock, and on leaving it the zeros again if a rollback raised the fence.

    epoch is what the writer carries: a fence raised to it by the writer's own admit() is
    not a rollback, nor is the store's epoch that admit() recorded on a node that had no
    fence file (fence.REREAD_ACTION; a rollback after it leaves its own action). Anything
    else higher appeared while this writer held the lock.
    """
    with writer_lock(layout, what):
        fence_at_entry = read_fence(layout.fence_file)["epoch"]
        try:
            yield
        finally:
            fence_now = read_fence(layout.fence_file)
            if (
                fence_now["epoch"] > max(fence_at_entry, epoch or 0)
                and fence_now.get("action") != REREAD_ACTION
            ):
                zero_weights(layout)


def _write_route(layout, entry, new):
    """Write a route's entry and weight: the weight first, so a new route starts at it."""
    if has_map(layout, WEIGHTS_MAP):
        with opened_map(layout, WEIGHTS_MAP) as fd:
            bpf_syscall.map_update(
                fd, PORT_KEY.pack(entry.route_index), WEIGHT_VALUE.pack(entry.weight_bp)
            )
        stored = entry.replace(weight_bp=0)  # the entry's legacy weight field stays 0
    else:
        stored = entry
    with opened_map(layout, ROUTES_MAP) as fd:
        flags = bpf_syscall.BPF_NOEXIST if new else bpf_syscall.BPF_EXIST
        bpf_syscall.map_update(fd, encode_port(entry.port), encode_route(stored), flags)


def find_route(routes, name):
    for route in routes:
        if route.name == name:
            return route
    return None


def require_route(layout, name, field="route"):
    """The route called name, or a FleetError listing the known names."""
    routes = read_routes(layout)
    route = find_route(routes, name)
    if route is None:
        known = ", ".join(r.name for r in routes) or "none"
        raise FleetError(
            "%s %r is not a known route under %s (known routes: %s)"
            % (field, name, layout.pin_dir, known),
            {"field": field, "value": name},
        )
    return route


def _free_route_index(routes):
    used = {route.route_index for route in routes}
    for index in range(MAX_ROUTES):
        if index not in used:
            return index
    raise FleetError("all %d routes are in use; remove one first" % MAX_ROUTES, {"field": "name"})


def _reset_route_slots_and_counters(layout, route_index):
    """Clear what a former route with this index left behind before the index is reused."""
    with opened_map(layout, SOCKETS_MAP) as sockets_fd:
        for slot in range(MAX_SLOTS):
            bpf_syscall.map_delete(
                sockets_fd, socket_key(route_index, slot), bpf_syscall.SOCKMAP_ABSENT_ERRNOS
            )
    with opened_map(layout, COUNTERS_MAP) as counters_fd:
        zeroes = COUNTERS_VALUE.pack(0, 0, 0, 0, 0) * bpf_syscall.possible_cpus()
        bpf_syscall.map_update(counters_fd, PORT_KEY.pack(route_index), zeroes)
    if has_map(layout, FAMILIES_MAP):
        with opened_map(layout, FAMILIES_MAP) as families_fd:
            for slot in range(MAX_SLOTS):
                bpf_syscall.map_update(
                    families_fd, socket_key(route_index, slot), FAMILIES_VALUE.pack(0)
                )


def plan_route(routes, name, port=None, weight=None):
    """The entry to write for route name (None when nothing changes); validates everything."""
    name = validate_route_name(name)
    port = validate_port(port) if port is not None else None
    weight_bp = parse_weight(weight) if weight is not None else None
    current = find_route(routes, name)
    if port is not None:
        holder = next(
            (route for route in routes if route.port == port and route.name != name), None
        )
        if holder is not None:
            raise FleetError(
                "port %d is already routed by route %r; choose another port or remove %r first"
                % (port, holder.name, holder.name),
                {"field": "port", "value": port},
            )
    if current is None:
        if port is None:
            known = ", ".join(route.name for route in routes) or "none"
            raise FleetError(
                "name %r is not a known route (known routes: %s); give port to create it"
                % (name, known),
                {"field": "name", "value": name},
            )
        return Route(name, port, weight_bp or 0, 1, _free_route_index(routes))
    if port is not None and port != current.port:
        raise FleetError(
            "port of route %r is %d and cannot change in place; remove the route and create it "
            "again with port %d" % (name, current.port, port),
            {"field": "port", "value": port},
        )
    if weight_bp is None or weight_bp == current.weight_bp:
        return None
    return current.replace(weight_bp=weight_bp, generation=current.generation + 1)


def set_route(layout, name, port=None, weight=None, check_mode=False, epoch=None):
    """Create route name, or change its weight; returns changed/before/after (Route or None).

    epoch is the writer's fence epoch (None: it carries none); a write that raises the
    weight with an epoch older than the node's fence, or above the rollout store's, is
    refused (fence.admit). warnings: what the write could not check (the store down).
    """
    require_maps(layout)
    warnings = []
    with fenced_writer(layout, "route %r" % name, epoch):
        routes = read_routes(layout)
        before = find_route(routes, name)
        entry = plan_route(routes, name, port, weight)
        if entry is None:
            return {"changed": False, "before": before, "after": before, "warnings": warnings}
        admit(
            layout.fence_file,
            epoch,
            entry.weight_bp > (before.weight_bp if before is not None else 0),
            "weight %s%% on route %r" % (entry.as_dict()["weight"], name),
            check_mode,
            store_epoch=store_epoch_reader(layout.store_config),
            warnings=warnings,
        )
        if not check_mode:
            if before is None:
                _reset_route_slots_and_counters(layout, entry.route_index)
            _write_route(layout, entry, new=before is None)
            direct_drain.note_weight(
                layout,
                entry.port,
                before.weight_bp if before is not None else 0,
                entry.weight_bp,
                "weight %s%% on route %r" % (entry.as_dict()["weight"], name),
                epoch,
            )
        return {"changed": True, "before": before, "after": entry, "warnings": warnings}


def fence_routes(layout, epoch=None, action="fast rollback"):
    """Raise the node's fence (to epoch, or one above its own); takes no writer lock.

    A writer that admitted an older epoch just before may still write a weight; it sees
    the fence risen when it leaves its lock and writes the zeros again (fenced_writer).
    Returns (epoch before, epoch after).
    """
    require_maps(layout)
    return raise_fence(layout.fence_file, epoch, action)


def sync_slot_limit(layout, route, live_slots, check_mode=False):
    """Set route's slot_limit one above its highest live slot (0 for none).

    The caller holds the writer lock and has just changed the slots. Returns whether
    the entry changed (in check mode: would change).
    """
    limit = max(live_slots) + 1 if live_slots else 0
    with opened_map(layout, ROUTES_MAP) as fd:
        raw = bpf_syscall.map_lookup(fd, encode_port(route.port), ROUTE_VALUE.size)
        if raw is None:
            return False
        current = decode_route(raw)  # the entry as stored: its legacy weight field stays
        if current.slot_limit == limit:
            return False
        if not check_mode:
            updated = current.replace(slot_limit=limit, generation=current.generation + 1)
            bpf_syscall.map_update(
                fd, encode_port(updated.port), encode_route(updated), bpf_syscall.BPF_EXIST
            )
        return True


def remove_route(layout, name, check_mode=False):
    """Delete route name (new connections on its port go to the proxy) and clear its slots."""
    name = validate_route_name(name)
    require_maps(layout)
    with writer_lock(layout, "removing route %r" % name):
        before = find_route(read_routes(layout), name)
        if before is None:
            return {"changed": False, "before": None, "after": None}
        if not check_mode:
            with opened_map(layout, ROUTES_MAP) as fd:
                bpf_syscall.map_delete(fd, encode_port(before.port))
            _reset_route_slots_and_counters(layout, before.route_index)
            direct_drain.note_weight(
                layout, before.port, before.weight_bp, 0, "route %r removed" % name
            )
        return {"changed": True, "before": before, "after": None}
