"""A route's hash (connection or client) planned before anything is written, and the client
addresses of a hash-by-client route counted at its current weight word."""

import ipaddress

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    count_client_addresses,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    HASH_BY_CLIENT,
    HASH_BY_CONNECTION,
    WEIGHT_OPT_IN,
    Route,
    encode_client_key,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import plan_route

ROUTES = [Route("chat", 8080, 500, 4, 0), Route("embed", 8081, 0, 1, 2, hash_mode="client")]


def test_a_new_route_hashes_by_connection_unless_told():
    assert plan_route(ROUTES, "rerank", port=8082).hash_mode == HASH_BY_CONNECTION
    created = plan_route(ROUTES, "rerank", port=8082, hash_mode="client")
    assert created == Route("rerank", 8082, 0, 1, 1, hash_mode=HASH_BY_CLIENT)


def test_a_hash_change_bumps_the_generation_and_keeps_the_weight():
    assert plan_route(ROUTES, "chat", hash_mode="client") == Route(
        "chat", 8080, 500, 5, 0, hash_mode=HASH_BY_CLIENT
    )
    both = plan_route(ROUTES, "chat", weight=20, hash_mode="client")
    assert (both.weight_bp, both.hash_mode, both.generation) == (2000, HASH_BY_CLIENT, 5)


def test_the_same_hash_or_none_is_no_change_and_a_weight_keeps_the_hash():
    assert plan_route(ROUTES, "embed", hash_mode="client") is None
    assert plan_route(ROUTES, "chat", hash_mode="connection") is None
    assert plan_route(ROUTES, "embed", weight=5).hash_mode == HASH_BY_CLIENT


@pytest.mark.parametrize("value", ["Client", "ip", "", 0])
def test_a_bad_hash_is_refused_naming_the_field_and_the_allowed_values(value):
    with pytest.raises(FleetError, match="hash must be one of connection, client") as refused:
        plan_route(ROUTES, "chat", hash_mode=value)
    assert refused.value.details["field"] == "hash"


def entry(route_index, address, word, direct):
    return encode_client_key(route_index, ipaddress.ip_address(address)), (word, direct)


def test_addresses_count_only_at_the_routes_current_weight_word():
    chat = Route("chat", 8080, 5000, 4, 0, hash_mode="client")
    other = Route("other", 8081, 2500, 2, 3, opt_in=True, hash_mode="client")
    entries = dict(
        [
            entry(0, "10.0.0.1", 5000, 1),
            entry(0, "10.0.0.2", 5000, 0),
            entry(0, "2001:db8::7", 5000, 1),
            entry(0, "10.0.0.3", 1000, 1),  # decided at an earlier weight: not yet again
            entry(3, "10.0.0.1", 2500 | WEIGHT_OPT_IN, 0),
            entry(3, "10.0.0.4", 2500, 1),  # before the opt-in bit was set
            entry(5, "10.0.0.1", 5000, 1),  # a route not asked about
        ]
    )
    assert count_client_addresses(entries, [chat, other]) == {
        0: {"to_engine": 2, "to_proxy": 1},
        3: {"to_engine": 0, "to_proxy": 1},
    }
    assert count_client_addresses({}, [chat]) == {0: {"to_engine": 0, "to_proxy": 0}}
