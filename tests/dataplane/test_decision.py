"""The program's decision, checked with BPF_PROG_TEST_RUN against the Python model.

No traffic: each run feeds the program one struct bpf_sk_lookup and reads back
the cookie of the socket it selected (0 for none, the proxy's path).
"""

import os
import socket
import struct

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    read_slots,
    register_engine_socket,
    unregister_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import load_program
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    read_counters,
    read_latency_buckets,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    FAMILIES_MAP,
    ROUTES_MAP,
    SOCKETS_MAP,
    ensure_pin_dirs,
    opened,
    opened_map,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    FAMILIES_VALUE,
    LATENCY_SAMPLE_SHIFT,
    SOCKET_VALUE,
    encode_port,
    encode_route,
    socket_key,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)

from .decision_model import (
    IPPROTO_UDP,
    Seeds,
    chosen_slot,
    is_timed,
    sk_lookup_ctx,
    takes_engine_path,
    tuple_hash,
)

SK_PASS = 1
PORT = 8080
CLIENT = "10.1.2.3"
SERVER = "10.0.0.1"
CLIENT6 = "fd00:2::1:2:3"
SERVER6 = "fd00::1"


@pytest.fixture
def loaded(layout, router_object):
    """The program and its maps pinned, not attached anywhere: test runs only."""
    ensure_pin_dirs(layout)
    load_program(router_object, layout.prog, layout, reuse_maps=False)
    return layout


def cookie_of(sock):
    return struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, 57, 8))[0]


def decide(layout, remote_port, protocol=6, local_port=PORT, client=CLIENT, server=SERVER):
    """Run the program on one connection; return the selected socket's cookie (0: none)."""
    with opened(layout.prog) as prog_fd:
        retval, ctx_out, _ = bpf_syscall.prog_test_run(
            prog_fd, sk_lookup_ctx(client, remote_port, server, local_port, protocol)
        )
    assert retval == SK_PASS  # the program never drops
    return struct.unpack_from("=Q", ctx_out, 0)[0]


def register(layout, sock, slot=0, route="svc"):
    return register_engine_socket(
        layout, route, os.getpid(), sock.getsockname()[1], slot=slot, timeout=5
    )


def test_no_route_selects_nothing_and_counts_nothing(loaded, listeners):
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, listeners())
    assert decide(loaded, 40000, local_port=PORT + 1) == 0
    assert decide(loaded, 40000, protocol=IPPROTO_UDP) == 0
    assert read_counters(loaded, 0)["lookups"] == 0


def test_weight_0_never_and_10000_always_takes_the_engine(loaded, listeners):
    engine = listeners()
    set_route(loaded, "svc", port=PORT, weight=0)
    register(loaded, engine)
    assert all(decide(loaded, port) == 0 for port in range(40000, 40200))
    set_route(loaded, "svc", weight=100)
    assert all(decide(loaded, port) == cookie_of(engine) for port in range(40000, 40200))
    counters = read_counters(loaded, 0)
    assert counters == {
        "lookups": 400,
        "to_engine": 200,
        "to_proxy_by_weight": 200,
        "fallback_no_socket": 0,
        "assign_errors": 0,
    }
    # Only the sample of decisions the 4-tuple picks is timed, each connection once per run.
    timed = [
        port
        for port in range(40000, 40200)
        if is_timed((CLIENT, port, SERVER, PORT), LATENCY_SAMPLE_SHIFT, Seeds.of(loaded))
    ]
    assert timed, "no tuple of the sample range is timed; widen the range"
    assert sum(read_latency_buckets(loaded)) == 2 * len(timed)


def test_decision_matches_the_hash_model_at_the_weight_edge(loaded, listeners):
    engine = listeners()
    set_route(loaded, "svc", port=PORT, weight=0)
    register(loaded, engine)
    for remote_port in (40001, 41234, 55555):
        edge_bp = tuple_hash(CLIENT, remote_port, SERVER, PORT, Seeds.of(loaded).weight) % 10000
        set_route(loaded, "svc", weight=edge_bp / 100.0)  # hash == weight: proxy
        assert decide(loaded, remote_port) == 0
        set_route(loaded, "svc", weight=(edge_bp + 1) / 100.0)  # hash < weight: engine
        assert decide(loaded, remote_port) == cookie_of(engine)


def test_decisions_follow_the_model_and_are_deterministic(loaded, listeners):
    engine = listeners()
    set_route(loaded, "svc", port=PORT, weight=37.5)
    register(loaded, engine)
    ports = range(30000, 30600)
    first = [decide(loaded, port) for port in ports]
    expected = [
        cookie_of(engine)
        if takes_engine_path((CLIENT, port, SERVER, PORT), 3750, Seeds.of(loaded))
        else 0
        for port in ports
    ]
    assert first == expected
    assert [decide(loaded, port) for port in ports] == first
    assert 0 < first.count(0) < len(first)  # both paths occur


def test_ipv6_decisions_follow_the_model(loaded, listeners):
    engine = listeners("::1")
    set_route(loaded, "svc", port=PORT, weight=37.5)
    register(loaded, engine)
    ports = range(30000, 30400)
    chosen = [decide(loaded, port, client=CLIENT6, server=SERVER6) for port in ports]
    expected = [
        cookie_of(engine)
        if takes_engine_path((CLIENT6, port, SERVER6, PORT), 3750, Seeds.of(loaded))
        else 0
        for port in ports
    ]
    assert chosen == expected
    assert 0 < chosen.count(0) < len(chosen)
    # The address words are all hashed: another client prefix gives other decisions.
    other = [decide(loaded, port, client="fd00:1::9", server=SERVER6) for port in ports]
    assert other != chosen


def test_only_a_dual_stack_socket_takes_ipv4_connections(loaded, listeners):
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, listeners("::1"))  # IPV6_V6ONLY: the kernel would refuse it for IPv4
    # Not a candidate for IPv4 at all: the proxy takes it, and nothing is refused.
    assert decide(loaded, 40000) == 0
    assert read_counters(loaded, 0)["fallback_no_socket"] == 1
    assert read_counters(loaded, 0)["assign_errors"] == 0
    dual_stack = listeners("::", v6only=False)
    register(loaded, dual_stack)
    assert decide(loaded, 40000) == cookie_of(dual_stack)
    assert decide(loaded, 40000, client=CLIENT6, server=SERVER6) == cookie_of(dual_stack)
    assert read_counters(loaded, 0)["to_engine"] == 2


def test_each_family_uses_only_the_sockets_that_can_take_it(loaded, listeners):
    """One socket per family on one route (the runbook's way): no connection is refused."""
    engine4, engine6 = listeners("127.0.0.1"), listeners("::1")
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, engine4, slot=0)
    register(loaded, engine6, slot=1)
    ports = range(20000, 20200)
    assert {decide(loaded, port) for port in ports} == {cookie_of(engine4)}
    assert {decide(loaded, port, client=CLIENT6, server=SERVER6) for port in ports} == {
        cookie_of(engine6)
    }
    counters = read_counters(loaded, 0)
    assert counters["to_engine"] == 400
    assert counters["assign_errors"] == counters["fallback_no_socket"] == 0


def test_a_socket_of_unknown_families_may_be_tried_and_its_refusal_counted(loaded, listeners):
    """Bits 0: a socket registered before the families were kept (layout 1)."""
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, listeners("::1"))
    with opened_map(loaded, FAMILIES_MAP) as map_fd:
        bpf_syscall.map_update(map_fd, socket_key(0, 0), FAMILIES_VALUE.pack(0))
    assert decide(loaded, 40000) == 0
    assert read_counters(loaded, 0)["assign_errors"] == 1


def test_two_nodes_decide_differently_for_the_same_tuples(
    loaded, second_layout, listeners, router_object
):
    engine = listeners()
    ensure_pin_dirs(second_layout)
    load_program(router_object, second_layout.prog, second_layout, reuse_maps=False)
    assert Seeds.of(loaded) != Seeds.of(second_layout)
    for node in (loaded, second_layout):
        set_route(node, "svc", port=PORT, weight=50)
        register(node, engine)
    ports = range(30000, 30400)
    here = [decide(loaded, port) for port in ports]
    there = [decide(second_layout, port) for port in ports]
    # Same weight, other seed: about half the tuples differ (each node still follows its model).
    differ = sum(a != b for a, b in zip(here, there))
    assert 100 < differ < 300, differ
    for node, chosen in ((loaded, here), (second_layout, there)):
        seeds = Seeds.of(node)
        assert chosen == [
            cookie_of(engine) if takes_engine_path((CLIENT, p, SERVER, PORT), 5000, seeds) else 0
            for p in ports
        ]


def test_a_program_upgrade_keeps_every_tuples_path(loaded, listeners, upgraded_object):
    engine = listeners()
    set_route(loaded, "svc", port=PORT, weight=50)
    register(loaded, engine)
    ports = range(30000, 30400)
    before = [decide(loaded, port) for port in ports]
    seeds = Seeds.of(loaded)
    load_program(upgraded_object, loaded.next_prog, loaded, reuse_maps=True)
    with opened(loaded.prog) as old, opened(loaded.next_prog) as new:
        assert bpf_syscall.prog_info(old)["tag"] != bpf_syscall.prog_info(new)["tag"]
    os.unlink(loaded.prog)  # bpffs has no rename: pin the new program under the old name
    with opened(loaded.next_prog) as new:
        bpf_syscall.obj_pin(new, loaded.prog)
    os.unlink(loaded.next_prog)
    assert Seeds.of(loaded) == seeds
    assert [decide(loaded, port) for port in ports] == before


def test_empty_slots_are_skipped_and_live_ones_chosen_by_hash(loaded, listeners):
    engines = {3: listeners(), 6: listeners()}
    set_route(loaded, "svc", port=PORT, weight=100)
    for slot, sock in engines.items():
        register(loaded, sock, slot=slot)
    ports = range(20000, 20400)
    chosen = [decide(loaded, port) for port in ports]
    expected = [
        cookie_of(engines[chosen_slot((CLIENT, port, SERVER, PORT), engines, Seeds.of(loaded))])
        for port in ports
    ]
    assert chosen == expected
    assert set(chosen) == {cookie_of(sock) for sock in engines.values()}

    unregister_engine_socket(loaded, "svc", slot=3)
    assert {decide(loaded, port) for port in ports} == {cookie_of(engines[6])}


def route_entry(layout):
    (route,) = read_routes(layout)
    return route


def test_slot_limit_follows_the_highest_live_slot(loaded, listeners):
    set_route(loaded, "svc", port=PORT, weight=100)
    assert route_entry(loaded).slot_limit == 0
    engines = {3: listeners(), 6: listeners()}
    for slot, sock in engines.items():
        register(loaded, sock, slot=slot)
    assert route_entry(loaded).slot_limit == 7
    generation = route_entry(loaded).generation
    register(loaded, engines[3], slot=3)  # already there: no write
    assert route_entry(loaded).generation == generation
    unregister_engine_socket(loaded, "svc", slot=6)
    assert route_entry(loaded).slot_limit == 4
    assert route_entry(loaded).generation == generation + 1
    unregister_engine_socket(loaded, "svc", slot=3)
    assert route_entry(loaded).slot_limit == 0


def test_the_program_looks_only_below_the_slot_limit(loaded, listeners):
    low, high = listeners(), listeners()
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, low, slot=0)
    # A socket put straight into slot 5, the limit left at 1: the program does not see it.
    with opened_map(loaded, SOCKETS_MAP) as map_fd:
        bpf_syscall.map_update(map_fd, socket_key(0, 5), SOCKET_VALUE.pack(high.fileno()))
    ports = range(20000, 20100)
    assert {decide(loaded, port) for port in ports} == {cookie_of(low)}
    # Limit 0 (an entry written before the limit existed): every slot is looked at.
    with opened_map(loaded, ROUTES_MAP) as map_fd:
        entry = route_entry(loaded).replace(slot_limit=0)
        bpf_syscall.map_update(map_fd, encode_port(PORT), encode_route(entry))
    assert {decide(loaded, port) for port in ports} == {cookie_of(low), cookie_of(high)}


def test_check_mode_registration_writes_nothing(loaded, listeners):
    set_route(loaded, "svc", port=PORT, weight=100)
    before = route_entry(loaded)
    result = register_engine_socket(
        loaded, "svc", os.getpid(), listeners().getsockname()[1], timeout=5, check_mode=True
    )
    assert result["changed"] is True
    assert route_entry(loaded) == before
    assert read_slots(loaded, 0) == {}


def test_no_live_socket_falls_back_and_is_counted(loaded, listeners):
    engine = listeners()
    set_route(loaded, "svc", port=PORT, weight=100)
    register(loaded, engine)
    engine.close()  # the kernel drops a closed socket from the sockmap by itself
    assert decide(loaded, 40000) == 0
    assert read_counters(loaded, 0)["fallback_no_socket"] == 1


def test_a_socket_the_kernel_refuses_is_an_assign_error(loaded):
    set_route(loaded, "svc", port=PORT, weight=100)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind(("127.0.0.1", 0))
        # Written straight into the map: register_engine_socket would refuse a UDP socket.
        with opened_map(loaded, SOCKETS_MAP) as map_fd:
            bpf_syscall.map_update(map_fd, socket_key(0, 0), SOCKET_VALUE.pack(udp.fileno()))
        assert decide(loaded, 40000) == 0
    finally:
        udp.close()
    counters = read_counters(loaded, 0)
    assert counters["assign_errors"] == 1
    assert counters["to_engine"] == 0


def test_the_copied_fd_must_be_the_socket_the_scan_found(loaded, listeners):
    """A reused fd number or pid could hand over another listener: the copy is checked."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
        check_engine_socket,
        describe_socket,
    )

    scanned, other = listeners(), listeners()
    here = router_lifecycle.netns_inode(router_lifecycle.SELF_NETNS)
    found_inode = os.fstat(scanned.fileno()).st_ino
    found_port = scanned.getsockname()[1]
    # The fd now holds another listener (the engine closed fd N and opened a new one).
    info = describe_socket(other.fileno())
    with pytest.raises(FleetError, match="not the listener %d the scan found" % found_inode):
        check_engine_socket(info, "inet", here, inode=found_inode, port=found_port)
    with pytest.raises(FleetError, match="bound to port %d, not %d" % (info["port"], found_port)):
        check_engine_socket(info, "inet", here, inode=info["inode"], port=found_port)
    check_engine_socket(describe_socket(scanned.fileno()), "inet", here, found_inode, found_port)
    with open(__file__) as not_a_socket, pytest.raises(FleetError, match="is not a socket"):
        describe_socket(not_a_socket.fileno())
