"""Routes that hash by client (route option hash: client): one client, one path.

At a given weight every connection of one client address takes the same path, and the same
engine socket among several; the router notes each address's path in zl_clients and
route_info counts the addresses at the current weight. Real connections from clients bound
to distinct loopback addresses in a netns, BPF_PROG_TEST_RUN for IPv6, the pins of the
release before (map layout 3) for the refusals and the upgrade.
"""

import ipaddress
import os
import socket
import struct
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    router_lifecycle,
    routes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
    add_maps_of_newer_layout,
    find_bpftool,
    load_program,
    write_new_seeds,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    client_route_index,
    read_client_entries,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CONFIG_MAP,
    ensure_pin_dirs,
    map_names_of_layout,
    opened,
    pinned_layout_version,
    read_layout_config,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CONFIG_KEY,
    CONFIG_VALUE,
    HASH_BY_CLIENT,
    LAYOUT_VERSION,
    decode_client_key,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.report import router_report

from .conftest import BPF_DIR, ENGINE_PORT, SERVICE_PORT, maps_bytes, ok, routectl, run
from .decision_model import (
    Seeds,
    client_slot,
    client_takes_engine_path,
    sk_lookup_ctx,
)

# 24 clients, each on its own loopback address; 10 connections each.
CLIENTS = ["127.0.0.%d" % n for n in range(10, 34)]
PER_CLIENT = 10
SECOND_ENGINE_PORT = ENGINE_PORT + 1
LAYOUT3_RELEASE = os.path.join(os.path.dirname(__file__), "layout3_release")


@pytest.fixture
def routed(layout, netns, router_object, proxy, engine):
    """Router attached to the netns, route svc on the service port, engine in slot 0."""
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=0)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    return layout


def paths_by_client(netns, clients=CLIENTS, count=PER_CLIENT):
    """{client address: the set of servers its connections reached}."""
    report = netns.clients(count=count, client_hosts=clients)
    assert report["errors"] == 0, report["error_samples"]
    return {client: set(bodies) for client, bodies in report["by_source_host"].items()}


def route_of(layout, name="svc"):
    (route,) = [r for r in router_report(layout)["routes"] if r["name"] == name]
    return route


def one_path_each(paths):
    """{client: its one path}; fails when a client's connections took both."""
    split = {client: servers for client, servers in paths.items() if len(servers) != 1}
    assert not split, "clients whose connections took more than one path: %s" % split
    return {client: next(iter(servers)) for client, servers in paths.items()}


def test_at_50_percent_every_client_keeps_one_path_and_its_address_is_counted(routed, netns):
    result = set_route(routed, "svc", weight=50, hash_mode="client")
    assert result["changed"] and result["before"].hash_mode == "connection"
    assert result["after"].hash_mode == HASH_BY_CLIENT
    assert result["after"].generation == result["before"].generation + 1

    paths = one_path_each(paths_by_client(netns))
    seeds = Seeds.of(routed)
    assert paths == {
        client: "engine" if client_takes_engine_path(client, 5000, seeds) else "proxy"
        for client in CLIENTS
    }
    to_engine = sum(1 for path in paths.values() if path == "engine")
    assert 0 < to_engine < len(CLIENTS), paths  # both paths are in use

    route = route_of(routed)
    assert route["hash"] == "client"
    assert route["clients"] == {"to_engine": to_engine, "to_proxy": len(CLIENTS) - to_engine}
    assert route["counters"]["lookups"] == len(CLIENTS) * PER_CLIENT
    assert route["counters"]["to_engine"] == to_engine * PER_CLIENT
    shown = ok(routed, "show")
    (shown_route,) = shown["routes"]
    assert shown_route["hash"] == "client" and shown_route["clients"] == route["clients"]

    # The same clients again: their entries are as they were (one lookup each, no write).
    entries = read_client_entries(routed)
    assert one_path_each(paths_by_client(netns, count=2)) == paths
    assert read_client_entries(routed) == entries
    noted = {str(decode_client_key(key)[1]): direct for key, (_word, direct) in entries.items()}
    assert noted == {client: int(paths[client] == "engine") for client in CLIENTS}


def test_hash_by_connection_splits_one_clients_connections(routed, netns):
    client = [CLIENTS[0]]
    set_route(routed, "svc", weight=50)
    assert route_of(routed)["hash"] == "connection"
    assert paths_by_client(netns, client, 40) == {CLIENTS[0]: {"engine", "proxy"}}
    assert "clients" not in route_of(routed)
    assert read_client_entries(routed) == {}  # connection-hash routes note nothing

    set_route(routed, "svc", hash_mode="client")
    assert len(paths_by_client(netns, client, 40)[CLIENTS[0]]) == 1
    set_route(routed, "svc", hash_mode="connection")
    assert paths_by_client(netns, client, 40) == {CLIENTS[0]: {"engine", "proxy"}}


def test_the_addresses_count_at_the_current_weight_only(routed, netns):
    set_route(routed, "svc", weight=100, hash_mode="client")
    one_path_each(paths_by_client(netns, CLIENTS[:6], 3))
    assert route_of(routed)["clients"] == {"to_engine": 6, "to_proxy": 0}

    # A fast rollback: the weight word changes, the hash stays; no address counts until
    # clients come at the new weight.
    _before, fence_epoch = routes.fence_routes(routed)
    failures, confirmed = routes.roll_back_and_read(routed)
    assert failures == {} and [(r.weight_bp, r.hash_mode) for r in confirmed] == [(0, "client")]
    assert route_of(routed)["clients"] == {"to_engine": 0, "to_proxy": 0}
    assert one_path_each(paths_by_client(netns, CLIENTS[:4], 2)) == dict.fromkeys(
        CLIENTS[:4], "proxy"
    )
    assert route_of(routed)["clients"] == {"to_engine": 0, "to_proxy": 4}

    # Back at 100: the three that come count, and so do the two of the first stretch at 100
    # that have not come since (an address's path at one weight is always the same).
    set_route(routed, "svc", weight=100, epoch=fence_epoch)
    one_path_each(paths_by_client(netns, CLIENTS[:3], 1))
    assert route_of(routed)["clients"] == {"to_engine": 5, "to_proxy": 0}

    # A removed route's addresses go with it: a route that takes its index starts at none.
    (index,) = [r.route_index for r in routes.read_routes(routed)]
    routes.remove_route(routed, "svc")
    assert [k for k in read_client_entries(routed) if client_route_index(k) == index] == []
    set_route(routed, "again", port=SERVICE_PORT, weight=100, hash_mode="client", epoch=fence_epoch)
    assert route_of(routed, "again")["clients"] == {"to_engine": 0, "to_proxy": 0}


def test_the_engine_socket_follows_the_client_too(layout, netns, router_object, proxy, engine):
    second = netns.start_nginx(SECOND_ENGINE_PORT, "engine2")
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=100, hash_mode="client")
    for slot, (pid, port) in enumerate(
        ((engine.pid, ENGINE_PORT), (second.pid, SECOND_ENGINE_PORT))
    ):
        register_engine_socket(layout, "svc", pid, port, slot=slot, family="inet", timeout=10)

    paths = one_path_each(paths_by_client(netns))
    seeds = Seeds.of(layout)
    engines = {0: "engine", 1: "engine2"}
    assert paths == {client: engines[client_slot(client, [0, 1], seeds)] for client in CLIENTS}
    assert set(paths.values()) == {"engine", "engine2"}
    assert route_of(layout)["clients"] == {"to_engine": len(CLIENTS), "to_proxy": 0}


@pytest.fixture
def loaded(layout, router_object):
    """The program and its maps pinned, not attached: route svc hashing by client."""
    ensure_pin_dirs(layout)
    load_program(router_object, layout.prog, layout, reuse_maps=False)
    set_route(layout, "svc", port=SERVICE_PORT, weight=50, hash_mode="client")
    return layout


def decide(layout, client, remote_port):
    server = "fd00::1" if ":" in client else "10.0.0.1"
    with opened(layout.prog) as prog_fd:
        _retval, ctx_out, _duration = bpf_syscall.prog_test_run(
            prog_fd, sk_lookup_ctx(client, remote_port, server, SERVICE_PORT, 6)
        )
    return struct.unpack_from("=Q", ctx_out, 0)[0]


def test_ipv6_and_ipv4_clients_against_the_model_and_cohorts_not_noted(loaded, listeners):
    engine = listeners("::", v6only=False)  # dual stack: takes both families
    register_engine_socket(loaded, "svc", os.getpid(), engine.getsockname()[1], timeout=5)
    cookie = struct.unpack("=Q", engine.getsockopt(socket.SOL_SOCKET, 57, 8))[0]
    seeds = Seeds.of(loaded)
    clients = ["fd00:7::%x" % n for n in range(1, 25)] + ["10.7.0.%d" % n for n in range(1, 25)]
    for client in clients:
        expected = cookie if client_takes_engine_path(client, 5000, seeds) else 0
        assert {decide(loaded, client, port) for port in range(40000, 40006)} == {expected}
    noted = {
        str(decode_client_key(key)[1]): direct
        for key, (_word, direct) in read_client_entries(loaded).items()
    }
    assert noted == {
        str(ipaddress.ip_address(c)): int(client_takes_engine_path(c, 5000, seeds)) for c in clients
    }
    assert 0 < sum(noted.values()) < len(clients)

    # The opt-in cohort goes direct whatever the hash, and is not noted: its path does not
    # follow the weight. The never_direct cohort neither.
    set_route(loaded, "svc", always_direct=["fd00:9::/64"], never_direct=["10.9.0.0/16"])
    before = read_client_entries(loaded)
    assert decide(loaded, "fd00:9::1", 40000) == cookie
    assert decide(loaded, "10.9.0.1", 40000) == 0
    assert read_client_entries(loaded) == before


BAD_HASHES = ["sideways", "Client", "", " client", 1, True, ["client"]]


@pytest.mark.parametrize("value", BAD_HASHES, ids=[repr(v) for v in BAD_HASHES])
def test_a_bad_hash_is_refused_and_changes_nothing(loaded, value):
    before = maps_bytes(loaded)
    with pytest.raises(FleetError, match="hash must be one of connection, client") as refused:
        set_route(loaded, "svc", weight=10, hash_mode=value)
    assert refused.value.details["field"] == "hash"
    assert maps_bytes(loaded) == before


def test_a_hash_on_a_route_that_does_not_exist_is_refused_and_check_mode_writes_nothing(loaded):
    before = maps_bytes(loaded)
    with pytest.raises(FleetError, match="give port to create it"):
        set_route(loaded, "nosuch", hash_mode="client")
    status, error = routectl(loaded, "set-weight", "--route", "svc", "--hash", "per-user")
    assert status == 2 and error["field"] == "hash", error
    assert "one of connection, client" in error["error"], error
    preview = set_route(loaded, "svc", hash_mode="connection", check_mode=True)
    assert preview["changed"] and preview["after"].hash_mode == "connection"
    assert maps_bytes(loaded) == before


@pytest.fixture(scope="session")
def layout3_object(tmp_path_factory):
    """The router before hashing by client (map layout 3), built from its own sources."""
    out = str(tmp_path_factory.mktemp("bpf-layout3") / "zerolayer_router-layout3.bpf.o")
    makefile = os.path.join(BPF_DIR, "Makefile")
    run(["make", "-s", "-f", makefile, "-C", LAYOUT3_RELEASE, "OUT=" + out])
    return out


def set_up_as_the_layout3_release(layout, object_path, netns_path):
    """What the layout 3 release's attach did: bpftool pinning ten maps, its seeds and
    layout number in zl_config, then the link. Returns the seeds."""
    ensure_pin_dirs(layout)
    argv = [find_bpftool(), "prog", "load", object_path, layout.prog, "type", "sk_lookup"]
    subprocess.run([*argv, "pinmaps", layout.maps_dir], check=True, capture_output=True)
    write_new_seeds(layout)
    with opened(layout.map(CONFIG_MAP)) as fd:
        _v, _r, seed_weight, seed_slot = CONFIG_VALUE.unpack(
            bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size)
        )
        bpf_syscall.map_update(
            fd, CONFIG_KEY.pack(0), CONFIG_VALUE.pack(3, 0, seed_weight, seed_slot)
        )
    router_lifecycle._create_link(layout, netns_path)
    return seed_weight, seed_slot


def test_pins_of_layout_3_refuse_client_hash_until_an_attach_upgrades_them(
    layout, netns, router_object, layout3_object, proxy, engine
):
    seeds = set_up_as_the_layout3_release(layout, layout3_object, netns.path)
    assert pinned_layout_version(layout) == 3
    assert sorted(os.listdir(layout.maps_dir)) == sorted(map_names_of_layout(3))

    # Today's code on the pins as they are: weights, cohorts; hash: client refused, unwritten.
    set_route(layout, "svc", port=SERVICE_PORT, weight=50, never_direct=["127.0.0.200/32"])
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    assert paths_by_client(netns, CLIENTS[:1], 40) == {CLIENTS[0]: {"engine", "proxy"}}
    assert route_of(layout)["hash"] == "connection" and "clients" not in route_of(layout)
    before = maps_bytes(layout)
    with pytest.raises(FleetError, match="upgrade them to layout 4") as refused:
        set_route(layout, "svc", hash_mode="client")
    assert refused.value.details["field"] == "hash"
    status, error = routectl(layout, "set-weight", "--route", "svc", "--hash", "client")
    assert status == 2 and error["field"] == "hash", error
    assert set_route(layout, "svc", hash_mode="connection")["changed"] is False
    assert maps_bytes(layout) == before

    # An attach whose program load failed after it added zl_clients: the layout 3 program
    # still runs, never reads the flag, and would go on hashing by connection. Refused.
    assert add_maps_of_newer_layout(layout) == ["zl_clients"]
    assert pinned_layout_version(layout) == LAYOUT_VERSION
    before = maps_bytes(layout)
    with pytest.raises(FleetError, match="predates hashing by client") as refused:
        set_route(layout, "svc", hash_mode="client")
    assert refused.value.details["field"] == "hash"
    with pytest.raises(FleetError, match="predates hashing by client"):
        set_route(layout, "new", port=SERVICE_PORT + 1, hash_mode="client")
    assert maps_bytes(layout) == before

    # The attach that swaps today's program in: seeds, routes and cohorts kept.
    result = router_lifecycle.attach(layout, router_object, netns.path)
    assert any(action.startswith("upgrade program") for action in result["actions"]), result
    assert read_layout_config(layout) == (LAYOUT_VERSION, *seeds)
    assert route_of(layout)["never_direct"] == ["127.0.0.200/32"]
    set_route(layout, "svc", hash_mode="client")
    paths = one_path_each(paths_by_client(netns))
    assert set(paths.values()) == {"engine", "proxy"}
    to_engine = sum(1 for path in paths.values() if path == "engine")
    assert route_of(layout)["clients"] == {
        "to_engine": to_engine,
        "to_proxy": len(CLIENTS) - to_engine,
    }


def test_the_modules_and_routectl_set_and_return_the_hash(routed, netns):
    from .test_modules import ansible

    pin = {"pin_dir": routed.pin_dir, "fence_file": routed.fence_file}
    before = maps_bytes(routed)
    preview = ansible("route", name="svc", hash="client", weight=50, _check=True, **pin)
    assert preview["changed"], preview
    assert preview["diff"]["before"]["hash"] == "connection"
    assert preview["diff"]["after"]["hash"] == "client"
    assert preview["diff"]["after"]["weight"] == 50
    assert maps_bytes(routed) == before  # check mode wrote nothing

    done = ansible("route", name="svc", hash="client", weight=50, **pin)
    assert done["changed"] and done["before"]["hash"] == "connection", done
    assert done["after"]["hash"] == "client" and done["route"]["hash"] == "client", done
    again = ansible("route", name="svc", hash="client", **pin)
    assert again["changed"] is False, again
    kept = ansible("route", name="svc", weight=40, **pin)  # hash unchanged when omitted
    assert kept["changed"] and kept["after"]["hash"] == "client", kept

    paths = one_path_each(paths_by_client(netns))
    to_engine = sum(1 for path in paths.values() if path == "engine")
    info = ansible("route_info", name="svc", **pin)
    (route,) = info["routes"]
    assert route["hash"] == "client", route
    assert route["clients"] == {"to_engine": to_engine, "to_proxy": len(CLIENTS) - to_engine}

    before = maps_bytes(routed)
    refused = ansible("route", name="svc", hash="per-user", **pin)
    assert refused.get("failed"), refused
    assert "value of hash must be one of: connection, client" in refused["msg"], refused
    assert maps_bytes(routed) == before

    switched = ok(routed, "set-weight", "--route", "svc", "--hash", "connection")
    assert switched["changed"] is True, switched
    assert switched["before"]["hash"] == "client" and switched["after"]["hash"] == "connection"
    assert switched["after"]["weight"] == 40
    plain = ok(routed, "set-weight", "--route", "svc", "--weight", "40")
    assert "hash" not in plain["after"]  # a plain weight write prints what it always did
    (shown,) = ok(routed, "show")["routes"]
    assert shown["hash"] == "connection" and "clients" not in shown
