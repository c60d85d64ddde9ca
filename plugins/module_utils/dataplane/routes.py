# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Reading and writing routes: plain functions, usable without Ansible.

A weight change is one BPF_MAP_UPDATE_ELEM of the route's 4-byte weight in zl_weights
(layout 1 kept it in the route's entry): a connection sees the old weight or the new one.
Every check runs before the first write, so bad input changes nothing.

Since layout 3 a route also has two client sets by source CIDR, its cohorts (zl_cohorts_v4
and zl_cohorts_v6): never_direct (the proxy at any weight) and always_direct (an engine at
any weight, while the route's weight word carries the opt-in bit). The weight and the
opt-in bit are one 4-byte word, so the blind 0 of a rollback clears both in one write.

Since layout 4 a route hashes by connection (the 4-tuple) or by client (its address alone):
a flag in the route's entry, written with the entry, which a rollback leaves as it is. The
router notes the addresses of a hash-by-client route in zl_clients (metrics.py counts them).

Writers hold the router's writer lock; a fast rollback does not wait for it. It raises
the node's fence and writes 0 into every weight, blind. A writer whose critical section
saw the fence rise under it (it may have written a weight after the rollback's zero)
writes the zeros again as it leaves (fenced_writer): whatever the interleaving, the last
weight written after a rollback is 0.
"""

from __future__ import annotations

import contextlib
import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    direct_drain,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    REREAD_ACTION,
    admit,
    raise_fence,
    read_fence,
    store_epoch_reader,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    client_route_index,
    read_client_entries,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CLIENTS_MAP,
    COHORT_COUNTERS_MAP,
    COHORTS_V4_MAP,
    COHORTS_V6_MAP,
    COUNTERS_MAP,
    FAMILIES_MAP,
    ROUTES_MAP,
    SOCKETS_MAP,
    WEIGHTS_MAP,
    has_map,
    opened,
    opened_map,
    require_maps,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    COHORT_ALWAYS_DIRECT,
    COHORT_COUNTERS_VALUE,
    COHORT_KEY_V4,
    COHORT_KEY_V6,
    COHORT_NEVER_DIRECT,
    COHORT_SETS,
    COHORT_VALUE,
    COUNTERS_VALUE,
    FAMILIES_VALUE,
    HASH_BY_CLIENT,
    LAYOUT_VERSION,
    MAX_ROUTES,
    MAX_SLOTS,
    PORT_KEY,
    ROUTE_VALUE,
    WEIGHT_VALUE,
    Route,
    check_cohorts,
    cohort_map_name,
    decode_cohort_key,
    decode_route,
    decode_weight_word,
    encode_cohort_key,
    encode_port,
    encode_route,
    encode_weight_word,
    parse_cohort,
    parse_hash_mode,
    parse_weight,
    socket_key,
    validate_port,
    validate_route_name,
)


def read_route_entries(layout):
    """The route map's entries as stored (since layout 2 their weight is what the flags
    word's low 16 bits hold: 0, or what layout 1 left there; the weight is in zl_weights)."""
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
            words = [
                decode_weight_word(
                    bpf_syscall.map_lookup(fd, PORT_KEY.pack(route.route_index), WEIGHT_VALUE.size)
                )
                for route in routes
            ]
        routes = [
            route.replace(weight_bp=weight_bp, opt_in=opt_in)
            for route, (weight_bp, opt_in) in zip(routes, words)
        ]
    return sorted(routes, key=lambda route: route.port)


COHORT_MAPS = (COHORTS_V4_MAP, COHORTS_V6_MAP)
_COHORT_KEYS = {COHORTS_V4_MAP: COHORT_KEY_V4, COHORTS_V6_MAP: COHORT_KEY_V6}


def has_cohorts(layout):
    """Whether the pins have the cohort maps (layout 3)."""
    return has_map(layout, COHORTS_V4_MAP)


def read_cohort_entries(layout):
    """Every trie entry: [(route_index, network, COHORT_* value)] (both families)."""
    entries = []
    if not has_cohorts(layout):
        return entries
    for name in COHORT_MAPS:
        key_size = _COHORT_KEYS[name].size
        with opened_map(layout, name, read_only=True) as fd:
            for key in bpf_syscall.map_keys(fd, key_size):
                raw = bpf_syscall.map_lookup(fd, key, COHORT_VALUE.size)
                if raw is not None:
                    route_index, network = decode_cohort_key(key)
                    entries.append((route_index, network, COHORT_VALUE.unpack(raw)[0]))
    return entries


def route_cohorts(route, entries):
    """{always_direct: [CIDR], never_direct: [CIDR]} of route as the program applies them:
    its always_direct entries only while its weight word has the opt-in bit (a rollback's
    0 clears it; the entries left behind apply no more and the next writer removes them),
    and none while its entry tells the program to skip the trie (cohortless)."""
    sets = {"always_direct": [], "never_direct": []}
    if route is None or route.cohortless:
        return sets
    for route_index, network, value in entries:
        if route_index != route.route_index or value not in COHORT_SETS:
            continue
        if value == COHORT_ALWAYS_DIRECT and not route.opt_in:
            continue
        sets[COHORT_SETS[value]].append(network)
    return {name: [str(n) for n in sorted(nets, key=_network_order)] for name, nets in sets.items()}


def _network_order(network):
    return (network.version, network.network_address, network.prefixlen)


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
        if (
            all(route.weight_bp == 0 and not route.opt_in for route in confirmed)
            or time.monotonic() >= deadline
        ):
            return failures, confirmed
        time.sleep(0.005)
        failures = roll_back_weights(layout, names)


def zero_weights(layout):
    """Weight 0 on every route index, one blind 4-byte write each, taking no lock; then
    the direct-drain marker, so that the engines end their pooled direct connections.
    The same write clears the opt-in bit: the always_direct cohort goes with the weight.

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


def _write_route(layout, entry, new, entry_first=False):
    """Write a route's entry and weight: the weight first, so a new route starts at it,
    unless entry_first (an existing route whose entry turns its cohort trie on: the trie
    must apply before the weight word does, or an opt-out client could go direct at it).

    The entry carries the route's flags (its hash, whether it has cohorts) and generation:
    one atomic update."""

    def write_entry(stored):
        with opened_map(layout, ROUTES_MAP) as fd:
            flags = bpf_syscall.BPF_NOEXIST if new else bpf_syscall.BPF_EXIST
            bpf_syscall.map_update(fd, encode_port(entry.port), encode_route(stored), flags)

    def write_weight():
        with opened_map(layout, WEIGHTS_MAP) as fd:
            bpf_syscall.map_update(
                fd,
                PORT_KEY.pack(entry.route_index),
                encode_weight_word(entry.weight_bp, entry.opt_in),
            )

    if not has_map(layout, WEIGHTS_MAP):
        write_entry(entry)
        return
    stored = entry.replace(weight_bp=0)  # the flags word's legacy weight bits stay 0
    if entry_first:
        write_entry(stored)
        write_weight()
    else:
        write_weight()
        write_entry(stored)


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
    if has_cohorts(layout):
        stale = [(i, n) for i, n, _value in read_cohort_entries(layout) if i == route_index]
        _delete_cohort_entries(layout, stale)
        with opened_map(layout, COHORT_COUNTERS_MAP) as fd:
            zeroes = COHORT_COUNTERS_VALUE.pack(0, 0) * bpf_syscall.possible_cpus()
            bpf_syscall.map_update(fd, PORT_KEY.pack(route_index), zeroes)
    _forget_clients(layout, route_index)


def _forget_clients(layout, route_index):
    """Delete the client addresses a former route with this index left in zl_clients (the
    LRU may have dropped some already: gone is gone)."""
    stale = [key for key in read_client_entries(layout) if client_route_index(key) == route_index]
    if stale:
        with opened_map(layout, CLIENTS_MAP) as fd:
            for key in stale:
                bpf_syscall.map_delete(fd, key)


def _delete_cohort_entries(layout, entries):
    """Delete [(route_index, network)] from the tries (gone already: nothing to do)."""
    for name in COHORT_MAPS:
        keys = [encode_cohort_key(i, n) for i, n in entries if cohort_map_name(n) == name]
        if keys:
            with opened_map(layout, name) as fd:
                for key in keys:
                    bpf_syscall.map_delete(fd, key)


def _write_cohort_entries(layout, route_index, always, never):
    """Insert or overwrite the route's entries (each a single atomic trie update)."""
    wanted = [(n, COHORT_ALWAYS_DIRECT) for n in always] + [(n, COHORT_NEVER_DIRECT) for n in never]
    for name in COHORT_MAPS:
        items = [(n, value) for n, value in wanted if cohort_map_name(n) == name]
        if items:
            with opened_map(layout, name) as fd:
                for network, value in items:
                    bpf_syscall.map_update(
                        fd, encode_cohort_key(route_index, network), COHORT_VALUE.pack(value)
                    )


def plan_route(routes, name, port=None, weight=None, hash_mode=None):
    """The entry to write for route name (None when nothing changes); validates everything.

    hash_mode: HASH_BY_CONNECTION or HASH_BY_CLIENT; None keeps the route's (a new route
    hashes by connection).
    """
    name = validate_route_name(name)
    port = validate_port(port) if port is not None else None
    weight_bp = parse_weight(weight) if weight is not None else None
    hash_mode = parse_hash_mode(hash_mode) if hash_mode is not None else None
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
        created = Route(name, port, weight_bp or 0, 1, _free_route_index(routes))
        return created.replace(hash_mode=hash_mode) if hash_mode is not None else created
    if port is not None and port != current.port:
        raise FleetError(
            "port of route %r is %d and cannot change in place; remove the route and create it "
            "again with port %d" % (name, current.port, port),
            {"field": "port", "value": port},
        )
    changes = {}
    if weight_bp is not None and weight_bp != current.weight_bp:
        changes["weight_bp"] = weight_bp
    if hash_mode is not None and hash_mode != current.hash_mode:
        changes["hash_mode"] = hash_mode
    if not changes:
        return None
    return current.replace(generation=current.generation + 1, **changes)


def _parse_cohorts(layout, always_direct, never_direct):
    """(always, never) as sorted networks, None where not given; validated before any read."""
    always = parse_cohort(always_direct, "always_direct") if always_direct is not None else None
    never = parse_cohort(never_direct, "never_direct") if never_direct is not None else None
    if (always is not None or never is not None) and not has_cohorts(layout):
        field = "always_direct" if always is not None else "never_direct"
        raise FleetError(
            "%s: the pins under %s are of a layout without cohorts; attach the router "
            "(zerolayer.fleet.router state=attached) to upgrade them to layout 3. Nothing was "
            "written" % (field, layout.pin_dir),
            {"field": field},
        )
    return always, never


def _plan_cohorts(layout, routes, name, before, port, always, never):
    """(cohorts now, cohorts after, the entries' networks now) of route name.

    cohorts: {always_direct: [network], never_direct: [network]} as the program applies
    them; given lists replace, None keeps. Refuses a cohort on a route that does not exist
    (and is not created here), a prefix in both lists, or more entries than the tries hold.
    """
    _refuse_cohort_of_no_route(layout, routes, name, before, port, always, never)
    entries = read_cohort_entries(layout)
    now = {"always_direct": [], "never_direct": []}
    own = []
    if before is not None:
        own = [(i, n) for i, n, _v in entries if i == before.route_index]
        for key, cidrs in route_cohorts(before, entries).items():
            now[key] = [_network(c) for c in cidrs]
    after = {
        "always_direct": always if always is not None else now["always_direct"],
        "never_direct": never if never is not None else now["never_direct"],
    }
    mine = set(own)
    others = [n for i, n, _v in entries if (i, n) not in mine]
    counts = {
        version: sum(
            1
            for n in [*others, *after["always_direct"], *after["never_direct"]]
            if n.version == version
        )
        for version in (4, 6)
    }
    check_cohorts(after["always_direct"], after["never_direct"], counts)
    return now, after, own


def _program_uses(layout, map_name):
    """Whether the pinned program uses the pinned map map_name, i.e. is of the layout that
    brought it. No program pinned: True (nothing runs, and the next attach loads one)."""
    if not os.path.exists(layout.prog):
        return True
    with opened_map(layout, map_name, read_only=True) as map_fd:
        map_id = bpf_syscall.map_info(map_fd)["id"]
    with opened(layout.prog, read_only=True) as prog_fd:
        return map_id in bpf_syscall.prog_map_ids(prog_fd)


def _require_program_with_cohorts(layout):
    """Refuse to set an opt-in bit that the pinned program would read as a weight.

    An attach adds the cohort maps before it loads the new program; where that load failed,
    the program of layout 2 still runs on pins of layout 3, and to it bit 31 of the weight
    word is a weight far above 100%: every connection direct. No program pinned: nothing
    runs, and the next attach loads one that knows the bit.
    """
    if not _program_uses(layout, COHORTS_V4_MAP):
        raise FleetError(
            "always_direct: the program pinned at %s predates the cohorts (it does not use "
            "zl_cohorts_v4) and would read the opt-in bit as a weight; attach the router "
            "(zerolayer.fleet.router state=attached) to upgrade the program first. Nothing was "
            "written" % layout.prog,
            {"field": "always_direct", "path": layout.prog},
        )


def _parse_hash(layout, hash_mode):
    """hash_mode validated (None: keep the route's); client refused on pins without
    zl_clients (an older layout), before anything is read."""
    if hash_mode is None:
        return None
    hash_mode = parse_hash_mode(hash_mode)
    if hash_mode == HASH_BY_CLIENT and not has_map(layout, CLIENTS_MAP):
        raise FleetError(
            "hash: the pins under %s are of a layout without hashing by client; attach the "
            "router (zerolayer.fleet.router state=attached) to upgrade them to layout %d. "
            "Nothing was written" % (layout.pin_dir, LAYOUT_VERSION),
            {"field": "hash", "value": hash_mode},
        )
    return hash_mode


def _require_program_with_client_hash(layout):
    """Refuse the hash-by-client flag while the pinned program predates it.

    An attach adds zl_clients before it loads the new program; where that load failed, the
    program of layout 3 still runs on pins of layout 4. It never reads the route's flags
    word: it would go on hashing by connection, and the route would say client. No program
    pinned: nothing runs, and the next attach loads one that reads the flag.
    """
    if not _program_uses(layout, CLIENTS_MAP):
        raise FleetError(
            "hash: the program pinned at %s predates hashing by client (it does not use "
            "zl_clients) and would go on hashing by connection; attach the router "
            "(zerolayer.fleet.router state=attached) to upgrade the program first. Nothing was "
            "written" % layout.prog,
            {"field": "hash", "path": layout.prog},
        )


def _skips_cohorts(layout, before, cohorts):
    """Whether the route's entry may tell the program to skip the cohort trie: no entry of
    cohorts applies, and the pinned program reads the flags word (layout 1's read it as its
    weight, so the bit is set only where a program of the cohorts runs, or none yet)."""
    if cohorts["always_direct"] or cohorts["never_direct"]:
        return False
    return (before is not None and before.cohortless) or _program_uses(layout, COHORTS_V4_MAP)


def _refuse_cohort_of_no_route(layout, routes, name, before, port, always, never):
    if before is None and port is None and (always is not None or never is not None):
        field = "always_direct" if always is not None else "never_direct"
        known = ", ".join(route.name for route in routes) or "none"
        raise FleetError(
            "%s: route %r does not exist under %s (known routes: %s); give port to create it, "
            "or name a known route. Nothing was written" % (field, name, layout.pin_dir, known),
            {"field": field, "route": name},
        )


def _closes(before, after):
    """Whether cohorts after send some client to the proxy that before sent direct."""
    if before is None or after is None:
        return False
    return bool(
        set(before["always_direct"]) - set(after["always_direct"])
        or set(after["never_direct"]) - set(before["never_direct"])
    )


def _network(cidr):
    return parse_cohort([cidr], "cohort")[0]


def _cohort_strings(cohorts):
    return {key: [str(n) for n in nets] for key, nets in cohorts.items()}


def set_route(
    layout,
    name,
    port=None,
    weight=None,
    check_mode=False,
    epoch=None,
    always_direct=None,
    never_direct=None,
    hash_mode=None,
):
    """Create route name, or change its weight, cohorts or hash; returns changed/before/after
    (Route or None) and cohorts_before/cohorts_after ({always_direct, never_direct}).

    epoch is the writer's fence epoch (None: it carries none); a write that raises the
    weight, adds to the opt-in cohort or takes from the opt-out one with an epoch older
    than the node's fence, or above the rollout store's, is refused (fence.admit).
    always_direct/never_direct: lists of CIDRs that replace the route's ([] clears; None
    keeps, except that weight 0 without always_direct clears the opt-in cohort too).
    hash_mode: HASH_BY_CONNECTION or HASH_BY_CLIENT (None keeps the route's; a new route
    hashes by connection). Not fenced: it moves no share of traffic, only which clients get
    it; a rollback's zeros leave it as it is.
    warnings: what the write could not check (the store down).
    """
    require_maps(layout)
    always, never = _parse_cohorts(layout, always_direct, never_direct)
    hash_mode = _parse_hash(layout, hash_mode)
    if always is None and weight is not None and parse_weight(weight) == 0 and has_cohorts(layout):
        # Weight 0 is how a drain (and a rollback on pins without zl_weights) sends nothing
        # direct: it takes the opt-in cohort with it, in the same write of the weight word.
        # Weight 0 with an opt-in cohort is asked for by giving always_direct with it.
        always = []
    warnings = []
    with fenced_writer(layout, "route %r" % name, epoch):
        routes = read_routes(layout)
        before = find_route(routes, name)
        _refuse_cohort_of_no_route(layout, routes, name, before, port, always, never)
        entry = plan_route(routes, name, port, weight, hash_mode)
        cohorts_before = cohorts_after = own = None
        if has_cohorts(layout):
            cohorts_before, cohorts_after, own = _plan_cohorts(
                layout, routes, name, before, port, always, never
            )
            base = entry or before
            opt_in = bool(cohorts_after["always_direct"])
            if base is not None and (cohorts_after != cohorts_before or base.opt_in != opt_in):
                entry = base.replace(
                    opt_in=opt_in,
                    generation=base.generation + (1 if entry is None else 0),
                )
            if entry is not None:
                entry = entry.replace(
                    cohortless=_skips_cohorts(layout, before, cohorts_after),
                )
        result = {
            "changed": entry is not None,
            "before": before,
            "after": entry or before,
            "warnings": warnings,
            "cohorts_before": _cohort_strings(cohorts_before)
            if before is not None and cohorts_before is not None
            else None,
            "cohorts_after": _cohort_strings(cohorts_after) if cohorts_after else None,
        }
        if entry is None:
            return result
        if entry.opt_in and not (before is not None and before.opt_in):
            _require_program_with_cohorts(layout)
        if entry.hash_mode == HASH_BY_CLIENT and (
            before is None or before.hash_mode != HASH_BY_CLIENT
        ):
            _require_program_with_client_hash(layout)
        opens = cohorts_before is not None and (
            set(cohorts_after["always_direct"]) - set(cohorts_before["always_direct"])
            or set(cohorts_before["never_direct"]) - set(cohorts_after["never_direct"])
        )
        admit(
            layout.fence_file,
            epoch,
            entry.weight_bp > (before.weight_bp if before is not None else 0) or bool(opens),
            "weight %s%% on route %r%s"
            % (entry.as_dict()["weight"], name, " with its cohorts" if opens else ""),
            check_mode,
            store_epoch=store_epoch_reader(layout.store_config),
            warnings=warnings,
        )
        if not check_mode:
            if before is None:
                _reset_route_slots_and_counters(layout, entry.route_index)
            if cohorts_after is None:
                _write_route(layout, entry, new=before is None)
            else:
                # The order a reader sees: first the new entries (an added prefix, or one that
                # moves between the lists, is one atomic trie update each; a new opt-in entry
                # applies only once the opt-in bit is set, unless the route had it already),
                # then the weight word (weight and opt-in bit in one write: the switch) and
                # the route entry (before the weight word where it turns the trie on, so a new
                # opt-out prefix applies before a raised weight does), then the stale entries
                # go. A reader never finds a prefix of the new lists missing after the switch;
                # until the deletes, a stale opt-out prefix keeps its clients on the proxy a
                # moment longer (the safe side; not when both lists end empty: the entry turns
                # the trie off, as asked), and a stale opt-in one, where the bit stays set,
                # sends its clients direct a moment longer, as before the write.
                _write_cohort_entries(
                    layout,
                    entry.route_index,
                    cohorts_after["always_direct"],
                    cohorts_after["never_direct"],
                )
                _write_route(
                    layout,
                    entry,
                    new=before is None,
                    entry_first=before is not None and before.cohortless and not entry.cohortless,
                )
                keep = {
                    (entry.route_index, n)
                    for n in [*cohorts_after["always_direct"], *cohorts_after["never_direct"]]
                }
                _delete_cohort_entries(layout, [e for e in own if e not in keep])
            direct_drain.note_weight(
                layout,
                entry.port,
                before.weight_bp if before is not None else 0,
                entry.weight_bp,
                "weight %s%% on route %r" % (entry.as_dict()["weight"], name),
                epoch,
            )
            if (
                before is not None
                and entry.weight_bp >= before.weight_bp
                and _closes(cohorts_before, cohorts_after)
            ):
                # Pooled clients of a cohort that lost the direct path leave it too.
                direct_drain.note_cohort_lowered(
                    layout, entry.port, entry.weight_bp, "cohorts of route %r" % name, epoch
                )
        return result


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
        current = decode_route(raw)  # the entry as stored: its flags word stays as it is
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
