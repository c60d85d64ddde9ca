"""The cohorts: per-route client sets by source CIDR, decided in the kernel.

never_direct (opt-out) wins over always_direct (opt-in), which wins over the weight. The
opt-in cohort rides on the weight word's high bit, so every fast rollback clears it with
the weight in one write. Real connections in a netns (clients bound to 127.0.0.x), and
BPF_PROG_TEST_RUN for IPv6 and the per-route keys.
"""

import json
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
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import FenceRefused
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
    add_maps_of_newer_layout,
    find_bpftool,
    load_program,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    read_cohort_counters,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    ROUTES_MAP,
    WEIGHTS_MAP,
    ensure_pin_dirs,
    map_names_of_layout,
    opened,
    opened_map,
    pinned_layout_version,
    read_layout_config,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    LAYOUT_VERSION,
    MAX_COHORT_ENTRIES,
    PORT_KEY,
    WEIGHT_OPT_IN,
    WEIGHT_VALUE,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.report import router_report

from .conftest import BPF_DIR, ENGINE_PORT, SERVICE_PORT, maps_bytes, ok, routectl, run
from .decision_model import sk_lookup_ctx

OPT_IN = "127.0.0.2"
OPT_OUT = "127.0.0.3"
OTHER = "127.0.0.4"
COUNT = 40
LAYOUT2_RELEASE = os.path.join(os.path.dirname(__file__), "layout2_release")


@pytest.fixture
def routed(layout, netns, router_object, proxy, engine):
    """Router attached to the netns, route svc on the service port, engine in slot 0."""
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=0)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    return layout


def served_from(netns, source):
    report = netns.clients(count=COUNT, source_host=source)
    assert report["errors"] == 0, report["error_samples"]
    return report["served"]


def route_of(layout, name="svc"):
    (route,) = [r for r in router_report(layout)["routes"] if r["name"] == name]
    return route


def test_opt_in_goes_direct_at_0_opt_out_stays_on_the_proxy_at_100(routed, netns):
    result = set_route(
        routed, "svc", always_direct=[OPT_IN + "/32"], never_direct=[OPT_OUT + "/32"]
    )
    assert result["changed"] and result["after"].opt_in
    assert result["cohorts_after"] == {
        "always_direct": ["127.0.0.2/32"],
        "never_direct": ["127.0.0.3/32"],
    }
    assert served_from(netns, OPT_IN) == {"engine": COUNT}
    assert served_from(netns, OPT_OUT) == {"proxy": COUNT}
    assert served_from(netns, OTHER) == {"proxy": COUNT}

    set_route(routed, "svc", weight=100)  # cohorts unchanged when omitted
    assert served_from(netns, OPT_IN) == {"engine": COUNT}
    assert served_from(netns, OPT_OUT) == {"proxy": COUNT}
    assert served_from(netns, OTHER) == {"engine": COUNT}

    route = route_of(routed)
    assert route["opt_in"] is True
    assert route["always_direct"] == ["127.0.0.2/32"]
    assert route["never_direct"] == ["127.0.0.3/32"]
    counters = route["counters"]
    assert counters["to_engine_opt_in"] == 2 * COUNT
    assert counters["to_proxy_opt_out"] == 2 * COUNT
    assert counters["lookups"] == 6 * COUNT
    assert counters["to_engine"] == 3 * COUNT  # the opt-in cohort's are a part of it
    assert (
        counters["to_engine"]
        + counters["to_proxy_by_weight"]
        + counters["fallback_no_socket"]
        + counters["assign_errors"]
        + counters["to_proxy_opt_out"]
        == counters["lookups"]
    )
    assert read_cohort_counters(routed, 0) == {
        "to_engine_opt_in": 2 * COUNT,
        "to_proxy_opt_out": 2 * COUNT,
    }

    # A wider opt-in prefix with a narrower opt-out inside it: the opt-out wins there.
    set_route(routed, "svc", weight=0, always_direct=["127.0.0.0/29"], never_direct=[OPT_OUT])
    assert served_from(netns, OTHER) == {"engine": COUNT}
    assert served_from(netns, OPT_OUT) == {"proxy": COUNT}
    # [] clears.
    set_route(routed, "svc", always_direct=[], never_direct=[])
    assert route_of(routed)["opt_in"] is False
    assert route_of(routed)["always_direct"] == route_of(routed)["never_direct"] == []
    assert routes.read_cohort_entries(routed) == []
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}
    # The opt-in cohort's pooled direct connections leave too (the direct-drain marker).
    with open(routed.direct_drain_file) as handle:
        marker = json.load(handle)
    assert marker["ports"][str(SERVICE_PORT)]["reason"] == "cohorts of route 'svc'", marker


def stored_entry(layout, name="svc"):
    (entry,) = [e for e in routes.read_route_entries(layout) if e.name == name]
    return entry


def test_a_route_without_cohorts_has_the_program_skip_the_trie(routed, netns):
    set_route(routed, "svc", weight=100)
    assert stored_entry(routed).cohortless  # no list has an entry: ZL_ROUTE_NO_COHORTS
    # An opt-out entry written behind the route's back is not looked up while the bit says
    # the route has none: the program skipped the trie (and counted no cohort).
    network = routes.parse_cohort([OTHER + "/32"], "never_direct")
    routes._write_cohort_entries(routed, stored_entry(routed).route_index, [], network)
    assert served_from(netns, OTHER) == {"engine": COUNT}
    assert read_cohort_counters(routed, 0)["to_proxy_opt_out"] == 0

    # The route module's write turns the trie on with the entry, and the opt-out applies.
    set_route(routed, "svc", never_direct=[OTHER + "/32"])
    assert not stored_entry(routed).cohortless
    assert served_from(netns, OTHER) == {"proxy": COUNT}
    assert read_cohort_counters(routed, 0)["to_proxy_opt_out"] == COUNT

    # Emptied lists turn it off again, and their entries are gone.
    set_route(routed, "svc", never_direct=[])
    assert stored_entry(routed).cohortless
    assert routes.read_cohort_entries(routed) == []
    assert served_from(netns, OTHER) == {"engine": COUNT}


def test_a_route_entry_without_the_bit_looks_the_trie_up_as_before(routed, netns):
    # A route written before ZL_ROUTE_NO_COHORTS existed carries no bit: its entries apply.
    set_route(routed, "svc", weight=100, never_direct=[OTHER + "/32"])
    entry = stored_entry(routed)
    assert not entry.cohortless
    assert served_from(netns, OTHER) == {"proxy": COUNT}
    # A weight write keeps the trie on while a list has an entry.
    set_route(routed, "svc", weight=50)
    assert not stored_entry(routed).cohortless
    assert served_from(netns, OTHER) == {"proxy": COUNT}


def test_the_trie_applies_before_the_weight_word_that_needs_it(routed, monkeypatch):
    """An opt-out cohort added with a weight raise: the entry turning the trie on is
    written before the weight word, so no opt-out client takes the new weight's path."""
    assert stored_entry(routed).cohortless
    writes = []
    real_opened_map = routes.opened_map

    def recording_opened_map(layout, name, read_only=False):
        if not read_only:
            writes.append(name)
        return real_opened_map(layout, name, read_only=read_only)

    monkeypatch.setattr(routes, "opened_map", recording_opened_map)
    set_route(routed, "svc", weight=100, never_direct=[OPT_OUT + "/32"])
    order = [name for name in writes if name in (ROUTES_MAP, WEIGHTS_MAP)]
    assert order == [ROUTES_MAP, WEIGHTS_MAP], writes
    # Turning it off goes the other way: the weight word first, then the entry.
    writes.clear()
    set_route(routed, "svc", weight=0, never_direct=[])
    order = [name for name in writes if name in (ROUTES_MAP, WEIGHTS_MAP)]
    assert order == [WEIGHTS_MAP, ROUTES_MAP], writes
    assert stored_entry(routed).cohortless


def test_opt_in_without_a_live_engine_socket_goes_to_the_proxy(layout, netns, router_object, proxy):
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=0, always_direct=[OPT_IN + "/32"])
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}
    assert route_of(layout)["counters"]["fallback_no_socket"] == COUNT


def weight_word(layout, index=0):
    with opened_map(layout, WEIGHTS_MAP, read_only=True) as fd:
        raw = bpf_syscall.map_lookup(fd, PORT_KEY.pack(index), WEIGHT_VALUE.size)
    return WEIGHT_VALUE.unpack(raw)[0]


def test_routectl_rollback_clears_the_opt_in_cohort_with_the_weight(routed, netns):
    payload = ok(
        routed, "set-weight", "--route", "svc", "--weight", "50",
        "--always-direct", OPT_IN + "/32", "--never-direct", OPT_OUT + "/32",
    )  # fmt: skip
    assert payload["after"]["opt_in"] is True, payload
    assert payload["after"]["always_direct"] == ["127.0.0.2/32"], payload
    assert weight_word(routed) == 5000 | WEIGHT_OPT_IN
    assert served_from(netns, OPT_IN) == {"engine": COUNT}

    rolled = ok(routed, "rollback")
    assert rolled["rolled_back"] is True, rolled
    (entry,) = rolled["routes"]
    assert entry["weight"] == 0 and entry["opt_in"] is False and entry["confirmed"], rolled
    assert weight_word(routed) == 0  # the one write cleared both
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}
    assert served_from(netns, OPT_OUT) == {"proxy": COUNT}
    route = route_of(routed)
    assert route["opt_in"] is False and route["always_direct"] == []
    assert route["never_direct"] == ["127.0.0.3/32"]  # the safe set stays

    # A later weight raise does not bring the opt-in cohort back; its entries are gone.
    fence_epoch = rolled["fence_epoch"]
    set_route(routed, "svc", weight=100, epoch=fence_epoch)
    assert route_of(routed)["always_direct"] == []
    assert [n for _i, n, _v in routes.read_cohort_entries(routed)] == [
        routes.parse_cohort([OPT_OUT + "/32"], "x")[0]
    ]
    assert served_from(netns, OPT_OUT) == {"proxy": COUNT}


def test_roll_back_and_read_clears_the_opt_in_cohort(routed, netns):
    set_route(routed, "svc", weight=20, always_direct=["127.0.0.0/30"])
    assert served_from(netns, OPT_IN) == {"engine": COUNT}
    routes.fence_routes(routed)
    failures, confirmed = routes.roll_back_and_read(routed)
    assert failures == {}
    assert [(r.weight_bp, r.opt_in) for r in confirmed] == [(0, False)]
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}


def test_weight_0_as_a_drain_writes_it_clears_the_opt_in_cohort_in_the_same_write(routed, netns):
    set_route(routed, "svc", weight=30, always_direct=[OPT_IN], never_direct=[OPT_OUT])
    assert weight_word(routed) == 3000 | WEIGHT_OPT_IN
    result = set_route(routed, "svc", weight=0)  # the node_drain role's write
    assert result["cohorts_after"] == {"always_direct": [], "never_direct": ["127.0.0.3/32"]}
    assert weight_word(routed) == 0
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}
    # Weight 0 with an opt-in cohort is asked for explicitly.
    set_route(routed, "svc", weight=0, always_direct=[OPT_IN])
    assert weight_word(routed) == WEIGHT_OPT_IN
    assert served_from(netns, OPT_IN) == {"engine": COUNT}


def test_raising_the_opt_in_cohort_with_an_old_epoch_is_refused(routed, netns):
    set_route(routed, "svc", never_direct=[OPT_OUT + "/32"])
    routes.fence_routes(routed, 5)
    before = maps_bytes(routed)
    for changes in (
        {"always_direct": [OPT_IN + "/32"]},
        {"never_direct": []},  # taking from the opt-out cohort sends more direct
    ):
        with pytest.raises(FenceRefused):
            set_route(routed, "svc", epoch=4, **changes)
        assert maps_bytes(routed) == before
    status, error = routectl(
        routed, "set-weight", "--route", "svc", "--always-direct", OPT_IN, "--epoch", "3"
    )
    assert status != 0 and error["field"] == "epoch", error
    assert maps_bytes(routed) == before
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}

    # The safe direction goes through with any epoch; the fence's epoch raises.
    set_route(routed, "svc", never_direct=[OPT_OUT + "/32", OTHER + "/32"], epoch=1)
    set_route(routed, "svc", always_direct=[OPT_IN + "/32"], epoch=5)
    assert served_from(netns, OPT_IN) == {"engine": COUNT}
    set_route(routed, "svc", always_direct=[], epoch=1)
    assert served_from(netns, OPT_IN) == {"proxy": COUNT}


BAD_INPUT = [
    ({"always_direct": ["10.0.0.300/8"]}, "always_direct", "CIDR"),
    ({"always_direct": ["10.0.0.1/8"]}, "always_direct", "no host bits set"),
    ({"never_direct": ["2001:db8::1/32"]}, "never_direct", "no host bits set"),
    ({"never_direct": "10.0.0.0/8"}, "never_direct", "a list of IPv4 or IPv6 networks"),
    ({"always_direct": [7]}, "always_direct", "a list of IPv4 or IPv6 networks"),
    (
        {"always_direct": ["10.1.0.0/16"], "never_direct": ["10.1.0.0/16"]},
        "always_direct",
        "must hold no prefix that never_direct holds or covers",
    ),
    (
        {"always_direct": ["10.1.2.0/24"], "never_direct": ["10.1.0.0/16"]},
        "always_direct",
        "must hold no prefix that never_direct holds or covers",
    ),
    (
        {
            "never_direct": ["10.%d.%d.0/24" % divmod(i, 256) for i in range(MAX_COHORT_ENTRIES)]
            + ["198.51.100.0/24"]
        },
        "always_direct",
        "at most %d per family" % MAX_COHORT_ENTRIES,
    ),
]


@pytest.fixture
def loaded(layout, router_object):
    """The program and its maps pinned, not attached: route svc with cohorts of its own."""
    ensure_pin_dirs(layout)
    load_program(router_object, layout.prog, layout, reuse_maps=False)
    set_route(layout, "svc", port=SERVICE_PORT, weight=10, always_direct=["192.0.2.0/24"])
    set_route(layout, "other", port=SERVICE_PORT + 1, never_direct=["2001:db8::/32"])
    return layout


@pytest.mark.parametrize(
    ("changes", "field", "allowed"), BAD_INPUT, ids=[str(i) for i in range(len(BAD_INPUT))]
)
def test_bad_cohorts_are_refused_and_change_nothing(loaded, changes, field, allowed):
    before = maps_bytes(loaded)
    with pytest.raises(FleetError) as refused:
        set_route(loaded, "svc", **changes)
    assert refused.value.details["field"] == field, refused.value.details
    assert allowed in refused.value.message, refused.value.message
    assert maps_bytes(loaded) == before


def test_a_cohort_on_a_route_that_does_not_exist_is_refused(loaded):
    before = maps_bytes(loaded)
    with pytest.raises(FleetError) as refused:
        set_route(loaded, "nosuch", always_direct=["10.0.0.0/8"])
    assert refused.value.details["field"] == "always_direct"
    assert "does not exist" in refused.value.message and "svc" in refused.value.message
    assert maps_bytes(loaded) == before
    status, error = routectl(loaded, "set-weight", "--route", "nosuch", "--never-direct", "")
    assert status != 0 and error["field"] == "route", error
    status, error = routectl(
        loaded, "set-weight", "--route", "svc", "--always-direct", "10.0.0.1/8"
    )
    assert status != 0 and error["field"] == "always_direct", error
    assert "no host bits set" in error["error"], error
    assert maps_bytes(loaded) == before


def test_the_tries_hold_exactly_their_bound(loaded):
    many = ["10.%d.%d.0/24" % divmod(i, 256) for i in range(MAX_COHORT_ENTRIES - 1)]
    set_route(loaded, "svc", weight=0, always_direct=[], never_direct=many)
    # 1023 here and 192.0.2.0/24 of nothing now: one more v4 entry fits, on another route.
    set_route(loaded, "other", never_direct=["2001:db8::/32"], always_direct=["198.51.100.0/24"])
    with pytest.raises(FleetError, match="at most 1024 per family"):
        set_route(loaded, "other", always_direct=["198.51.100.0/24", "203.0.113.0/24"])
    set_route(loaded, "svc", never_direct=[])
    assert len(routes.read_cohort_entries(loaded)) == 2


def decide(layout, client, local_port=SERVICE_PORT, remote_port=40000):
    server = "fd00::1" if ":" in client else "10.0.0.1"
    with opened(layout.prog) as prog_fd:
        _retval, ctx_out, _duration = bpf_syscall.prog_test_run(
            prog_fd, sk_lookup_ctx(client, remote_port, server, local_port, 6)
        )
    return struct.unpack_from("=Q", ctx_out, 0)[0]


def test_ipv4_and_ipv6_cohorts_per_route(loaded, listeners):
    engine = listeners("::", v6only=False)  # dual stack: takes both families
    for name in ("svc", "other"):
        register_engine_socket(
            loaded, name, os.getpid(), engine.getsockname()[1], slot=0, timeout=5
        )
    set_route(
        loaded,
        "svc",
        weight=0,
        always_direct=["fd00:2::/64", "10.9.0.0/16"],
        never_direct=["fd00:2::66/128", "10.9.9.0/24"],
    )
    set_route(loaded, "other", weight=100, never_direct=["fd00:2::/64"])
    cookie = struct.unpack("=Q", engine.getsockopt(socket.SOL_SOCKET, 57, 8))[0]
    for port in range(40000, 40020):
        assert decide(loaded, "fd00:2::1", remote_port=port) == cookie
        assert decide(loaded, "fd00:2::66", remote_port=port) == 0
        assert decide(loaded, "fd00:3::1", remote_port=port) == 0
        assert decide(loaded, "10.9.1.1", remote_port=port) == cookie
        assert decide(loaded, "10.9.9.1", remote_port=port) == 0
        # The other route: its own sets only (the route index is in the key).
        other = SERVICE_PORT + 1
        assert decide(loaded, "fd00:2::1", other, remote_port=port) == 0
        assert decide(loaded, "10.9.9.1", other, remote_port=port) == cookie
    assert read_cohort_counters(loaded, 0) == {"to_engine_opt_in": 40, "to_proxy_opt_out": 40}
    # Check mode writes nothing and says what would change.
    before = maps_bytes(loaded)
    preview = set_route(loaded, "svc", always_direct=[], check_mode=True)
    assert preview["changed"] and preview["cohorts_after"]["always_direct"] == []
    assert maps_bytes(loaded) == before


def test_removing_a_route_and_reusing_its_index_leaves_no_cohort_behind(loaded):
    (svc,) = [r for r in read_routes(loaded) if r.name == "svc"]
    routes.remove_route(loaded, "svc")
    assert all(i != svc.route_index for i, _n, _v in routes.read_cohort_entries(loaded))
    set_route(loaded, "again", port=SERVICE_PORT + 2)
    assert route_of(loaded, "again")["always_direct"] == []


def test_a_deep_rollback_removes_the_cohort_maps(routed):
    set_route(routed, "svc", weight=10, always_direct=[OPT_IN], never_direct=[OPT_OUT])
    router_lifecycle.deep_rollback(routed, reason="test")
    assert not os.path.exists(routed.maps_dir)


@pytest.fixture(scope="session")
def layout2_object(tmp_path_factory):
    """The router before the cohorts (map layout 2), built from its own sources."""
    out = str(tmp_path_factory.mktemp("bpf-layout2") / "zerolayer_router-layout2.bpf.o")
    makefile = os.path.join(BPF_DIR, "Makefile")
    run(["make", "-s", "-f", makefile, "-C", LAYOUT2_RELEASE, "OUT=" + out])
    return out


def test_pins_of_layout_2_keep_working_and_an_attach_adds_the_cohorts(
    layout, netns, router_object, layout2_object, proxy, engine
):
    ensure_pin_dirs(layout)
    argv = [find_bpftool(), "prog", "load", layout2_object, layout.prog, "type", "sk_lookup"]
    subprocess.run([*argv, "pinmaps", layout.maps_dir], check=True, capture_output=True)
    # What the layout 2 release's loader wrote: its layout number and the node's seeds.
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
        write_new_seeds,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import CONFIG_MAP
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        CONFIG_KEY,
        CONFIG_VALUE,
    )

    write_new_seeds(layout)
    with opened(layout.map(CONFIG_MAP)) as fd:
        _v, _r, seed_weight, seed_slot = CONFIG_VALUE.unpack(
            bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size)
        )
        bpf_syscall.map_update(
            fd, CONFIG_KEY.pack(0), CONFIG_VALUE.pack(2, 0, seed_weight, seed_slot)
        )
    router_lifecycle._create_link(layout, netns.path)
    assert pinned_layout_version(layout) == 2
    assert sorted(os.listdir(layout.maps_dir)) == sorted(map_names_of_layout(2))

    # Today's code on the pins as they are: weights, a rollback; cohorts refused, unwritten.
    set_route(layout, "svc", port=SERVICE_PORT, weight=100)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    assert served_from(netns, OTHER) == {"engine": COUNT}
    before = maps_bytes(layout)
    with pytest.raises(FleetError, match="upgrade them to layout 3") as refused:
        set_route(layout, "svc", never_direct=[OTHER])
    assert refused.value.details["field"] == "never_direct"
    assert maps_bytes(layout) == before
    assert "always_direct" not in route_of(layout)
    routes.fence_routes(layout)
    failures, confirmed = routes.roll_back_and_read(layout)
    assert failures == {} and [r.weight_bp for r in confirmed] == [0]
    assert served_from(netns, OTHER) == {"proxy": COUNT}

    # An attach whose program load failed after it added the maps: the layout 2 program
    # still runs and would read the opt-in bit as a weight. Refused, nothing written.
    add_maps_of_newer_layout(layout)
    assert pinned_layout_version(layout) == LAYOUT_VERSION
    before = maps_bytes(layout)
    with pytest.raises(FleetError, match="predates the cohorts") as refused:
        set_route(layout, "svc", always_direct=[OPT_IN], epoch=1)
    assert refused.value.details["field"] == "always_direct"
    assert maps_bytes(layout) == before
    set_route(layout, "svc", never_direct=[OPT_OUT])  # no bit: the old program ignores it

    result = router_lifecycle.attach(layout, router_object, netns.path)
    assert any(action.startswith("upgrade program") for action in result["actions"]), result
    assert pinned_layout_version(layout) == LAYOUT_VERSION
    assert read_layout_config(layout) == (LAYOUT_VERSION, seed_weight, seed_slot)
    set_route(layout, "svc", weight=0, always_direct=[OPT_IN], never_direct=[OPT_OUT], epoch=1)
    assert served_from(netns, OPT_IN) == {"engine": COUNT}
    assert served_from(netns, OTHER) == {"proxy": COUNT}


def test_the_modules_set_and_return_the_cohorts_with_check_mode_and_diff(routed, netns):
    from .test_modules import ansible

    pin = {"pin_dir": routed.pin_dir, "fence_file": routed.fence_file}
    before = maps_bytes(routed)
    preview = ansible("route", name="svc", always_direct=OPT_IN + "/32", _check=True, **pin)
    assert preview["changed"], preview
    assert preview["diff"]["before"]["always_direct"] == []
    assert preview["diff"]["after"]["always_direct"] == ["127.0.0.2/32"]
    assert preview["diff"]["after"]["opt_in"] is True
    assert maps_bytes(routed) == before  # check mode wrote nothing

    done = ansible(
        "route", name="svc", always_direct=OPT_IN + "/32", never_direct=OPT_OUT + "/32", **pin
    )
    assert done["changed"] and done["after"]["never_direct"] == ["127.0.0.3/32"], done
    assert done["route"]["opt_in"] is True, done
    again = ansible("route", name="svc", always_direct=OPT_IN + "/32", **pin)
    assert again["changed"] is False, again
    assert served_from(netns, OPT_IN) == {"engine": COUNT}

    refused = ansible("route", name="svc", always_direct="10.0.0.1/8", **pin)
    assert refused.get("failed") and refused["field"] == "always_direct", refused
    assert "no host bits set" in refused["msg"], refused

    info = ansible("route_info", name="svc", **pin)
    (route,) = info["routes"]
    assert route["always_direct"] == ["127.0.0.2/32"], route
    assert route["never_direct"] == ["127.0.0.3/32"], route
    assert route["counters"]["to_engine_opt_in"] == COUNT, route
