"""The four modules driven the way Ansible runs them, and bad input changing nothing."""

import json
import os
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    PinLayout,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    remove_route,
    set_route,
)

from .conftest import ENGINE_PORT, REPO, SERVICE_PORT, four_sigma_bounds, maps_bytes


def ansible(module, **args):
    """Run one module ad hoc against localhost from the checkout; return its result."""
    env = dict(
        os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"
    )
    env["PATH"] = os.path.join(REPO, ".venv", "bin") + ":" + env.get("PATH", "")
    check = args.pop("_check", False)
    argv = [
        os.path.join(REPO, ".venv", "bin", "ansible"),
        "localhost", "-i", "localhost,", "-c", "local",
        "-e", "ansible_python_interpreter=/usr/bin/python3",
        "-m", "zerolayer.fleet." + module,
        "-a", " ".join("%s=%s" % (key, value) for key, value in args.items()),
    ]  # fmt: skip
    if check:
        argv += ["--check", "--diff"]
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120
    )
    try:
        report = json.loads(proc.stdout)
    except ValueError:
        pytest.fail(
            "ansible printed no JSON (rc %d): %s %s" % (proc.returncode, proc.stdout, proc.stderr)
        )
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


def test_modules_end_to_end(layout, netns, router_object, proxy, engine):
    pin = {"pin_dir": layout.pin_dir, "fence_file": layout.fence_file}
    attached = ansible("router", object=router_object, netns=netns.path, **pin)
    assert attached["changed"] and attached["router"]["attached"], attached
    assert ansible("router", object=router_object, netns=netns.path, **pin)["changed"] is False
    assert oct(os.stat(layout.pin_dir).st_mode & 0o777) == "0o700"

    created = ansible("route", name="svc", port=SERVICE_PORT, weight=0, **pin)
    assert created["changed"] and created["after"] == {
        "weight": 0,
        "weight_bp": 0,
        "generation": 1,
        "hash": "connection",
        "always_direct": [],
        "never_direct": [],
    }

    registered = ansible(
        "engine_socket", route="svc", pid=engine.pid, listen_port=ENGINE_PORT, **pin
    )
    assert registered["changed"] and registered["cookie"] > 0, registered
    # The route's slot_limit went from 0 to 1 with the socket: one write, generation 2.
    again = ansible("engine_socket", route="svc", pid=engine.pid, listen_port=ENGINE_PORT, **pin)
    assert again["changed"] is False and again["cookie"] == registered["cookie"]

    preview = ansible("route", name="svc", weight="100", _check=True, **pin)
    assert preview["changed"] and preview["diff"]["after"]["weight_bp"] == 10000
    assert netns.clients(count=200)["served"] == {"proxy": 200}  # check mode wrote nothing

    raised = ansible("route", name="svc", weight="100", **pin)
    no_cohorts = {"hash": "connection", "always_direct": [], "never_direct": []}
    assert raised["before"] == {"weight": 0, "weight_bp": 0, "generation": 2, **no_cohorts}
    assert raised["after"] == {"weight": 100, "weight_bp": 10000, "generation": 3, **no_cohorts}
    assert netns.clients(count=200)["served"] == {"engine": 200}

    info = ansible("route_info", **pin)
    (route,) = info["routes"]
    assert route["slots"] == {"0": registered["cookie"]}
    assert route["slot_limit"] == 1
    assert route["counters"]["to_engine"] == 200
    assert route["counters"]["to_proxy_by_weight"] == 200
    # One decision in sampled_one_in is timed, picked by the clients' random source ports.
    low, high = four_sigma_bounds(400, 1 / info["latency"]["sampled_one_in"])
    assert low <= info["latency"]["count"] <= high, info["latency"]
    assert info["latency"]["p99_ns"] >= info["latency"]["p50_ns"]
    assert info["router"]["link"]["netns_ino"] == os.stat(netns.path).st_ino

    # The fence: a raise with an epoch older than the node's is refused, the map unchanged.
    assert ansible("route", name="svc", weight="0", epoch=4, **pin)["changed"]
    before = maps_bytes(layout)
    stale = ansible("route", name="svc", weight="50", epoch=3, **pin)
    assert stale.get("failed") and stale["field"] == "epoch", stale
    assert "epoch 3" in stale["msg"] and "fence epoch 4" in stale["msg"]
    assert maps_bytes(layout) == before
    assert ansible("route", name="svc", weight="100", epoch=4, **pin)["changed"]

    detached = ansible("router", state="detached", epoch=6, **pin)
    assert detached["changed"] and not detached["router"]["attached"]
    assert detached["fence"] == {"epoch_before": 4, "epoch": 6}
    assert netns.clients(count=100)["served"] == {"proxy": 100}
    assert ansible("router", state="absent", **pin)["changed"]
    assert not os.path.exists(layout.pin_dir)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"weight": "-1"}, "weight must be a percentage from 0 to 100 with at most two decimals"),
        ({"weight": "100.001"}, "weight must be a percentage from 0 to 100"),
        ({"weight": "12.345"}, "more than two decimals"),
        ({"weight": "abc"}, "weight must be a percentage from 0 to 100"),
        (
            {"name": "nosuch", "weight": "5"},
            "name 'nosuch' is not a known route (known routes: svc)",
        ),
    ],
)
def test_bad_input_through_ansible_fails_and_changes_nothing(
    layout, netns, router_object, args, message
):
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=12.5)
    before = maps_bytes(layout)
    result = ansible(
        "route",
        **{"name": "svc", "pin_dir": layout.pin_dir, "fence_file": layout.fence_file, **args},
    )
    assert result.get("failed") is True
    assert message in result["msg"]
    assert maps_bytes(layout) == before


def test_bad_input_through_module_utils_changes_nothing(layout, netns, router_object):
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=20)
    set_route(layout, "other", port=SERVICE_PORT + 1, weight=1)
    before = maps_bytes(layout)
    bad_calls = [
        ({"name": "svc", "weight": -1}, "weight must be"),
        ({"name": "svc", "weight": 100.001}, "weight must be"),
        ({"name": "svc", "weight": 12.345}, "more than two decimals"),
        ({"name": "svc", "weight": True}, "weight must be"),
        ({"name": "svc", "port": SERVICE_PORT + 1}, "already routed by route 'other'"),
        ({"name": "svc", "port": 9, "weight": 5}, "cannot change in place"),
        ({"name": "new", "port": SERVICE_PORT, "weight": 5}, "already routed by route 'svc'"),
        ({"name": "nosuch", "weight": 5}, "give port to create it"),
        ({"name": "bad name", "port": 1234}, "name must be"),
        ({"name": "svc\n", "weight": 5}, "name must be"),
        ({"name": "svc", "weight": 250}, "weight must be a percentage from 0 to 100"),
        ({"name": "svc", "hash_mode": "sideways"}, "hash must be one of connection, client"),
        ({"name": "svc", "hash_mode": "Client", "weight": 30}, "hash must be one of"),
    ]
    for kwargs, message in bad_calls:
        with pytest.raises(FleetError, match=message.replace("(", r"\(")):
            set_route(layout, **kwargs)
        assert maps_bytes(layout) == before, kwargs
    assert remove_route(layout, "nosuch")["changed"] is False
    assert maps_bytes(layout) == before


def test_missing_pins_fail_clearly(bpffs, tmp_path):
    nowhere = PinLayout(os.path.join(bpffs, "zlt-never-attached"))
    with pytest.raises(FleetError, match=r"router maps are not pinned under .*zlt-never-attached"):
        set_route(nowhere, "svc", port=SERVICE_PORT, weight=5)
    assert not os.path.exists(nowhere.pin_dir)
    result = ansible("route", name="svc", weight=5, pin_dir=nowhere.pin_dir)
    assert result["failed"] and "attach the router first" in result["msg"]

    not_bpffs = PinLayout(str(tmp_path / "zerolayer"))
    with pytest.raises(FleetError, match="must be on a bpffs"):
        router_lifecycle.attach(not_bpffs, __file__)


def test_router_check_mode_changes_nothing(layout, netns, router_object, upgraded_object):
    preview = router_lifecycle.attach(layout, router_object, netns.path, check_mode=True)
    assert preview["changed"] and preview["actions"][0] == "load program"
    assert not os.path.exists(layout.pin_dir)

    router_lifecycle.attach(layout, router_object, netns.path)
    running = router_lifecycle.router_state(layout)
    upgrade = router_lifecycle.attach(layout, upgraded_object, netns.path, check_mode=True)
    assert upgrade["changed"] and upgrade["actions"][0].startswith("upgrade program")
    assert router_lifecycle.router_state(layout) == running
    assert sorted(os.listdir(layout.pin_dir)) == ["link", "maps", "prog"]
    assert router_lifecycle.detach(layout, check_mode=True)["changed"]
    assert router_lifecycle.router_state(layout)["attached"]
