# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Byte layouts of the router's maps and the checks on route input.

Mirrors files/bpf/zerolayer_router.h exactly (docs/dataplane.md explains each
field). Pure Python: nothing here touches the kernel.
"""

from __future__ import annotations

import ipaddress
import re
import struct
from decimal import Decimal, InvalidOperation

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

ROUTE_NAME_LEN = 32
MAX_ROUTES = 64
MAX_SLOTS = 8
WEIGHT_SCALE = 10000
LATENCY_BUCKETS = 64
# One decision in 2**LATENCY_SAMPLE_SHIFT is timed into the latency histogram.
LATENCY_SAMPLE_SHIFT = 4
LATENCY_SAMPLE_EVERY = 1 << LATENCY_SAMPLE_SHIFT
# The pinned maps' layout (ZL_LAYOUT_VERSION); 1 was the first release's, 3 adds the cohorts,
# 4 the route's flags word (hash by client) and zl_clients.
LAYOUT_VERSION = 4
# A zl_weights value (layout 3): the weight in basis points in its low bits, and the bit
# that enables the route's opt-in cohort (always_direct). A rollback's blind 0 clears both.
WEIGHT_OPT_IN = 0x80000000
WEIGHT_BP_MASK = 0x0000FFFF
# The cohort tries (zl_cohorts_v4, zl_cohorts_v6): entries per family, values.
MAX_COHORT_ENTRIES = 1024
COHORT_ALWAYS_DIRECT = 1
COHORT_NEVER_DIRECT = 2
COHORT_SETS = {COHORT_ALWAYS_DIRECT: "always_direct", COHORT_NEVER_DIRECT: "never_direct"}
# The route index's bits that come before the address in a cohort key.
COHORT_INDEX_BITS = 32
BPF_F_NO_PREALLOC = 1
# A route's hash (route option hash): the 4-tuple, or the client's address alone. The
# route entry's flags word (layout 4) says client with ROUTE_HASH_CLIENT, a bit above the
# low 16 bits, which may still hold a weight layout 1 wrote there (see encode_route).
HASH_BY_CONNECTION = "connection"
HASH_BY_CLIENT = "client"
HASH_MODES = (HASH_BY_CONNECTION, HASH_BY_CLIENT)
ROUTE_HASH_CLIENT = 0x00010000
# The route has no cohort entry: the program skips the trie (ZL_ROUTE_NO_COHORTS). Without the
# bit the trie is looked up, as before the bit existed.
ROUTE_NO_COHORTS = 0x00020000
ROUTE_LEGACY_WEIGHT_MASK = 0x0000FFFF
# zl_clients (layout 4): the addresses a hash-by-client route decided, least recently seen
# ones making room.
MAX_CLIENTS = 65536
TAKES_IPV4 = 1
TAKES_IPV6 = 2
# The address families as the sk_lookup context gives them (zl_clients keys).
AF_INET = 2
AF_INET6 = 10

# Maps hold host-endian values; '=' is native order with standard sizes and no padding,
# which matches the C structs because every field there is naturally aligned.
PORT_KEY = struct.Struct("=I")
SOCKET_KEY = struct.Struct("=I")
SOCKET_VALUE = struct.Struct("=Q")  # cookie when read, fd when written
# name, port, the flags word (layout 1: the weight), generation, route_index, slot_limit
ROUTE_VALUE = struct.Struct("=%dsIIQII" % ROUTE_NAME_LEN)
COUNTERS_VALUE = struct.Struct("=5Q")
LATENCY_VALUE = struct.Struct("=Q")
CONFIG_KEY = struct.Struct("=I")
CONFIG_VALUE = struct.Struct("=IIQQ")  # layout_version, reserved, seed_weight, seed_slot
FAMILIES_VALUE = struct.Struct("=I")
WEIGHT_VALUE = struct.Struct("=I")  # basis points (+ WEIGHT_OPT_IN); zl_weights, key route index
COHORT_KEY_V4 = struct.Struct("=II4s")  # prefixlen, route index, address (network order)
COHORT_KEY_V6 = struct.Struct("=II16s")
COHORT_VALUE = struct.Struct("=I")  # COHORT_ALWAYS_DIRECT or COHORT_NEVER_DIRECT
COHORT_COUNTERS_VALUE = struct.Struct("=2Q")
COHORT_COUNTER_FIELDS = ("to_engine_opt_in", "to_proxy_opt_out")
CLIENT_KEY = struct.Struct("=II16s")  # route index, family (AF_INET/AF_INET6), address
CLIENT_SEEN = struct.Struct("=II")  # the weight word decided with, direct (1) or proxy (0)
COUNTER_FIELDS = (
    "lookups",
    "to_engine",
    "to_proxy_by_weight",
    "fallback_no_socket",
    "assign_errors",
)

# map_type numbers of enum bpf_map_type.
MAP_TYPE_HASH = 1
MAP_TYPE_ARRAY = 2
MAP_TYPE_PERCPU_ARRAY = 6
MAP_TYPE_LRU_HASH = 9
MAP_TYPE_LPM_TRIE = 11
MAP_TYPE_SOCKMAP = 15


class MapSpec:
    """What a pinned map must be for this code to read and write it."""

    __slots__ = (
        "key_size",
        "map_flags",
        "map_type",
        "max_entries",
        "name",
        "since_layout",
        "value_size",
    )

    def __init__(
        self, name, map_type, key_size, value_size, max_entries, since_layout=1, map_flags=0
    ):
        self.name = name
        self.map_flags = map_flags
        self.map_type = map_type
        self.key_size = key_size
        self.value_size = value_size
        self.max_entries = max_entries
        self.since_layout = since_layout

    def as_dict(self):
        return {name: getattr(self, name) for name in self.__slots__}

    def differences(self, info):
        """The fields where a map's info (bpf_syscall.map_info) differs from this spec."""
        fields = (
            ("type", "map_type"),
            ("key_size", "key_size"),
            ("value_size", "value_size"),
            ("max_entries", "max_entries"),
        )
        return [
            "%s %s (expected %s)" % (field, info[info_field], getattr(self, field))
            for info_field, field in fields
            if info[info_field] != getattr(self, field)
        ]


# Every map of the router, in the order of the C source (files/bpf/zerolayer_router.bpf.c).
MAP_SPECS = (
    MapSpec("zl_routes", MAP_TYPE_HASH, PORT_KEY.size, ROUTE_VALUE.size, MAX_ROUTES),
    MapSpec(
        "zl_sockets", MAP_TYPE_SOCKMAP, SOCKET_KEY.size, SOCKET_VALUE.size, MAX_ROUTES * MAX_SLOTS
    ),
    MapSpec("zl_counters", MAP_TYPE_PERCPU_ARRAY, 4, COUNTERS_VALUE.size, MAX_ROUTES),
    MapSpec("zl_latency", MAP_TYPE_PERCPU_ARRAY, 4, LATENCY_VALUE.size, LATENCY_BUCKETS),
    MapSpec("zl_config", MAP_TYPE_ARRAY, CONFIG_KEY.size, CONFIG_VALUE.size, 1, since_layout=2),
    MapSpec(
        "zl_families",
        MAP_TYPE_ARRAY,
        SOCKET_KEY.size,
        FAMILIES_VALUE.size,
        MAX_ROUTES * MAX_SLOTS,
        since_layout=2,
    ),
    MapSpec("zl_weights", MAP_TYPE_ARRAY, PORT_KEY.size, WEIGHT_VALUE.size, MAX_ROUTES, 2),
    MapSpec(
        "zl_cohorts_v4",
        MAP_TYPE_LPM_TRIE,
        COHORT_KEY_V4.size,
        COHORT_VALUE.size,
        MAX_COHORT_ENTRIES,
        since_layout=3,
        map_flags=BPF_F_NO_PREALLOC,
    ),
    MapSpec(
        "zl_cohorts_v6",
        MAP_TYPE_LPM_TRIE,
        COHORT_KEY_V6.size,
        COHORT_VALUE.size,
        MAX_COHORT_ENTRIES,
        since_layout=3,
        map_flags=BPF_F_NO_PREALLOC,
    ),
    MapSpec(
        "zl_cohort_ctrs",
        MAP_TYPE_PERCPU_ARRAY,
        4,
        COHORT_COUNTERS_VALUE.size,
        MAX_ROUTES,
        since_layout=3,
    ),
    MapSpec("zl_clients", MAP_TYPE_LRU_HASH, CLIENT_KEY.size, CLIENT_SEEN.size, MAX_CLIENTS, 4),
)
MAP_SPEC_BY_NAME = {spec.name: spec for spec in MAP_SPECS}

# \Z, not $: $ also matches before a trailing newline, and "svc\n" is no route name.
_NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")


class Route:
    """One route: its entry of the route map, with its weight (zl_weights since layout 2).

    slot_limit: the route's sockets are in slots below it (0: unknown, the program
    looks at every slot); engine_sockets keeps it one above the highest live slot.
    opt_in: the weight word's opt-in bit (layout 3): the route's always_direct entries
    apply. hash_mode: HASH_BY_CONNECTION or HASH_BY_CLIENT (layout 4, the entry's flags).
    Each compared only when not the default, so routes of older layouts compare as before.
    cohortless: the entry's ROUTE_NO_COHORTS bit, which the writer of the cohorts keeps
    (the program skips the trie); a cache of the tries' contents, so never compared.
    """

    __slots__ = (
        "cohortless",
        "generation",
        "hash_mode",
        "name",
        "opt_in",
        "port",
        "route_index",
        "slot_limit",
        "weight_bp",
    )

    def __init__(
        self,
        name,
        port,
        weight_bp,
        generation,
        route_index,
        slot_limit=0,
        opt_in=False,
        hash_mode=HASH_BY_CONNECTION,
        cohortless=False,
    ):
        self.name = name
        self.cohortless = bool(cohortless)
        self.hash_mode = hash_mode
        self.opt_in = bool(opt_in)
        self.port = port
        self.weight_bp = weight_bp
        self.generation = generation
        self.route_index = route_index
        self.slot_limit = slot_limit

    def __eq__(self, other):
        return isinstance(other, Route) and self.as_tuple() == other.as_tuple()

    def __repr__(self):
        return (
            "Route(%r, port=%d, weight_bp=%d, generation=%d, route_index=%d, slot_limit=%d%s%s)"
            % (
                *self.as_tuple()[:6],
                ", opt_in=True" if self.opt_in else "",
                ", hash_mode=%r" % self.hash_mode if self.hash_mode != HASH_BY_CONNECTION else "",
            )
        )

    def as_tuple(self):
        fields = (
            self.name,
            self.port,
            self.weight_bp,
            self.generation,
            self.route_index,
            self.slot_limit,
        )
        if self.opt_in:
            fields += (True,)
        if self.hash_mode != HASH_BY_CONNECTION:
            fields += (self.hash_mode,)
        return fields

    def replace(self, **changes):
        """A copy with some fields changed."""
        fields = {name: getattr(self, name) for name in self.__slots__}
        fields.update(changes)
        return Route(**fields)

    def as_dict(self):
        return {
            "name": self.name,
            "port": self.port,
            "weight_bp": self.weight_bp,
            "weight": bp_to_percent(self.weight_bp),
            "generation": self.generation,
            "route_index": self.route_index,
            "slot_limit": self.slot_limit,
            "hash": self.hash_mode,
        }


def encode_route(route):
    """The bytes of a zl_routes value. The flags word carries the weight in its low 16 bits
    (layout 1 reads it there; callers on later layouts give weight_bp 0) and the flags above
    them: a weight layout 1 left there is at most 10000 and can never read as a flag."""
    flags = ROUTE_HASH_CLIENT if route.hash_mode == HASH_BY_CLIENT else 0
    if route.cohortless:
        flags |= ROUTE_NO_COHORTS
    return ROUTE_VALUE.pack(
        route.name.encode("ascii"),
        route.port,
        route.weight_bp | flags,
        route.generation,
        route.route_index,
        route.slot_limit,
    )


def decode_route(raw):
    """A zl_routes value as a Route: weight_bp is the flags word's low 16 bits (the weight on
    layout 1, what layout 1 left there or 0 later), hash_mode its ROUTE_HASH_CLIENT bit,
    cohortless its ROUTE_NO_COHORTS bit."""
    name, port, word, generation, route_index, slot_limit = ROUTE_VALUE.unpack(
        raw[: ROUTE_VALUE.size]
    )
    return Route(
        name.split(b"\0", 1)[0].decode("ascii", "replace"),
        port,
        word & ROUTE_LEGACY_WEIGHT_MASK,
        generation,
        route_index,
        slot_limit,
        hash_mode=HASH_BY_CLIENT if word & ROUTE_HASH_CLIENT else HASH_BY_CONNECTION,
        cohortless=bool(word & ROUTE_NO_COHORTS),
    )


def parse_hash_mode(value, field="hash"):
    """HASH_BY_CONNECTION or HASH_BY_CLIENT, given exactly; refuses anything else naming field
    and the allowed values."""
    if isinstance(value, str) and value in HASH_MODES:
        return value
    raise FleetError(
        "%s must be one of %s (connection: the 4-tuple, each connection on its own; client: "
        "the client's address alone, all its connections on one path); got %r"
        % (field, ", ".join(HASH_MODES), value),
        {"field": field, "value": repr(value), "allowed": list(HASH_MODES)},
    )


def encode_client_key(route_index, address):
    """The zl_clients key of one client address (an ipaddress address) on a route."""
    family = AF_INET if address.version == 4 else AF_INET6
    return CLIENT_KEY.pack(route_index, family, address.packed)


def decode_client_key(raw):
    """(route_index, ipaddress address) of a zl_clients key."""
    route_index, family, packed = CLIENT_KEY.unpack(raw)
    return route_index, ipaddress.ip_address(packed[:4] if family == AF_INET else packed)


def weight_word(weight_bp, opt_in=False):
    """A zl_weights value as a number: the weight, and the opt-in bit when enabled."""
    return weight_bp | (WEIGHT_OPT_IN if opt_in else 0)


def encode_weight_word(weight_bp, opt_in=False):
    """The 4 bytes of a zl_weights value."""
    return WEIGHT_VALUE.pack(weight_word(weight_bp, opt_in))


def decode_weight_word(raw):
    """(weight_bp, opt_in) of a zl_weights value."""
    (word,) = WEIGHT_VALUE.unpack(raw[: WEIGHT_VALUE.size])
    return word & WEIGHT_BP_MASK, bool(word & WEIGHT_OPT_IN)


def cohort_map_name(network):
    """The trie that holds network (an ipaddress network): zl_cohorts_v4 or zl_cohorts_v6."""
    return "zl_cohorts_v4" if network.version == 4 else "zl_cohorts_v6"


def encode_cohort_key(route_index, network):
    """The trie key of network on route route_index: the route index's bits, then the prefix."""
    key = COHORT_KEY_V4 if network.version == 4 else COHORT_KEY_V6
    return key.pack(
        COHORT_INDEX_BITS + network.prefixlen, route_index, network.network_address.packed
    )


def decode_cohort_key(raw):
    """(route_index, ipaddress network) of a trie key (v4 or v6, told by its size)."""
    key = COHORT_KEY_V4 if len(raw) == COHORT_KEY_V4.size else COHORT_KEY_V6
    prefixlen, route_index, address = key.unpack(raw)
    network = ipaddress.ip_network(
        (ipaddress.ip_address(address), prefixlen - COHORT_INDEX_BITS), strict=False
    )
    return route_index, network


def parse_cohort(value, field):
    """A list of CIDRs (IPv4 or IPv6, no host bits set) as a sorted list of networks.

    A bare address is its own /32 or /128. Refuses anything else naming field and the
    allowed values; duplicates are kept once.
    """
    allowed = (
        "a list of IPv4 or IPv6 networks in CIDR notation with no host bits set, e.g. "
        "['10.1.0.0/16', '192.0.2.7/32', '2001:db8::/48'], or [] for none"
    )
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise FleetError(
            "%s must be %s; got %r" % (field, allowed, value),
            {"field": field, "value": repr(value)},
        )
    networks = set()
    for item in value:
        if not isinstance(item, str):
            raise FleetError(
                "%s must be %s; got %r in it" % (field, allowed, item),
                {"field": field, "value": repr(item)},
            )
        try:
            network = ipaddress.ip_network(item.strip(), strict=True)
        except ValueError as exc:
            raise FleetError(
                "%s must be %s; got %r (%s)" % (field, allowed, item, exc),
                {"field": field, "value": item},
            ) from None
        networks.add(network)
    return sorted(networks, key=lambda n: (n.version, n.network_address, n.prefixlen))


def check_cohorts(always, never, entries_by_family=None):
    """Refuse a prefix in both lists (or covered by a never_direct one), or more entries per
    family than a trie holds.

    entries_by_family: {4: n, 6: n}, the entries the tries would hold in all after the
    write (the other routes' included); None: only these two lists are counted.
    """
    # The trie answers with the longest prefix: an always_direct prefix inside a never_direct
    # one would win over it there. never_direct must win, so such a prefix is refused (a
    # never_direct prefix inside an always_direct one is fine: it is the longer).
    shadowed = [(a, n) for a in always for n in never if a.version == n.version and a.subnet_of(n)]
    if shadowed:
        raise FleetError(
            "always_direct must hold no prefix that never_direct holds or covers (never_direct "
            "wins); got %s. Allowed: prefixes outside every never_direct prefix, or wider ones "
            "(a never_direct prefix inside an always_direct one stays on the proxy)"
            % ", ".join("%s (in never_direct %s)" % (a, n) for a, n in shadowed),
            {"field": "always_direct", "value": [str(a) for a, _n in shadowed]},
        )
    if entries_by_family is None:
        entries_by_family = {
            version: sum(1 for n in [*always, *never] if n.version == version) for version in (4, 6)
        }
    for version, count in sorted(entries_by_family.items()):
        if count > MAX_COHORT_ENTRIES:
            raise FleetError(
                "always_direct and never_direct would hold %d IPv%d prefixes on this node "
                "(every route together); the router holds at most %d per family: use wider "
                "prefixes" % (count, version, MAX_COHORT_ENTRIES),
                {"field": "always_direct", "value": count, "max": MAX_COHORT_ENTRIES},
            )


def encode_port(port):
    return PORT_KEY.pack(port)


def socket_key(route_index, slot):
    """Sockmap key of a route's slot (zl_socket_key in the C header)."""
    return SOCKET_KEY.pack(route_index * MAX_SLOTS + slot)


def parse_weight(value, field="weight"):
    """A percentage (0-100, at most two decimals; int, float or str) as basis points."""
    allowed = "a percentage from 0 to 100 with at most two decimals, e.g. 0, 5, 12.5 or 99.99"
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise FleetError(
            "%s must be %s; got %r" % (field, allowed, value),
            {"field": field, "value": repr(value)},
        )
    try:
        # str() of a float gives its shortest round-trip form: 12.34 stays 12.34, not 12.339999...
        percent = Decimal(value.strip() if isinstance(value, str) else str(value))
    except InvalidOperation:
        percent = None
    if percent is None or not percent.is_finite() or not Decimal(0) <= percent <= Decimal(100):
        raise FleetError(
            "%s must be %s; got %r" % (field, allowed, value),
            {"field": field, "value": repr(value)},
        )
    basis_points = percent * 100
    if basis_points != basis_points.to_integral_value():
        raise FleetError(
            "%s must be %s; got %r (more than two decimals)" % (field, allowed, value),
            {"field": field, "value": repr(value)},
        )
    return int(basis_points)


def bp_to_percent(weight_bp):
    """Basis points as a percentage number: 1250 -> 12.5, 10000 -> 100."""
    percent = weight_bp / 100.0
    return int(percent) if percent == int(percent) else percent


def validate_route_name(name, field="name"):
    allowed = (
        "1-%d characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
        % (ROUTE_NAME_LEN - 1)
    )
    if (
        not isinstance(name, str)
        or not name
        or len(name) >= ROUTE_NAME_LEN
        or not _NAME_PATTERN.match(name)
    ):
        raise FleetError(
            "%s must be %s; got %r" % (field, allowed, name), {"field": field, "value": repr(name)}
        )
    return name


def validate_port(port, field="port"):
    if isinstance(port, bool):
        port = None
    try:
        number = int(port)
    except (TypeError, ValueError):
        number = None
    if number is None or str(number) != str(port).strip() or not 1 <= number <= 65535:
        raise FleetError(
            "%s must be a TCP port number from 1 to 65535; got %r" % (field, port),
            {"field": field, "value": repr(port)},
        )
    return number


def validate_slot(slot, field="slot"):
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < MAX_SLOTS:
        raise FleetError(
            "%s must be an integer from 0 to %d; got %r" % (field, MAX_SLOTS - 1, slot),
            {"field": field, "value": repr(slot)},
        )
    return slot
