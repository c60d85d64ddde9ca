"""Real connections in a fresh netns: nginx proxy on the service port, nginx engine on its own.

Clients connect from inside the netns to 127.0.0.1:8080 (or [::1]:8080); the body says
who answered.
"""

import os
import socket

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    read_slots,
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import read_counters
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)

from .conftest import ENGINE_PORT, SERVICE_PORT, four_sigma_bounds
from .decision_model import Seeds, takes_engine_path

CONNECTIONS = 2500


@pytest.fixture
def routed(layout, netns, router_object, proxy, engine):
    """Router attached to the netns, route svc on the service port, engine in slot 0."""
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=0)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    return layout


def test_split_follows_the_weight(routed, netns):
    for percent in (0, 1, 5, 20, 100):
        set_route(routed, "svc", weight=percent)
        before = read_counters(routed, 0)
        report = netns.clients(count=CONNECTIONS)
        after = read_counters(routed, 0)
        served = report["served"]
        print("weight %s%%: %s" % (percent, served))
        assert report["errors"] == 0, report["error_samples"]
        assert set(served) <= {"proxy", "engine"}
        to_engine = served.get("engine", 0)
        low, high = four_sigma_bounds(CONNECTIONS, percent / 100.0)
        assert low <= to_engine <= high, (percent, served)
        # One lookup per connection, and the counters agree with what clients saw.
        assert after["lookups"] - before["lookups"] == CONNECTIONS
        assert after["to_engine"] - before["to_engine"] == to_engine
        assert after["to_proxy_by_weight"] - before["to_proxy_by_weight"] == served.get("proxy", 0)


def test_the_same_four_tuple_always_takes_the_same_path(routed, netns):
    set_route(routed, "svc", weight=50)
    source_ports = list(range(45000, 45024))
    report = netns.clients(count=6, source_ports=source_ports)
    assert report["errors"] == 0, report["error_samples"]
    paths = {port: set(bodies) for port, bodies in report["by_source_port"].items()}
    assert all(len(seen) == 1 for seen in paths.values()), paths
    assert {seen.pop() for seen in paths.values()} == {"proxy", "engine"}


def test_ipv6_connections_follow_the_weight_and_ipv4_ones_cannot_reach_a_v6_only_engine(
    layout, netns, router_object
):
    netns.start_nginx(SERVICE_PORT, "proxy", listen=("[::1]", "127.0.0.1"))
    engine6 = netns.start_nginx(ENGINE_PORT, "engine", listen=("[::1]",))
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=20)
    register_engine_socket(layout, "svc", engine6.pid, ENGINE_PORT, family="inet6", timeout=10)

    report = netns.clients(count=CONNECTIONS, host="::1")
    assert report["errors"] == 0, report["error_samples"]
    low, high = four_sigma_bounds(CONNECTIONS, 0.2)
    print("IPv6 at 20%%: %s" % report["served"])
    assert low <= report["served"].get("engine", 0) <= high, report["served"]

    set_route(layout, "svc", weight=50)
    source_ports = list(range(46000, 46016))
    by_port = netns.clients(count=3, source_ports=source_ports, host="::1")["by_source_port"]
    expected = {
        str(port): [
            "engine"
            if takes_engine_path(("::1", port, "::1", SERVICE_PORT), 5000, Seeds.of(layout))
            else "proxy"
        ]
        * 3
        for port in source_ports
    }
    assert by_port == expected

    # An IPv6-only engine socket cannot take an IPv4 connection: the router does not try
    # it (nothing refused), and the proxy serves it, no error for the client.
    set_route(layout, "svc", weight=100)
    assert netns.clients(count=200, host="::1")["served"] == {"engine": 200}
    before = read_counters(layout, 0)
    report = netns.clients(count=200)
    assert report["errors"] == 0 and report["served"] == {"proxy": 200}, report
    after = read_counters(layout, 0)
    assert after["fallback_no_socket"] - before["fallback_no_socket"] == 200
    assert after["assign_errors"] == before["assign_errors"]

    # The runbook's way: one engine socket per family on the route; each family reaches it.
    engine4 = netns.start_nginx(ENGINE_PORT, "engine", listen=("127.0.0.1",))
    register_engine_socket(
        layout, "svc", engine4.pid, ENGINE_PORT, slot=1, family="inet", timeout=10
    )
    assert netns.clients(count=200)["served"] == {"engine": 200}
    assert netns.clients(count=200, host="::1")["served"] == {"engine": 200}


def test_engines_in_several_slots_share_the_engine_path(routed, netns):
    second = netns.start_nginx(ENGINE_PORT + 1, "engine-b")
    register_engine_socket(routed, "svc", second.pid, ENGINE_PORT + 1, slot=1, timeout=10)
    set_route(routed, "svc", weight=100)
    report = netns.clients(count=1000)
    assert report["errors"] == 0, report["error_samples"]
    low, high = four_sigma_bounds(1000, 0.5)
    assert set(report["served"]) == {"engine", "engine-b"}
    assert low <= report["served"]["engine"] <= high


def test_killed_engine_sends_new_connections_to_the_proxy(routed, netns, engine):
    set_route(routed, "svc", weight=100)
    assert netns.clients(count=200)["served"] == {"engine": 200}
    netns.stop(engine)
    assert read_slots(routed, 0) == {}
    before = read_counters(routed, 0)
    report = netns.clients(count=1000)
    assert report["errors"] == 0, report["error_samples"]
    assert report["served"] == {"proxy": 1000}
    assert read_counters(routed, 0)["fallback_no_socket"] - before["fallback_no_socket"] == 1000


def test_detach_sends_everything_to_the_proxy_and_attach_restores(routed, netns, router_object):
    set_route(routed, "svc", weight=100)
    routes = read_routes(routed)
    detached = router_lifecycle.detach(routed)
    assert detached["changed"] and not detached["after"]["attached"]
    assert not os.path.exists(routed.link)
    assert netns.clients(count=500)["served"] == {"proxy": 500}
    assert router_lifecycle.detach(routed)["changed"] is False

    attached = router_lifecycle.attach(routed, router_object, netns.path)
    assert attached["actions"] == ["create link in netns %d" % os.stat(netns.path).st_ino]
    assert read_routes(routed) == routes
    assert netns.clients(count=500)["served"] == {"engine": 500}


def test_upgrade_under_load_drops_nothing_and_keeps_routes(routed, netns, upgraded_object):
    set_route(routed, "svc", weight=20)
    set_route(routed, "svc", weight=50)
    routes = read_routes(routed)
    assert routes[0].generation == 4  # created, slot limit set by the engine, two weights
    old_tag = router_lifecycle.router_state(routed)["program"]["tag"]
    stop = netns.background_clients()
    try:
        first = netns.clients(count=300)  # traffic before the swap, beside the background load
        result = router_lifecycle.attach(routed, upgraded_object, netns.path)
        second = netns.clients(count=300)
    finally:
        report = stop()
    assert result["changed"]
    assert result["after"]["program"]["tag"] != old_tag
    assert result["after"]["attached"]
    assert result["before"]["link"]["id"] == result["after"]["link"]["id"]  # same link, new program
    print("upgrade under load: background %s, before %s, after %s" % (report, first, second))
    assert report["errors"] == 0, report["error_samples"]
    assert first["errors"] == second["errors"] == 0
    assert set(report["served"]) == {"proxy", "engine"}
    assert set(second["served"]) == {"proxy", "engine"}
    assert read_routes(routed) == routes
    assert read_slots(routed, 0)  # the engine socket survived the swap
    # Same object again: nothing to do.
    again = router_lifecycle.attach(routed, upgraded_object, netns.path)
    assert again["changed"] is False


def test_engine_socket_from_another_netns_is_refused(routed, netns, tmp_path):
    # A listener of this test process lives in the host netns, not the router's.
    sock = socket.socket()
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(FleetError, match="not the router's netns"):
            register_engine_socket(
                routed, "svc", os.getpid(), sock.getsockname()[1], slot=2, timeout=2
            )
    finally:
        sock.close()
    assert 2 not in read_slots(routed, 0)


def test_socket_not_listening_is_not_found(routed, netns, engine):
    with pytest.raises(FleetError, match="holds no TCP socket listening on port 9999"):
        register_engine_socket(routed, "svc", engine.pid, 9999, slot=1, timeout=1)
    with pytest.raises(FleetError, match="family inet6"):
        register_engine_socket(
            routed, "svc", engine.pid, ENGINE_PORT, slot=1, family="inet6", timeout=1
        )
