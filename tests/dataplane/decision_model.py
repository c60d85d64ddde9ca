"""The router's decision, written again in Python to check the program against.

Mirrors zl_tuple_hash, zl_client_hash (routes that hash by client) and the slot choice in
files/bpf/zerolayer_router.bpf.c for IPv4 and IPv6; the values are read from struct
bpf_sk_lookup exactly as the program reads them (addresses and remote port in network order,
local port host order). The seeds are the node's own, read from its zl_config map (Seeds.of).
"""

import collections
import socket
import struct

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    read_layout_config,
)

MASK = (1 << 64) - 1
AF_INET = 2
AF_INET6 = 10
IPPROTO_TCP = 6
IPPROTO_UDP = 17


def mix(x):
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    x ^= x >> 31
    return x


def ip4_field(address):
    return struct.unpack("=I", socket.inet_aton(address))[0]


def port_field(port):
    return struct.unpack("=H", struct.pack("!H", port))[0]


def ip6_words(address):
    """The two 64-bit words the program builds from remote_ip6/local_ip6 (u32[4] each)."""
    a, b, c, d = struct.unpack("=4I", socket.inet_pton(socket.AF_INET6, address))
    return (a << 32 | b), (c << 32 | d)


def tuple_hash(remote_ip, remote_port, local_ip, local_port, seed):
    """zl_tuple_hash: addresses with a ':' are IPv6, as the program's ctx->family tells it."""
    h = seed
    if ":" in remote_ip:
        for word in (*ip6_words(remote_ip), *ip6_words(local_ip)):
            h = mix(h ^ word)
    else:
        h = mix(h ^ ip4_field(remote_ip))
        h = mix(h ^ ip4_field(local_ip))
    return mix(h ^ ((port_field(remote_port) << 16 | local_port) & MASK))


def client_hash(remote_ip, seed):
    """zl_client_hash: the client's address alone."""
    if ":" in remote_ip:
        high, low = ip6_words(remote_ip)
        return mix(mix(seed ^ high) ^ low)
    return mix(seed ^ ip4_field(remote_ip))


class Seeds(collections.namedtuple("Seeds", "weight slot")):
    """One node's seeds (zl_config)."""

    @classmethod
    def of(cls, layout):
        _version, seed_weight, seed_slot = read_layout_config(layout)
        return cls(seed_weight, seed_slot)


def takes_engine_path(tuple4, weight_bp, seeds):
    return tuple_hash(*tuple4, seeds.weight) % 10000 < weight_bp


def is_timed(tuple4, sample_shift, seeds):
    """Whether the program times this connection's decision (zl_timed)."""
    return tuple_hash(*tuple4, seeds.weight) >> (64 - sample_shift) == 0


def chosen_slot(tuple4, live_slots, seeds):
    live = sorted(live_slots)
    return live[tuple_hash(*tuple4, seeds.slot) % len(live)]


def client_takes_engine_path(client_ip, weight_bp, seeds):
    """The path of every connection of one client on a route that hashes by client."""
    return client_hash(client_ip, seeds.weight) % 10000 < weight_bp


def client_slot(client_ip, live_slots, seeds):
    """The engine slot of every connection of one client on a route that hashes by client."""
    live = sorted(live_slots)
    return live[client_hash(client_ip, seeds.slot) % len(live)]


def sk_lookup_ctx(remote_ip, remote_port, local_ip, local_port, protocol=IPPROTO_TCP):
    """A struct bpf_sk_lookup (72 bytes) for BPF_PROG_TEST_RUN; IPv6 when the address has ':'."""
    ctx = bytearray(72)
    if ":" in remote_ip:
        struct.pack_into("=II", ctx, 8, AF_INET6, protocol)
        ctx[20:36] = socket.inet_pton(socket.AF_INET6, remote_ip)
        ctx[44:60] = socket.inet_pton(socket.AF_INET6, local_ip)
    else:
        struct.pack_into("=II", ctx, 8, AF_INET, protocol)
        struct.pack_into("=I", ctx, 16, ip4_field(remote_ip))
        struct.pack_into("=I", ctx, 40, ip4_field(local_ip))
    struct.pack_into("!H", ctx, 36, remote_port)
    struct.pack_into("=I", ctx, 60, local_port)
    return bytes(ctx)
