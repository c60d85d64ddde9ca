"""A deep rollback keeps the router detached; an interrupted upgrade and netns moves.

Real kernel, real netns (fixtures in conftest.py): the router module runs through Ansible,
zerolayer-routectl in-process through node_cli.run and, for the boot path, as its own
process the way zerolayer-router.service runs it.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    router_lifecycle,
    router_mode,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    read_fence,
    write_fence,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import load_program
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import opened
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

from .conftest import COLLECTIONS_PATH, ENGINE_PORT, SERVICE_PORT, file_bytes, routectl, run
from .decision_model import Seeds
from .test_modules import ansible

BOOT_ROUTECTL = (
    "import sys; sys.path.insert(0, %r); "
    "from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_cli import main; "
    "sys.exit(main())" % COLLECTIONS_PATH
)


def boot_attach(config):
    """`zerolayer-routectl --config CONFIG attach`, exactly as the boot unit runs it."""
    proc = subprocess.run(
        [sys.executable, "-c", BOOT_ROUTECTL, "--config", config, "attach"],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    return proc.returncode, json.loads(proc.stdout or proc.stderr)


def write_config(
    tmp_path, layout, router_object, netns, engine, weight=0, name="router.json", **route_extra
):
    """The node's router config as the ebpf_router role writes it: route chat at `weight`
    (what the inventory declares, with any of its other keys in route_extra) with the
    engine in slot 0."""
    route = {
        "name": "chat",
        "port": SERVICE_PORT,
        "weight": weight,
        "engines": [{"slot": 0, "pid": engine.pid, "port": ENGINE_PORT}],
    }
    route.update(route_extra)
    config = tmp_path / name
    config.write_text(
        json.dumps(
            {
                "pin_dir": layout.pin_dir,
                "fence_file": layout.fence_file,
                "object": router_object,
                "netns": netns.path,
                "routes": [route],
            }
        )
    )
    return str(config)


def bare_config(tmp_path, layout, router_object, netns_path):
    """A node config with no routes, attaching to netns_path."""
    config = tmp_path / "router.json"
    settings = {"pin_dir": layout.pin_dir, "fence_file": layout.fence_file}
    settings.update(object=router_object, netns=netns_path)
    config.write_text(json.dumps(settings))
    return str(config)


def steer_everything(layout, engine):
    """Route chat at 100 % with the engine in slot 0, at the node's current fence epoch."""
    epoch = read_fence(layout.fence_file)["epoch"]
    set_route(layout, "chat", SERVICE_PORT, 100, epoch=epoch)
    status, registered = routectl(
        layout, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
        "--port", str(ENGINE_PORT), "--timeout", "5", "--epoch", str(epoch),
    )  # fmt: skip
    assert status == 0, registered


@pytest.fixture
def other_netns():
    """A second network namespace (lo up), deleted afterwards."""
    name = "zlt-" + uuid.uuid4().hex[:8]
    run(["ip", "netns", "add", name])
    try:
        run(["ip", "-n", name, "link", "set", "lo", "up"])
        yield "/run/netns/" + name
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def test_deep_rollback_by_module_stays_detached_until_restore(
    layout, netns, router_object, proxy, engine, tmp_path
):
    pin = {"pin_dir": layout.pin_dir, "fence_file": layout.fence_file}
    assert ansible("router", object=router_object, netns=netns.path, **pin)["changed"]
    steer_everything(layout, engine)
    assert netns.clients(count=50)["served"] == {"engine": 50}

    fence_before = file_bytes(layout.fence_file)
    preview = ansible("router", state="detached", epoch=5, _check=True, **pin)
    assert (
        preview["changed"] and "keep the router detached from fence epoch 5" in preview["actions"]
    ), preview
    assert file_bytes(layout.fence_file) == fence_before, "check mode wrote the fence"
    assert router_lifecycle.router_state(layout)["attached"], "check mode detached the router"
    assert netns.clients(count=50)["served"] == {"engine": 50}

    rolled = ansible("router", state="detached", epoch=5, reason="p99-above-target", **pin)
    assert rolled["changed"] and rolled["fence"]["epoch"] == 5, rolled
    assert rolled["mode"]["mode"] == "detached" and rolled["mode"]["epoch"] == 5
    assert rolled["mode"]["reason"] == "p99-above-target" and rolled["mode"]["at"].endswith("Z")
    assert not os.path.exists(layout.pin_dir), "a deep rollback unpins program and maps"
    assert netns.clients(count=50)["served"] == {"proxy": 50}

    # Every attach without restore: ok, not changed, nothing pinned, the reason said.
    kept = ansible("router", object=router_object, netns=netns.path, **pin)
    assert kept["changed"] is False and kept["kept_detached"]["epoch"] == 5, kept
    assert any("fence epoch 5" in w and "restore=true" in w for w in kept["warnings"]), kept
    assert not os.path.exists(layout.pin_dir)
    config = write_config(tmp_path, layout, router_object, netns, engine)
    for _boot in range(2):  # a boot, then `systemctl restart zerolayer-router`
        status, booted = boot_attach(config)
        assert status == 0 and booted["kept_detached"]["epoch"] == 5, booted
        assert booted["attached"] is False and "attach --restore" in booted["message"]
        assert not os.path.exists(layout.pin_dir), "the boot path attached a detached router"
    assert netns.clients(count=50)["served"] == {"proxy": 50}

    fence_before = file_bytes(layout.fence_file)
    preview = ansible("router", object=router_object, netns=netns.path, restore=True, _check=True,
                      **pin)  # fmt: skip
    assert preview["changed"] and preview["actions"][0].startswith("leave the detached mode")
    assert file_bytes(layout.fence_file) == fence_before and not os.path.exists(layout.pin_dir)

    restored = ansible("router", object=router_object, netns=netns.path, restore=True, **pin)
    assert restored["changed"] and restored["router"]["attached"], restored
    fence = read_fence(layout.fence_file)
    assert fence["router"]["mode"] == "active" and fence["epoch"] == 5
    assert read_routes(layout) == [], "a restore starts from the inventory's routes"
    again = ansible("router", object=router_object, netns=netns.path, **pin)
    assert again["changed"] is False and again["kept_detached"] is None

    # Without an epoch every deep rollback goes one above the node's own.
    second = ansible("router", state="absent", **pin)
    assert second["fence"] == {"epoch_before": 5, "epoch": 6}, second
    assert second["mode"]["mode"] == "detached" and second["mode"]["epoch"] == 6


def test_routectl_detach_is_the_deep_rollback_and_attach_restore_ends_it(
    layout, netns, router_object, proxy, engine, tmp_path
):
    router_lifecycle.attach(layout, router_object, netns.path)
    steer_everything(layout, engine)
    # Keys other writers keep in the fence file survive every later write of it.
    write_fence(layout.fence_file, dict(read_fence(layout.fence_file), note="kept"))

    status, detached = routectl(layout, "detach", "--epoch", "3", "--reason", "verifier bug")
    assert status == 0, detached
    assert (detached["fence_epoch_before"], detached["fence_epoch"]) == (0, 3)
    assert detached["attached"] is False and detached["maps_pinned"] is False
    assert detached["mode"]["mode"] == "detached" and detached["mode"]["reason"] == "verifier bug"
    assert not os.path.exists(layout.pin_dir)
    # The seeds stay in the node's fence file for a restore that keeps them; no output
    # shows them, only that they were kept.
    seeds = read_fence(layout.fence_file)["router"]["seeds"]
    assert len(seeds) == 2 and detached["mode"]["seeds_kept"] is True, detached["mode"]
    status, shown = routectl(layout, "show")
    assert status == 0 and shown["fence"]["router"]["seeds_kept"] is True, shown["fence"]
    for output in (detached, shown):
        assert "seeds" not in json.dumps(output).replace("seeds_kept", ""), output
    assert netns.clients(count=50)["served"] == {"proxy": 50}
    again = routectl(layout, "detach", "--epoch", "3")[1]
    assert again["changed"] is False, "the same deep rollback twice changes nothing"

    config = write_config(tmp_path, layout, router_object, netns, engine)
    status, kept = routectl(layout, "attach", config=config)
    assert status == 0 and kept["kept_detached"]["epoch"] == 3 and kept["routes"] == [], kept
    assert "seeds" not in kept["kept_detached"] and kept["kept_detached"]["seeds_kept"] is True
    assert ansible("router", object=router_object, netns=netns.path, pin_dir=layout.pin_dir,
                   fence_file=layout.fence_file)["changed"] is False  # fmt: skip
    assert not os.path.exists(layout.pin_dir)
    assert read_fence(layout.fence_file)["router"]["reason"] == "verifier bug"

    status, restored = routectl(layout, "attach", "--restore", config=config)
    assert status == 0 and restored["attached"] is True, restored
    assert restored["actions"][0] == "leave the detached mode of fence epoch 3"
    assert restored["engines"][0]["registered"] is True, restored
    fence = read_fence(layout.fence_file)
    assert fence["router"]["mode"] == "active" and fence["note"] == "kept", fence
    assert [(r.name, r.weight_bp) for r in read_routes(layout)] == [("chat", 0)]
    assert netns.clients(count=50)["served"] == {"proxy": 50}
    steer_everything(layout, engine)
    assert netns.clients(count=50)["served"] == {"engine": 50}
    # Active again: the boot path attaches (and finds nothing to do).
    status, booted = boot_attach(config)
    assert status == 0 and booted["attached"] is True and booted["kept_detached"] is None
    assert booted["changed"] is False, booted
    assert read_fence(layout.fence_file)["note"] == "kept"


def test_a_restore_brings_the_declared_hash_back_with_the_route(
    layout, netns, router_object, proxy, engine, tmp_path
):
    """A deep rollback removes the routes with the maps; the node config declares the route's
    hash, so the boot attach and the restore write it again, and a declared connection hash
    turns a client-hash route back."""
    config = write_config(tmp_path, layout, router_object, netns, engine, hash="client")
    status, booted = boot_attach(config)
    assert status == 0 and booted["attached"] is True, booted
    assert [(r.name, r.hash_mode) for r in read_routes(layout)] == [("chat", "client")]

    assert routectl(layout, "detach", "--epoch", "3", "--reason", "drill")[0] == 0
    assert not os.path.exists(layout.pin_dir)
    status, restored = routectl(layout, "attach", "--restore", config=config)
    assert status == 0 and restored["attached"] is True, restored
    assert [(r.name, r.hash_mode) for r in read_routes(layout)] == [("chat", "client")]

    by_connection = write_config(
        tmp_path, layout, router_object, netns, engine, name="by-connection.json", hash="connection"
    )
    status, rebooted = boot_attach(by_connection)
    assert status == 0 and rebooted["changed"] is True, rebooted
    assert [(r.name, r.hash_mode) for r in read_routes(layout)] == [("chat", "connection")]
    # A config that names no hash keeps the live route's.
    set_route(layout, "chat", hash_mode="client")
    assert boot_attach(write_config(tmp_path, layout, router_object, netns, engine))[0] == 0
    assert [(r.name, r.hash_mode) for r in read_routes(layout)] == [("chat", "client")]


def test_an_unreadable_mode_record_refuses_attach_and_changes_nothing(
    layout, netns, router_object, tmp_path
):
    write_fence(layout.fence_file, {"epoch": 2, "router": {"mode": "sleeping"}})
    before = file_bytes(layout.fence_file)
    with pytest.raises(FleetError, match="mode 'active' or 'detached'") as failed:
        router_lifecycle.attach(layout, router_object, netns.path)
    assert failed.value.details["field"] == "fence_file"
    config = bare_config(tmp_path, layout, router_object, netns.path)
    status, error = routectl(layout, "attach", config=config)
    assert status == node_cli.EXIT_REJECTED and error["field"] == "fence_file", error
    assert not os.path.exists(layout.pin_dir) and file_bytes(layout.fence_file) == before


def interrupt_an_upgrade(layout, upgraded_object):
    """What an upgrade stopped right after BPF_LINK_UPDATE leaves: the link runs a program
    that no pin names, the old program still pinned as prog. Returns the running id."""
    load_program(upgraded_object, layout.next_prog, layout, reuse_maps=True)
    with opened(layout.next_prog) as new_fd, opened(layout.link) as link_fd:
        bpf_syscall.link_update(link_fd, new_fd)
        running = bpf_syscall.prog_info(new_fd)["id"]
    os.unlink(layout.next_prog)
    return running


@pytest.mark.parametrize("second_build", [False, True])
def test_attach_recovers_an_interrupted_upgrade(
    layout, netns, router_object, upgraded_object, proxy, engine, second_build
):
    router_lifecycle.attach(layout, router_object, netns.path)
    steer_everything(layout, engine)
    link_id = router_lifecycle.link_state(layout)["id"]
    pinned = router_lifecycle.program_state(layout)
    running = interrupt_an_upgrade(layout, upgraded_object)
    assert running != pinned["id"]
    # Without the repair every swap naming the pinned program as the old one is refused.
    with pytest.raises(FleetError), opened(layout.link) as link_fd, opened(layout.prog) as fd:
        bpf_syscall.link_update(link_fd, fd, old_prog_fd=fd)
    assert router_lifecycle.router_state(layout)["attached"] is False

    wanted = upgraded_object if second_build else router_object
    preview = router_lifecycle.attach(layout, wanted, netns.path, check_mode=True)
    assert preview["actions"][0].startswith("point link %d back at the pinned program" % link_id)
    assert router_lifecycle.link_state(layout)["prog_id"] == running, "check mode changed it"

    result = router_lifecycle.attach(layout, wanted, netns.path)
    assert result["changed"] and result["actions"][0] == preview["actions"][0], result
    assert any(a.startswith("upgrade program") for a in result["actions"]) == second_build
    after = result["after"]
    assert after["attached"] and after["link"]["id"] == link_id, after
    assert after["link"]["prog_id"] == after["program"]["id"]
    assert (after["program"]["tag"] != pinned["tag"]) == second_build
    assert [(r.name, r.weight_bp) for r in read_routes(layout)] == [("chat", 10000)]
    report = netns.clients(count=100)
    assert report["served"] == {"engine": 100} and report["errors"] == 0
    assert router_lifecycle.attach(layout, wanted, netns.path)["changed"] is False


def test_attach_to_another_netns_is_refused_unless_asked(
    layout, netns, router_object, other_netns, tmp_path
):
    router_lifecycle.attach(layout, router_object, netns.path)
    home = os.stat(netns.path).st_ino
    away = os.stat(other_netns).st_ino
    state = router_lifecycle.router_state(layout)
    with pytest.raises(FleetError) as refused:
        router_lifecycle.attach(layout, router_object, other_netns)
    details = refused.value.details
    assert (details["field"], details["netns_ino"], details["link_netns_ino"]) == (
        "netns", away, home,
    )  # fmt: skip
    assert str(away) in refused.value.message and str(home) in refused.value.message
    with pytest.raises(FleetError, match="move_netns=true"):
        router_lifecycle.attach(layout, router_object, other_netns, check_mode=True)
    pin = {"pin_dir": layout.pin_dir, "fence_file": layout.fence_file}
    failed = ansible("router", object=router_object, netns=other_netns, **pin)
    assert failed.get("failed") and failed["field"] == "netns", failed
    config = bare_config(tmp_path, layout, router_object, other_netns)
    status, error = routectl(layout, "attach", config=config)
    assert status == node_cli.EXIT_REJECTED and error["field"] == "netns", error
    assert router_lifecycle.router_state(layout) == state, "a refusal changed the router"

    status, moved = routectl(layout, "attach", "--move-netns", config=config)
    assert status == 0 and moved["attached"] is True, moved
    assert router_lifecycle.link_state(layout)["netns_ino"] == away
    back = ansible("router", object=router_object, netns=netns.path, move_netns=True, **pin)
    assert back["changed"] and back["router"]["link"]["netns_ino"] == home, back


def test_a_restore_draws_new_seeds_unless_asked_to_keep_them(
    layout, netns, router_object, tmp_path
):
    config = bare_config(tmp_path, layout, router_object, netns.path)
    assert routectl(layout, "attach", config=config)[0] == 0
    first = Seeds.of(layout)
    assert routectl(layout, "detach", "--reason", "seed test")[0] == 0
    status, restored = routectl(layout, "attach", "--restore", "--keep-seeds", config=config)
    assert status == 0, restored
    assert Seeds.of(layout) == first, "keep_seeds: every tuple must take its old path"

    assert routectl(layout, "detach")[0] == 0
    assert routectl(layout, "attach", "--restore", config=config)[0] == 0
    assert Seeds.of(layout) != first, "a plain restore draws new seeds"


def test_the_router_module_keeps_seeds_only_when_asked_and_only_if_kept(
    layout, netns, router_object
):
    pin = {"pin_dir": layout.pin_dir, "fence_file": layout.fence_file}
    target = {"object": router_object, "netns": netns.path, **pin}
    # A deep rollback on a node whose router never ran keeps no seeds: asking for them is
    # refused, names the field, and leaves the node detached as it was.
    assert ansible("router", state="detached", epoch=2, **pin)["changed"]
    mode_before = router_mode.read_mode(layout.fence_file)
    refused = ansible("router", restore=True, keep_seeds=True, **target)
    assert refused.get("failed") and refused["field"] == "keep_seeds", refused
    assert router_mode.read_mode(layout.fence_file) == mode_before
    assert router_lifecycle.router_state(layout)["link"] is None

    assert ansible("router", restore=True, **target)["router"]["attached"] is True
    first = Seeds.of(layout)
    assert ansible("router", state="detached", epoch=3, reason="seed-test", **pin)["changed"]
    # A second deep rollback (the fence rose again, nothing attached) keeps the first one's seeds.
    assert ansible("router", state="detached", epoch=4, **pin)["changed"]
    restored = ansible("router", restore=True, keep_seeds=True, **target)
    assert restored["changed"] and restored["router"]["attached"], restored
    assert Seeds.of(layout) == first, "keep_seeds=true: every tuple must take its old path"

    assert ansible("router", state="detached", epoch=5, **pin)["changed"]
    restored = ansible("router", restore=True, **target)
    assert restored["changed"] and restored["router"]["attached"], restored
    assert Seeds.of(layout) != first, "a plain restore draws new seeds"
