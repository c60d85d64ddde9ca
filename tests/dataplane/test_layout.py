"""The C header and the Python codec describe the same bytes."""

import os
import subprocess

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import route_codec

from .conftest import BPF_DIR

PROBE = r"""
#include <stddef.h>
#include <stdio.h>
#include "zerolayer_router.h"
int main(void)
{
    printf("%zu %zu %zu %zu %zu %zu %zu %zu\n", sizeof(struct zl_route),
           offsetof(struct zl_route, port), offsetof(struct zl_route, flags),
           offsetof(struct zl_route, generation), offsetof(struct zl_route, route_index),
           offsetof(struct zl_route, slot_limit),
           sizeof(struct zl_counters), offsetof(struct zl_counters, assign_errors));
    printf("%d %d %d %d %d %u %d\n", ZL_ROUTE_NAME_LEN, ZL_MAX_ROUTES, ZL_MAX_SLOTS,
           ZL_WEIGHT_SCALE, ZL_LATENCY_BUCKETS, zl_socket_key(5, 3), ZL_LATENCY_SAMPLE_SHIFT);
    printf("%zu %zu %zu %d %d %d\n", sizeof(struct zl_config),
           offsetof(struct zl_config, seed_weight), offsetof(struct zl_config, seed_slot),
           ZL_LAYOUT_VERSION, ZL_TAKES_IPV4, ZL_TAKES_IPV6);
    printf("%zu %zu %zu %zu %u %d %u\n", sizeof(struct zl_client_key),
           offsetof(struct zl_client_key, addr), sizeof(struct zl_client_seen),
           offsetof(struct zl_client_seen, direct), ZL_ROUTE_HASH_CLIENT, ZL_MAX_CLIENTS,
           ZL_ROUTE_NO_COHORTS);
    return 0;
}
"""


def test_header_layout_matches_the_codec(tmp_path):
    source = tmp_path / "probe.c"
    source.write_text(PROBE)
    binary = str(tmp_path / "probe")
    subprocess.run(["cc", "-I", BPF_DIR, "-o", binary, str(source)], check=True)
    sizes, constants, config, clients = subprocess.run(
        [binary], check=True, capture_output=True, text=True
    ).stdout.split("\n")[:4]
    assert [int(n) for n in sizes.split()] == [
        route_codec.ROUTE_VALUE.size,
        32,
        36,
        40,
        48,
        52,
        40,
        32,
    ]
    assert route_codec.COUNTERS_VALUE.size == 40
    assert [int(n) for n in constants.split()] == [
        route_codec.ROUTE_NAME_LEN,
        route_codec.MAX_ROUTES,
        route_codec.MAX_SLOTS,
        route_codec.WEIGHT_SCALE,
        route_codec.LATENCY_BUCKETS,
        int.from_bytes(route_codec.socket_key(5, 3), "little"),
        route_codec.LATENCY_SAMPLE_SHIFT,
    ]
    assert [int(n) for n in config.split()] == [
        route_codec.CONFIG_VALUE.size,
        8,
        16,
        route_codec.LAYOUT_VERSION,
        route_codec.TAKES_IPV4,
        route_codec.TAKES_IPV6,
    ]
    assert [int(n) for n in clients.split()] == [
        route_codec.CLIENT_KEY.size,
        8,
        route_codec.CLIENT_SEEN.size,
        4,
        route_codec.ROUTE_HASH_CLIENT,
        route_codec.MAX_CLIENTS,
        route_codec.ROUTE_NO_COHORTS,
    ]
    assert os.path.basename(BPF_DIR) == "bpf"
