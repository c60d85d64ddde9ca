"""The node's fence cannot be reset, inflated or moved, on a real router
and a real etcd, through zerolayer-routectl as the node runs it: the fence file and the
writers' lock are the router's, whatever file a writer names; an epoch the store never had
cannot raise traffic; a node that lost its fence file takes the store's before a raise."""

import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    REREAD_ACTION,
    raise_fence,
    read_fence,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    PinLayout,
    WriterLockTimeout,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
)

from .conftest import SERVICE_PORT, file_bytes, maps_bytes, ok, routectl

PREFIX = "/zlt-node-fence/"
SET_WEIGHT = ("set-weight", "--route", "chat", "--weight")


@pytest.fixture
def store(etcd):
    return RolloutStore(EtcdClient(etcd.url, timeout=3), PREFIX)


@pytest.fixture
def routed(layout, netns, router_object):
    """An attached router with route chat at weight 0."""
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "chat", SERVICE_PORT, 0)
    return layout


def node_config(tmp_path, layout, etcd=None):
    """The node config as the ebpf_router role writes it for this router, with the store
    client settings the rollout_store role's node_client writes (none: a path that is not)."""
    store_config = tmp_path / "store.json"
    if etcd is not None:
        store_config.write_text(
            json.dumps({"endpoints": [etcd.url], "node": "zlt-node-1", "prefix": PREFIX})
        )
    path = tmp_path / "router.json"
    path.write_text(
        json.dumps(
            {
                "pin_dir": layout.pin_dir,
                "fence_file": layout.fence_file,
                "store_config": str(store_config),
                "routes": [],
            }
        )
    )
    return str(path)


def weight_of(layout):
    return {route.name: route.weight_bp for route in read_routes(layout)}["chat"]


def test_a_writer_naming_another_fence_file_is_refused_and_takes_the_routers_lock(routed, tmp_path):
    config = node_config(tmp_path, routed)
    other = str(tmp_path / "elsewhere" / "fence.json")
    stray = PinLayout(routed.pin_dir, fence_file=other)
    raise_fence(routed.fence_file, 4, "fast rollback")
    maps_before, fence_before = maps_bytes(routed), file_bytes(routed.fence_file)
    # The stray file reads as epoch 0: before, this write of an old epoch went through.
    status, error = routectl(stray, *SET_WEIGHT, "100", "--epoch", "1", config=config)
    assert status == 2 and error["field"] == "fence_file", error
    assert other in error["error"] and routed.fence_file in error["error"], error
    assert maps_bytes(routed) == maps_before and file_bytes(routed.fence_file) == fence_before
    assert not os.path.exists(os.path.dirname(other))
    # The node's own file, named or not, is checked as ever.
    status, error = routectl(routed, *SET_WEIGHT, "100", "--epoch", "1", config=config)
    assert status == 2 and error["field"] == "epoch" and error["node_epoch"] == 4, error
    assert ok(routed, *SET_WEIGHT, "100", "--epoch", "4", config=config)["after"]["weight"] == 100
    # Whatever fence file a writer names, it waits for the router's one writer lock.
    with writer_lock(stray, "a writer naming another fence file"):
        with pytest.raises(WriterLockTimeout) as waited:
            with writer_lock(routed, "the canary", timeout=0.2):
                pass
    assert "a writer naming another fence file" in waited.value.message
    assert not os.path.exists(routed.writer_lock_file), "no lock file is left behind"


def test_an_epoch_the_store_never_had_cannot_raise_traffic(routed, store, etcd, tmp_path):
    config = node_config(tmp_path, routed, etcd)
    store.raise_fence("fast", "a rollback", "pytest")
    store.raise_fence("fast", "a rollback", "pytest")
    raise_fence(routed.fence_file, 2, "fast rollback")
    maps_before, fence_before = maps_bytes(routed), file_bytes(routed.fence_file)
    status, error = routectl(routed, *SET_WEIGHT, "50", "--epoch", str(10**9), config=config)
    assert status == 2 and error["field"] == "epoch", error
    assert (error["epoch"], error["store_epoch"], error["node_epoch"]) == (10**9, 2, 2), error
    assert "1000000000" in error["error"] and "fence epoch 2" in error["error"], error
    assert maps_bytes(routed) == maps_before and file_bytes(routed.fence_file) == fence_before
    # The store's epoch raises traffic, and the node was not locked out by the made-up one.
    admitted = ok(routed, *SET_WEIGHT, "50", "--epoch", "2", config=config)
    assert admitted["after"]["weight"] == 50 and admitted["warnings"] == [], admitted
    # A node behind the store records an epoch the store has.
    store.raise_fence("fast", "a rollback", "pytest")
    ok(routed, *SET_WEIGHT, "60", "--epoch", "3", config=config)
    assert read_fence(routed.fence_file)["epoch"] == 3 and weight_of(routed) == 6000


def test_a_node_that_lost_its_fence_file_takes_the_stores_before_a_raise(
    routed, store, etcd, tmp_path
):
    config = node_config(tmp_path, routed, etcd)
    store.raise_fence("deep", "a rollback the node saw", "pytest", at_least=2)
    set_route(routed, "chat", weight=30)
    if os.path.exists(routed.fence_file):
        os.unlink(routed.fence_file)  # a reimage, an rm, a restored /var/lib
    maps_before = maps_bytes(routed)
    status, error = routectl(routed, *SET_WEIGHT, "50", "--epoch", "1", config=config)
    assert status == 2 and error["field"] == "epoch" and error["node_epoch"] == 3, error
    # Nothing changed: the epoch re-read from the store is no rollback to write zeros for.
    assert maps_bytes(routed) == maps_before and weight_of(routed) == 3000
    kept = read_fence(routed.fence_file)
    assert kept["epoch"] == 3 and kept["action"] == REREAD_ACTION, kept
    # A writer that took the store's epoch goes through.
    ok(routed, *SET_WEIGHT, "50", "--epoch", "3", config=config)
    assert weight_of(routed) == 5000


def test_a_store_that_is_down_stops_no_writer_and_is_said(routed, etcd, tmp_path):
    config = node_config(tmp_path, routed, etcd)
    etcd.stop()
    admitted = ok(routed, *SET_WEIGHT, "50", "--epoch", "4", config=config)
    assert admitted["after"]["weight"] == 50, admitted
    assert len(admitted["warnings"]) == 1, admitted
    assert "could not be read" in admitted["warnings"][0], admitted
    assert read_fence(routed.fence_file)["epoch"] == 4
    # The usual write (no epoch above the node's) does not even ask.
    assert ok(routed, *SET_WEIGHT, "40", "--epoch", "4", config=config)["warnings"] == []
