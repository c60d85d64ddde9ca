"""The cohorts' byte layouts (weight word, trie keys) and the checks on their CIDRs."""

import ipaddress
import socket
import struct

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    COHORT_COUNTERS_VALUE,
    COHORT_KEY_V4,
    COHORT_KEY_V6,
    MAP_SPEC_BY_NAME,
    MAP_TYPE_LPM_TRIE,
    MAX_COHORT_ENTRIES,
    WEIGHT_OPT_IN,
    WEIGHT_SCALE,
    Route,
    check_cohorts,
    cohort_map_name,
    decode_cohort_key,
    decode_weight_word,
    encode_cohort_key,
    encode_weight_word,
    parse_cohort,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition


def nets(*cidrs):
    return [ipaddress.ip_network(c) for c in cidrs]


def test_the_weight_word_holds_the_weight_and_the_opt_in_bit():
    assert encode_weight_word(1250) == struct.pack("=I", 1250)
    assert encode_weight_word(1250, opt_in=True) == struct.pack("=I", 1250 | 0x80000000)
    assert WEIGHT_OPT_IN > WEIGHT_SCALE
    assert decode_weight_word(encode_weight_word(10000, True)) == (10000, True)
    assert decode_weight_word(encode_weight_word(0, True)) == (0, True)
    # What every rollback writes, blind: both cleared.
    assert decode_weight_word(struct.pack("=I", 0)) == (0, False)


def test_cohort_keys_put_the_route_index_before_the_address():
    assert COHORT_KEY_V4.size == 12 and COHORT_KEY_V6.size == 24
    key = encode_cohort_key(5, ipaddress.ip_network("10.1.0.0/16"))
    assert key == struct.pack("=II", 32 + 16, 5) + socket.inet_aton("10.1.0.0")
    key6 = encode_cohort_key(63, ipaddress.ip_network("2001:db8::/32"))
    assert key6 == struct.pack("=II", 32 + 32, 63) + socket.inet_pton(socket.AF_INET6, "2001:db8::")
    for raw in (key, key6):
        index, network = decode_cohort_key(raw)
        assert encode_cohort_key(index, network) == raw
    assert decode_cohort_key(key) == (5, ipaddress.ip_network("10.1.0.0/16"))
    assert cohort_map_name(ipaddress.ip_network("::/0")) == "zl_cohorts_v6"
    assert cohort_map_name(ipaddress.ip_network("0.0.0.0/0")) == "zl_cohorts_v4"


def test_the_cohort_maps_are_lpm_tries_without_preallocation():
    for name in ("zl_cohorts_v4", "zl_cohorts_v6"):
        spec = MAP_SPEC_BY_NAME[name]
        assert spec.map_type == MAP_TYPE_LPM_TRIE and spec.map_flags == 1
        assert spec.max_entries == MAX_COHORT_ENTRIES and spec.since_layout == 3
    assert MAP_SPEC_BY_NAME["zl_cohort_ctrs"].value_size == COHORT_COUNTERS_VALUE.size == 16


def test_parse_cohort_accepts_networks_and_bare_addresses():
    assert parse_cohort([], "always_direct") == []
    assert parse_cohort(
        ["10.0.0.0/8", "192.0.2.7", " 2001:db8::/48", "10.0.0.0/8"], "always_direct"
    ) == nets("10.0.0.0/8", "192.0.2.7/32", "2001:db8::/48")


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (["10.0.0.1/8"], "has host bits set"),
        (["10.0.0.300/8"], "does not appear to be"),
        (["2001:db8::1/32"], "has host bits set"),
        (["chat"], "does not appear to be"),
        ([""], "does not appear to be"),
        ("10.0.0.0/8", None),
        ([10], None),
        (None, None),
    ],
)
def test_parse_cohort_refuses_anything_else_naming_the_field(value, why):
    with pytest.raises(FleetError) as refused:
        parse_cohort(value, "never_direct")
    assert refused.value.details["field"] == "never_direct"
    assert "CIDR notation with no host bits set" in refused.value.message
    if why:
        assert why in refused.value.message


def test_never_direct_wins_so_an_opt_in_prefix_it_covers_is_refused():
    check_cohorts(nets("10.0.0.0/8"), nets("10.1.0.0/16"))  # the opt-out is the longer
    check_cohorts(nets("10.0.0.0/8"), nets("2001:db8::/32"))
    for always, never in (("10.1.0.0/16", "10.1.0.0/16"), ("10.1.2.0/24", "10.0.0.0/8")):
        with pytest.raises(FleetError, match="never_direct holds or covers") as refused:
            check_cohorts(nets(always), nets(never))
        assert refused.value.details["field"] == "always_direct"


def test_more_entries_than_a_trie_holds_are_refused():
    many = [ipaddress.ip_network((i << 8, 24)) for i in range(MAX_COHORT_ENTRIES + 1)]
    check_cohorts(many[:-1], [])
    with pytest.raises(FleetError, match="at most 1024 per family") as refused:
        check_cohorts(many, [])
    assert refused.value.details["max"] == MAX_COHORT_ENTRIES
    check_cohorts([], [], {4: MAX_COHORT_ENTRIES, 6: MAX_COHORT_ENTRIES})
    with pytest.raises(FleetError):
        check_cohorts([], [], {4: 1, 6: MAX_COHORT_ENTRIES + 1})


def test_a_route_compares_its_opt_in_bit_only_when_set():
    plain = Route("chat", 8080, 500, 1, 0)
    assert plain == Route("chat", 8080, 500, 1, 0, opt_in=False)
    assert plain != plain.replace(opt_in=True)
    assert "opt_in=True" in repr(plain.replace(opt_in=True))
    assert "opt_in" not in repr(plain)


def test_the_exporter_shows_the_cohorts_decisions():
    counters = dict.fromkeys(
        ("lookups", "to_engine", "to_proxy_by_weight", "fallback_no_socket", "assign_errors"), 0
    )
    route = {
        "name": "chat",
        "port": 8080,
        "weight_bp": 0,
        "generation": 1,
        "engine_sockets": 1,
        "counters": dict(counters, lookups=9, to_engine=4, to_proxy_by_weight=2),
        "cohort_counters": {"to_engine_opt_in": 4, "to_proxy_opt_out": 3},
    }
    snapshot = {"attached": True, "program": None, "routes": [route], "latency_buckets": None}
    text = exposition.render(snapshot)
    assert 'zerolayer_route_decisions_total{route="chat",outcome="proxy_opt_out"} 3' in text
    assert 'zerolayer_route_opt_in_engine_total{route="chat"} 4' in text
    # Pins without cohorts (layout 2): no cohort series at all.
    text = exposition.render(dict(snapshot, routes=[dict(route, cohort_counters=None)]))
    assert 'outcome="proxy_opt_out"' not in text
    assert "zerolayer_route_opt_in_engine_total" not in text
