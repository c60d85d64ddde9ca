"""Pinned maps are checked, not trusted: foreign layouts are refused, older ones upgraded."""

import os
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    router_lifecycle,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    read_slots,
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
    find_bpftool,
    load_program,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CONFIG_MAP,
    FAMILIES_MAP,
    MAP_NAMES,
    ROUTES_MAP,
    check_pinned_maps,
    ensure_pin_dirs,
    map_names_of_layout,
    opened,
    pinned_layout_version,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CONFIG_KEY,
    CONFIG_VALUE,
    FAMILIES_VALUE,
    LAYOUT_VERSION,
    MAP_SPEC_BY_NAME,
    PORT_KEY,
    TAKES_IPV6,
    socket_key,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)

from .conftest import BPF_DIR, ENGINE_PORT, SERVICE_PORT, run
from .decision_model import Seeds, takes_engine_path

PREVIOUS_RELEASE = os.path.join(os.path.dirname(__file__), "previous_release")


@pytest.fixture
def loaded(layout, router_object):
    ensure_pin_dirs(layout)
    load_program(router_object, layout.prog, layout, reuse_maps=False)
    return layout


@pytest.fixture(scope="session")
def previous_object(tmp_path_factory):
    """The previous release's router (map layout 1), built from its own sources."""
    out = str(tmp_path_factory.mktemp("bpf-previous") / "zerolayer_router-layout1.bpf.o")
    # Today's Makefile, run in the old sources' directory: the same compiler flags.
    makefile = os.path.join(BPF_DIR, "Makefile")
    run(["make", "-s", "-f", makefile, "-C", PREVIOUS_RELEASE, "OUT=" + out])
    return out


def map_bytes(path, key_size, value_size):
    """Every entry of a pinned map, as bytes: to prove a refusal changed nothing."""
    with opened(path) as fd:
        return {
            key: bpf_syscall.map_lookup(fd, key, value_size)
            for key in bpf_syscall.map_keys(fd, key_size)
        }


def pin_foreign_map(layout, name, value_size):
    """Replace a pin by a map of the same type and key with another value size."""
    spec = MAP_SPEC_BY_NAME[name]
    os.unlink(layout.map(name))
    fd = bpf_syscall.map_create(spec.map_type, spec.key_size, value_size, spec.max_entries, name)
    try:
        bpf_syscall.obj_pin(fd, layout.map(name))
    finally:
        os.close(fd)


def test_every_map_the_object_makes_matches_its_spec(loaded):
    check_pinned_maps(loaded)  # raises on any difference
    assert pinned_layout_version(loaded) == LAYOUT_VERSION
    assert sorted(os.listdir(loaded.maps_dir)) == sorted(MAP_NAMES)


def test_a_route_map_of_another_value_size_is_refused_before_any_read(loaded, router_object):
    set_route(loaded, "svc", port=SERVICE_PORT, weight=5)
    pin_foreign_map(loaded, ROUTES_MAP, 48)
    # An entry the foreign layout holds: it must stay exactly as it is.
    with opened(loaded.map(ROUTES_MAP)) as fd:
        bpf_syscall.map_update(fd, PORT_KEY.pack(SERVICE_PORT), b"\x07" * 48)
    before = map_bytes(loaded.map(ROUTES_MAP), PORT_KEY.size, 48)

    for attempt in (
        lambda: read_routes(loaded),
        lambda: set_route(loaded, "svc", weight=0),
        lambda: load_program(router_object, loaded.next_prog, loaded, reuse_maps=True),
    ):
        with pytest.raises(FleetError, match=r"zl_routes.*value_size 48 \(expected 56\)") as info:
            attempt()
        assert info.value.details["field"] == "pin_dir"
    assert map_bytes(loaded.map(ROUTES_MAP), PORT_KEY.size, 48) == before
    assert not os.path.exists(loaded.next_prog)


def test_maps_of_an_unknown_layout_are_refused(loaded):
    set_route(loaded, "svc", port=SERVICE_PORT, weight=5)
    with opened(loaded.map(CONFIG_MAP)) as fd:
        raw = bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size)
        _version, reserved, seed_weight, seed_slot = CONFIG_VALUE.unpack(raw)
        bpf_syscall.map_update(
            fd, CONFIG_KEY.pack(0), CONFIG_VALUE.pack(9, reserved, seed_weight, seed_slot)
        )
    with pytest.raises(FleetError, match="layout 9, and this router version knows layout 4"):
        set_route(loaded, "svc", weight=50)
    with opened(loaded.map(CONFIG_MAP)) as fd:
        assert (
            CONFIG_VALUE.unpack(bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size))[
                0
            ]
            == 9
        )


def set_up_as_the_previous_release(layout, object_path, netns_path):
    """What the previous release's attach did: bpftool pinning four maps, then the link."""
    ensure_pin_dirs(layout)
    argv = [find_bpftool(), "prog", "load", object_path, layout.prog, "type", "sk_lookup"]
    subprocess.run([*argv, "pinmaps", layout.maps_dir], check=True, capture_output=True)
    router_lifecycle._create_link(layout, netns_path)


def test_upgrade_from_the_previous_release_keeps_routes_and_sockets(
    layout, netns, router_object, previous_object
):
    netns.start_nginx(SERVICE_PORT, "proxy")
    engine = netns.start_nginx(ENGINE_PORT, "engine")
    set_up_as_the_previous_release(layout, previous_object, netns.path)
    assert pinned_layout_version(layout) == 1
    assert sorted(os.listdir(layout.maps_dir)) == sorted(map_names_of_layout(1))

    # Today's code works on the older pins as they are: routes, weights, engine sockets.
    set_route(layout, "svc", port=SERVICE_PORT, weight=100)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    assert netns.clients(count=100)["served"] == {"engine": 100}
    set_route(layout, "svc", weight=40)
    routes_before = read_routes(layout)
    slots_before = read_slots(layout, routes_before[0].route_index)

    result = router_lifecycle.attach(layout, router_object, netns.path)
    assert any(action.startswith("upgrade program") for action in result["actions"]), result
    assert result["after"]["attached"]
    assert pinned_layout_version(layout) == LAYOUT_VERSION
    assert read_routes(layout) == routes_before
    assert read_slots(layout, routes_before[0].route_index) == slots_before

    # The new program decides with the node's new seeds, on the same route and socket.
    seeds = Seeds.of(layout)
    source_ports = list(range(47000, 47032))
    by_port = netns.clients(count=1, source_ports=source_ports)["by_source_port"]
    assert by_port == {
        str(port): [
            "engine"
            if takes_engine_path(("127.0.0.1", port, "127.0.0.1", SERVICE_PORT), 4000, seeds)
            else "proxy"
        ]
        for port in source_ports
    }
    assert os.path.exists(layout.map(FAMILIES_MAP))


def test_a_socket_registered_after_the_upgrade_gets_its_family_bits(
    layout, netns, router_object, previous_object
):
    engine = netns.start_nginx(ENGINE_PORT, "engine", listen=("[::1]",))
    set_up_as_the_previous_release(layout, previous_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=100)
    router_lifecycle.attach(layout, router_object, netns.path)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet6", timeout=10)
    (route,) = read_routes(layout)
    with opened(layout.map(FAMILIES_MAP)) as fd:
        raw = bpf_syscall.map_lookup(fd, socket_key(route.route_index, 0), FAMILIES_VALUE.size)
    assert FAMILIES_VALUE.unpack(raw)[0] == TAKES_IPV6  # a v6-only socket: IPv6 only
