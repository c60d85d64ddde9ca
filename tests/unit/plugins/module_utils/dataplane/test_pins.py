"""Which fence file and which writers' lock a router has: the node's, not its caller's
(pins.node_layout, pins.writer_lock_path)."""

import io
import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import pins
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    DEFAULT_FENCE_FILE,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

PIN_DIR = "/sys/fs/bpf/zerolayer-unit"


@pytest.fixture(autouse=True)
def lock_dir(tmp_path, monkeypatch):
    """The writers' locks of this test's own: nothing under the machine's /run."""
    directory = tmp_path / "writer-locks"
    monkeypatch.setattr(pins, "WRITER_LOCK_DIR", str(directory), raising=False)
    return directory


@pytest.fixture
def node_config(tmp_path):
    """The node config as the ebpf_router role writes it, naming this test's fence file."""
    fence_file = str(tmp_path / "node" / "fence.json")
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"pin_dir": PIN_DIR, "fence_file": fence_file, "routes": []}))
    return str(path), fence_file


def test_every_writer_of_a_router_takes_one_lock_whatever_fence_file_it_names(tmp_path, lock_dir):
    one = pins.PinLayout(PIN_DIR, fence_file=str(tmp_path / "a" / "fence.json"))
    other = pins.PinLayout(PIN_DIR + "/", fence_file=str(tmp_path / "b" / "fence.json"))
    assert one.writer_lock_file == other.writer_lock_file
    assert os.path.dirname(one.writer_lock_file) == str(lock_dir), "not beside a fence file"
    assert pins.PinLayout("/sys/fs/bpf/another").writer_lock_file != one.writer_lock_file


def test_a_writer_naming_another_fence_file_waits_for_the_routers_lock(tmp_path):
    holder = pins.PinLayout(PIN_DIR, fence_file=str(tmp_path / "a" / "fence.json"))
    stray = pins.PinLayout(PIN_DIR, fence_file=str(tmp_path / "b" / "fence.json"))
    with pins.writer_lock(holder, "the canary"):
        with pytest.raises(pins.WriterLockTimeout) as waited:
            with pins.writer_lock(stray, "a stray writer", timeout=0.05):
                pass
    assert "the canary" in waited.value.message


def test_a_fence_file_other_than_the_nodes_is_refused_naming_both(node_config, tmp_path):
    path, fence_file = node_config
    other = str(tmp_path / "elsewhere" / "fence.json")
    with pytest.raises(FleetError) as refused:
        pins.layout_from_params({"pin_dir": PIN_DIR, "fence_file": other}, config_path=path)
    message = refused.value.message
    assert other in message and fence_file in message and path in message
    assert refused.value.details["field"] == "fence_file"
    assert refused.value.details["value"] == other
    assert refused.value.details["node_fence_file"] == fence_file
    assert not os.path.exists(os.path.dirname(other)), "a refusal changes nothing"


def test_the_modules_default_and_the_nodes_own_file_are_the_nodes(node_config):
    path, fence_file = node_config
    for given in (DEFAULT_FENCE_FILE, fence_file, fence_file.replace("/node/", "/node//")):
        layout = pins.layout_from_params({"pin_dir": PIN_DIR, "fence_file": given}, path)
        assert layout.fence_file == fence_file, given
        assert layout.store_config == "/etc/zerolayer/store.json"


def test_without_a_node_config_of_its_own_the_callers_file_stands(node_config, tmp_path):
    path, _fence_file = node_config
    given = str(tmp_path / "test-router" / "fence.json")
    # No node config at all (a unit test, a router attached by hand).
    missing = str(tmp_path / "no-such" / "router.json")
    layout = pins.layout_from_params({"pin_dir": PIN_DIR, "fence_file": given}, missing)
    assert (layout.fence_file, layout.store_config) == (given, None)
    # A node config that is another router's (another pin_dir).
    layout = pins.layout_from_params({"pin_dir": "/sys/fs/bpf/zlt-x", "fence_file": given}, path)
    assert (layout.fence_file, layout.store_config) == (given, None)


def test_a_node_config_without_fence_file_means_the_default_one(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps({"pin_dir": PIN_DIR, "store_config": "/etc/zl/store.json"}))
    other = str(tmp_path / "fence.json")
    with pytest.raises(FleetError) as refused:
        pins.node_layout(PIN_DIR, other, pins.read_node_config(str(path)), str(path))
    assert refused.value.details["node_fence_file"] == DEFAULT_FENCE_FILE
    layout = pins.node_layout(None, None, pins.read_node_config(str(path)))
    assert (layout.pin_dir, layout.fence_file) == (PIN_DIR, DEFAULT_FENCE_FILE)
    assert layout.store_config == "/etc/zl/store.json"


def test_an_unreadable_node_config_is_refused_not_read_as_none(tmp_path):
    path = tmp_path / "router.json"
    path.write_text("{not json")
    with pytest.raises(FleetError) as refused:
        pins.layout_from_params({"pin_dir": PIN_DIR, "fence_file": None}, str(path))
    assert refused.value.details["field"] == "config"


def test_routectl_refuses_another_fence_file_before_it_touches_the_router(node_config, tmp_path):
    path, fence_file = node_config
    other = str(tmp_path / "elsewhere" / "fence.json")
    out, err = io.StringIO(), io.StringIO()
    argv = ["--config", path, "--fence-file", other, "set-weight", "--route", "chat"]
    status = node_cli.run([*argv, "--weight", "100", "--epoch", "3"], stdout=out, stderr=err)
    error = json.loads(err.getvalue())
    assert status == node_cli.EXIT_REJECTED and error["field"] == "fence_file", error
    assert other in error["error"] and fence_file in error["error"]
    assert error["node_fence_file"] == fence_file and out.getvalue() == ""
    assert not os.path.exists(os.path.dirname(other)) and not os.path.exists(fence_file)


def test_routectl_and_the_modules_share_one_node_config_path():
    assert node_cli.DEFAULT_CONFIG == pins.DEFAULT_NODE_CONFIG
    assert node_cli.DEFAULT_FENCE_FILE == DEFAULT_FENCE_FILE
    assert node_cli.DEFAULT_STORE_CONFIG == pins.DEFAULT_STORE_CONFIG


def test_the_lock_file_goes_with_its_last_holder(lock_dir):
    layout = pins.PinLayout(PIN_DIR)
    with pins.writer_lock(layout, "the canary"):
        with open(layout.writer_lock_file) as handle:
            assert handle.read().split(" ", 1)[1] == "the canary\n"
    assert os.listdir(str(lock_dir)) == [], "no router leaves a lock file behind"


def test_a_waiter_on_a_removed_lock_file_does_not_hold_the_lock(lock_dir):
    import fcntl

    layout = pins.PinLayout(PIN_DIR)
    with pins.writer_lock(layout, "first"):
        # A waiter's fd, opened before the holder removed the file and let go.
        stale = os.open(layout.writer_lock_file, os.O_RDWR)
    try:
        with pins.writer_lock(layout, "next"):
            fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # free: nobody's lock now
            assert not pins._is_at(stale, layout.writer_lock_file)
    finally:
        os.close(stale)


def test_writers_in_threads_never_overlap(lock_dir):
    import threading
    import time

    layout = pins.PinLayout(PIN_DIR)
    inside, most, errors = [0], [0], []

    def write():
        try:
            for _round in range(20):
                with pins.writer_lock(layout, "a writer", timeout=30):
                    inside[0] += 1
                    most[0] = max(most[0], inside[0])
                    time.sleep(0.0005)
                    inside[0] -= 1
        except Exception as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _thread in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == [] and most[0] == 1
    assert os.listdir(str(lock_dir)) == []
