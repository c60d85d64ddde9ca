"""Byte layouts of the route map and input checks on names, ports, slots and the hash."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CLIENT_KEY,
    CLIENT_SEEN,
    COUNTERS_VALUE,
    HASH_BY_CLIENT,
    HASH_BY_CONNECTION,
    MAX_SLOTS,
    ROUTE_HASH_CLIENT,
    ROUTE_NO_COHORTS,
    ROUTE_VALUE,
    WEIGHT_OPT_IN,
    Route,
    decode_client_key,
    decode_route,
    encode_client_key,
    encode_route,
    parse_hash_mode,
    socket_key,
    validate_port,
    validate_route_name,
    validate_slot,
    weight_word,
)


def test_route_value_is_56_bytes_like_struct_zl_route():
    assert ROUTE_VALUE.size == 56
    assert COUNTERS_VALUE.size == 40


def test_route_round_trips_through_bytes():
    route = Route("chat-v2.gpu_0", 8080, 1234, 2**40 + 3, 63, slot_limit=8)
    raw = encode_route(route)
    assert len(raw) == 56
    assert decode_route(raw) == route


def test_route_fields_sit_at_the_c_offsets():
    raw = encode_route(Route("ab", 0x1F90, 500, 7, 5))
    assert raw[:3] == b"ab\0"
    assert int.from_bytes(raw[32:36], "little") == 0x1F90
    assert int.from_bytes(raw[36:40], "little") == 500
    assert int.from_bytes(raw[40:48], "little") == 7
    assert int.from_bytes(raw[48:52], "little") == 5
    assert raw[52:56] == b"\0" * 4  # slot_limit 0: not known
    assert int.from_bytes(encode_route(Route("ab", 1, 0, 1, 0, slot_limit=3))[52:56], "little") == 3


def test_replace_changes_only_the_named_fields():
    route = Route("chat", 8080, 500, 4, 2, slot_limit=1)
    assert route.replace(weight_bp=0, generation=5) == Route("chat", 8080, 0, 5, 2, slot_limit=1)
    assert route == Route("chat", 8080, 500, 4, 2, slot_limit=1)


def test_socket_keys_group_slots_by_route():
    assert int.from_bytes(socket_key(0, 0), "little") == 0
    assert int.from_bytes(socket_key(2, 3), "little") == 2 * MAX_SLOTS + 3


@pytest.mark.parametrize("name", ["chat", "a", "x" * 31, "llama-3.1_70b"])
def test_valid_route_names(name):
    assert validate_route_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "x" * 32, "-lead", "has space", "ünï", None, 5, "a/b", "svc\n", "svc\n\n"]
)
def test_invalid_route_names(name):
    with pytest.raises(FleetError, match=r"^name must be 1-31 characters"):
        validate_route_name(name)


@pytest.mark.parametrize(("port", "number"), [(1, 1), (65535, 65535), ("8080", 8080)])
def test_valid_ports(port, number):
    assert validate_port(port) == number


@pytest.mark.parametrize("port", [0, 65536, -1, "http", True, None, 80.5, "80.0"])
def test_invalid_ports(port):
    with pytest.raises(FleetError, match=r"^port must be a TCP port number from 1 to 65535"):
        validate_port(port)


@pytest.mark.parametrize("slot", [-1, MAX_SLOTS, True, "0", None])
def test_invalid_slots(slot):
    with pytest.raises(FleetError, match=r"^slot must be an integer from 0 to 7"):
        validate_slot(slot)


def test_map_specs_name_every_map_once_and_fit_the_kernels_name_limit():
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        MAP_SPECS,
    )

    names = [spec.name for spec in MAP_SPECS]
    assert len(set(names)) == len(names) == 11
    assert all(len(name) <= 15 for name in names)  # BPF_OBJ_NAME_LEN 16, NUL included
    assert [spec.name for spec in MAP_SPECS if spec.since_layout == 1] == [
        "zl_routes",
        "zl_sockets",
        "zl_counters",
        "zl_latency",
    ]
    assert [spec.name for spec in MAP_SPECS if spec.since_layout == 4] == ["zl_clients"]


def test_a_map_spec_names_each_difference():
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        MAP_SPEC_BY_NAME,
    )

    spec = MAP_SPEC_BY_NAME["zl_routes"]
    info = {"type": 1, "key_size": 4, "value_size": 48, "max_entries": 128}
    assert spec.differences(info) == [
        "value_size 48 (expected 56)",
        "max_entries 128 (expected 64)",
    ]
    assert spec.differences({**info, "value_size": 56, "max_entries": 64}) == []


def test_the_hash_by_client_flag_sits_above_the_legacy_weight_bits():
    by_client = Route("chat", 8080, 0, 3, 1, hash_mode=HASH_BY_CLIENT)
    raw = encode_route(by_client)
    assert int.from_bytes(raw[36:40], "little") == ROUTE_HASH_CLIENT == 1 << 16
    assert decode_route(raw) == by_client
    assert decode_route(raw).hash_mode == HASH_BY_CLIENT
    # A weight layout 1 left in the word (at most 10000) never reads as the flag.
    for legacy_bp in (1, 5, 9999, 10000):
        left = decode_route(encode_route(Route("chat", 8080, legacy_bp, 3, 1)))
        assert left.hash_mode == HASH_BY_CONNECTION and left.weight_bp == legacy_bp


def test_routes_compare_their_hash_only_when_it_is_client():
    plain = Route("chat", 8080, 500, 4, 2)
    assert plain.as_tuple() == ("chat", 8080, 500, 4, 2, 0)
    assert plain.replace(hash_mode=HASH_BY_CLIENT) != plain
    assert plain.replace(hash_mode=HASH_BY_CLIENT).as_tuple()[-1] == HASH_BY_CLIENT
    assert plain.as_dict()["hash"] == HASH_BY_CONNECTION
    assert "hash_mode='client'" in repr(plain.replace(hash_mode=HASH_BY_CLIENT))


@pytest.mark.parametrize("mode", ["connection", "client"])
def test_valid_hash_modes(mode):
    assert parse_hash_mode(mode) == mode


@pytest.mark.parametrize("value", ["Client", "address", "", " client", None, 1, True, ["client"]])
def test_invalid_hash_modes_name_the_field_and_the_allowed_values(value):
    with pytest.raises(FleetError, match=r"^hash must be one of connection, client ") as refused:
        parse_hash_mode(value)
    assert refused.value.details["field"] == "hash"
    assert refused.value.details["allowed"] == ["connection", "client"]


def test_client_keys_hold_the_route_the_family_and_the_address():
    import ipaddress

    v4 = encode_client_key(7, ipaddress.ip_address("192.0.2.9"))
    assert len(v4) == CLIENT_KEY.size == 24
    assert int.from_bytes(v4[:4], "little") == 7
    assert int.from_bytes(v4[4:8], "little") == 2  # AF_INET, as the sk_lookup context says
    assert v4[8:] == bytes([192, 0, 2, 9]) + b"\0" * 12
    assert decode_client_key(v4) == (7, ipaddress.ip_address("192.0.2.9"))
    v6 = encode_client_key(1, ipaddress.ip_address("2001:db8::5"))
    assert int.from_bytes(v6[4:8], "little") == 10  # AF_INET6
    assert decode_client_key(v6) == (1, ipaddress.ip_address("2001:db8::5"))
    assert CLIENT_SEEN.size == 8


def test_weight_word_carries_the_opt_in_bit():
    assert weight_word(2500) == 2500
    assert weight_word(0, opt_in=True) == WEIGHT_OPT_IN


def test_the_no_cohorts_flag_is_its_own_bit_kept_through_decode_and_never_compared():
    skipping = Route("chat", 8080, 0, 3, 1, hash_mode=HASH_BY_CLIENT, cohortless=True)
    raw = encode_route(skipping)
    word = int.from_bytes(raw[36:40], "little")
    assert word == ROUTE_HASH_CLIENT | ROUTE_NO_COHORTS and ROUTE_NO_COHORTS == 1 << 17
    decoded = decode_route(raw)
    assert decoded.cohortless and decoded.hash_mode == HASH_BY_CLIENT and decoded.weight_bp == 0
    assert decoded.replace(generation=4).cohortless  # a rewrite keeps the bit
    # A cache of the tries' contents, not a property of the route: never compared.
    assert decoded == skipping.replace(cohortless=False)
    assert not decode_route(encode_route(Route("chat", 8080, 0, 3, 1))).cohortless
