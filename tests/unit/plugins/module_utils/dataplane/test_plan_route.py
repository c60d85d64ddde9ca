"""What a route write would do, decided before anything is written."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    MAX_ROUTES,
    Route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import plan_route

ROUTES = [Route("chat", 8080, 500, 4, 0), Route("embed", 8081, 0, 1, 2)]


def test_new_route_takes_the_lowest_free_index_and_generation_1():
    assert plan_route(ROUTES, "rerank", port=8082, weight="2.5") == Route("rerank", 8082, 250, 1, 1)


def test_new_route_without_weight_starts_at_zero():
    assert plan_route([], "chat", port=8080).weight_bp == 0


def test_weight_change_bumps_generation_and_keeps_port_and_index():
    assert plan_route(ROUTES, "chat", weight=20) == Route("chat", 8080, 2000, 5, 0)


def test_same_weight_is_no_change():
    assert plan_route(ROUTES, "chat", weight=5) is None
    assert plan_route(ROUTES, "chat", port=8080, weight="5.00") is None
    assert plan_route(ROUTES, "chat") is None


def test_unknown_route_without_port_names_the_known_routes():
    with pytest.raises(
        FleetError, match=r"name 'rerank' is not a known route \(known routes: chat, embed\)"
    ):
        plan_route(ROUTES, "rerank", weight=5)


def test_port_of_another_route_is_refused():
    with pytest.raises(FleetError, match="port 8081 is already routed by route 'embed'") as caught:
        plan_route(ROUTES, "rerank", port=8081)
    assert caught.value.details["field"] == "port"


def test_port_cannot_change_in_place():
    with pytest.raises(FleetError, match="port of route 'chat' is 8080 and cannot change"):
        plan_route(ROUTES, "chat", port=9090, weight=5)


def test_bad_weight_is_refused_before_anything_else():
    with pytest.raises(FleetError, match=r"^weight must be"):
        plan_route(ROUTES, "chat", weight=-1)


def test_full_route_table_is_refused():
    full = [Route("r%d" % i, 1000 + i, 0, 1, i) for i in range(MAX_ROUTES)]
    with pytest.raises(FleetError, match="all 64 routes are in use"):
        plan_route(full, "one-more", port=9999)
