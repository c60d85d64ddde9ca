"""Writers at the same time: the maps stay consistent, and a rollback never waits."""

import json
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    router_lifecycle,
    routes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    read_slots,
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    raise_fence,
    read_fence,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    check_pinned_maps,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

from .conftest import ENGINE_PORT, SERVICE_PORT

STORM = os.path.join(os.path.dirname(__file__), "writer_storm.py")


def start_writer(netns, layout, stop_file, kind, *args):
    argv = [sys.executable, STORM, kind, layout.pin_dir, layout.fence_file, stop_file, *args]
    return netns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for(path, proc, seconds=30):
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise AssertionError("writer exited early: %s" % proc.stderr.read())
        assert time.monotonic() < deadline, "writer did not start"
        time.sleep(0.01)


def rollback(layout):
    out, err = _Capture(), _Capture()
    status = node_cli.run(
        ["--config", "/nonexistent/router.json", "--pin-dir", layout.pin_dir,
         "--fence-file", layout.fence_file, "rollback"],
        stdout=out, stderr=err,
    )  # fmt: skip
    assert status == 0, err.text
    return json.loads(out.text)


class _Capture:
    def __init__(self):
        self.text = ""

    def write(self, text):
        self.text += text

    def flush(self):
        pass


@pytest.fixture
def routed(layout, netns, proxy, engine, router_object):
    router_lifecycle.attach(layout, router_object, netns.path)
    routes.set_route(layout, "chat", SERVICE_PORT, 10)
    routes.set_route(layout, "batch", SERVICE_PORT + 1, 10)
    register_engine_socket(layout, "chat", engine.pid, ENGINE_PORT, timeout=10)
    return layout


def test_a_rollback_does_not_wait_for_a_writer_holding_the_lock(routed, netns, tmp_path):
    routes.set_route(routed, "chat", weight=100)
    stop = str(tmp_path / "stop")
    holder = start_writer(netns, routed, stop, "hold-lock")
    try:
        wait_for(stop + ".held", holder)
        # Another writer is refused after its bounded wait, naming the holder.
        with pytest.raises(FleetError, match="pid and purpose: %d the hold-lock" % holder.pid):
            with writer_lock(routed, "a second writer", timeout=0.2):
                pass
        result = rollback(routed)
        assert result["rolled_back"] is True, result
        assert {route["route"]: route["weight"] for route in result["routes"]} == {
            "chat": 0,
            "batch": 0,
        }
        assert holder.poll() is None, "the holder let go: the rollback may have waited for it"
        print("rollback while the writer lock was held: %.3f ms" % result["elapsed_ms"])
    finally:
        open(stop, "w").close()
        holder.wait(timeout=30)
    assert [route.weight_bp for route in routes.read_routes(routed)] == [0, 0]


def test_a_weight_written_just_after_a_rollback_is_zeroed_as_its_writer_leaves(routed, monkeypatch):
    """The interleaving no lock prevents: the writer admitted its epoch, then the rollback
    raised the fence and wrote its zeros, then the writer's weight landed."""
    write_route = routes._write_route

    def rollback_between_admit_and_write(layout, entry, new, **order):
        raise_fence(layout.fence_file, None, "fast rollback")
        routes.zero_weights(layout)
        write_route(layout, entry, new, **order)  # the stale 100 % lands after the zeros...

    monkeypatch.setattr(routes, "_write_route", rollback_between_admit_and_write)
    routes.set_route(routed, "chat", weight=100)
    monkeypatch.undo()
    # ...and is gone once set_route has returned.
    assert {route.name: route.weight_bp for route in routes.read_routes(routed)} == {
        "chat": 0,
        "batch": 0,
    }


def test_a_rollback_writes_the_zeros_again_when_a_late_weight_lands_before_its_read_back(
    routed, monkeypatch
):
    """A writer admitted before the fence writes its weight after the rollback's zeros and
    has not yet left its lock: the rollback's read-back must not report that moment."""
    routes.set_route(routed, "chat", weight=100)
    zero_weights = routes.zero_weights
    late_writes = []

    def zeros_then_a_late_weight(layout):
        done = zero_weights(layout)
        if not late_writes:
            chat = routes.find_route(routes.read_routes(layout), "chat")
            routes._write_route(layout, chat.replace(weight_bp=10000), new=False)
            late_writes.append(chat.name)
        return done

    monkeypatch.setattr(routes, "zero_weights", zeros_then_a_late_weight)
    result = rollback(routed)
    monkeypatch.undo()
    assert late_writes == ["chat"]
    assert result["rolled_back"] is True, result
    assert {route["route"]: route["weight"] for route in result["routes"]} == {
        "chat": 0,
        "batch": 0,
    }
    assert [route.weight_bp for route in routes.read_routes(routed)] == [0, 0]


def test_concurrent_writers_leave_consistent_maps_and_the_rollback_sticks(
    routed, netns, engine, router_object, upgraded_object, tmp_path
):
    stop = str(tmp_path / "stop")
    writers = [start_writer(netns, routed, stop, "set-weight", "chat", "batch") for _n in range(3)]
    writers.append(
        start_writer(netns, routed, stop, "register", "chat", str(engine.pid), str(ENGINE_PORT))
    )
    writers.append(
        start_writer(netns, routed, stop, "attach", upgraded_object, router_object, netns.path)
    )
    reports = []
    try:
        # Every writer got a write through before the fence goes up, however slowly a
        # loaded machine started them (a fixed wait once left one with none).
        deadline = time.monotonic() + 60
        while len([n for n in os.listdir(tmp_path) if n.startswith("stop.wrote.")]) < len(writers):
            assert time.monotonic() < deadline, "not every writer wrote within 60 s"
            time.sleep(0.05)
        time.sleep(1)  # all of them writing at once
        result = rollback(routed)
        assert result["rolled_back"] is True, result
        epoch = result["fence_epoch"]
        time.sleep(2)  # the writers go on, with no epoch: every raise must be refused
    finally:
        open(stop, "w").close()
        for proc in writers:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            reports.append(json.loads(out))

    print("writers: %s" % reports)
    for report in reports:
        assert report["failed"] == 0, report["samples"]
        assert report["done"] > 0, reports
    assert sum(report["fenced"] for report in reports[:3]) > 0, "no raise was refused"
    assert read_fence(routed.fence_file)["epoch"] == epoch
    check_pinned_maps(routed)
    live = routes.read_routes(routed)
    assert {route.name: route.weight_bp for route in live} == {"chat": 0, "batch": 0}
    chat = routes.find_route(live, "chat")
    slots = read_slots(routed, chat.route_index)
    assert set(slots) <= {0, 1} and slots, slots
    assert chat.slot_limit == max(slots) + 1
    state = router_lifecycle.router_state(routed)
    assert state["attached"], state
    assert netns.clients(count=50)["served"] == {"proxy": 50}
