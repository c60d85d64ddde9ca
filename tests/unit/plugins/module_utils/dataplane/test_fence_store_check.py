"""The node's fence against the rollout store (fence.admit with store_epoch): an epoch
above the store's cannot raise traffic, a node that lost its fence file takes the store's
first, and a store that does not answer stops nothing but is said."""

import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "state" / "fence.json")


class FakeStore:
    """store_epoch for admit(): the store's fence epoch, or an outage; counts its reads."""

    def __init__(self, epoch=0, down=False):
        self.epoch = epoch
        self.down = down
        self.reads = 0

    def __call__(self):
        self.reads += 1
        if self.down:
            raise StoreUnavailable("the rollout store did not answer /v3/kv/range: refused")
        return self.epoch


def file_bytes(path):
    with open(path, "rb") as handle:
        return handle.read()


def test_an_epoch_above_the_stores_cannot_raise_traffic_and_is_not_recorded(path):
    fence.raise_fence(path, 2, "fast rollback")
    before = file_bytes(path)
    store = FakeStore(epoch=2)
    with pytest.raises(fence.FenceRefused) as refused:
        fence.admit(path, 10**9, True, "weight 5% on route 'chat'", store_epoch=store)
    message = refused.value.message
    assert "epoch 1000000000" in message and "fence epoch 2" in message and "'chat'" in message
    assert refused.value.details == {
        "field": "epoch",
        "epoch": 10**9,
        "store_epoch": 2,
        "node_epoch": 2,
    }
    assert file_bytes(path) == before, "a refusal changes nothing"
    # The store's own epoch still goes through: the made-up one did not lock it out.
    assert fence.admit(path, 2, True, "weight 5%", store_epoch=store) == 2


def test_a_node_behind_the_store_records_the_writers_epoch_when_the_store_has_it(path):
    store = FakeStore(epoch=4)
    assert fence.admit(path, 4, True, "weight 5%", store_epoch=store) == 4
    assert fence.read_fence(path)["epoch"] == 4 and store.reads == 1


def test_the_usual_write_never_asks_the_store(path):
    fence.raise_fence(path, 3)
    store = FakeStore(epoch=3)
    for epoch, raises in ((3, True), (2, False), (None, False), (3, False)):
        fence.admit(path, epoch, raises, "weight", store_epoch=store)
    assert store.reads == 0
    # No fence file and nothing raised without an epoch: nothing to ask either.
    other = path + ".other"
    fence.admit(other, None, False, "weight 0%", store_epoch=store)
    assert store.reads == 0 and not os.path.exists(other)


def test_a_lowering_write_with_a_made_up_epoch_goes_through_without_keeping_it(path):
    fence.raise_fence(path, 1)
    warnings = []
    store = FakeStore(epoch=3)
    assert fence.admit(path, 10**9, False, "weight 0%", store_epoch=store, warnings=warnings) == 3
    assert fence.read_fence(path)["epoch"] == 3 and warnings == []


def test_a_store_that_does_not_answer_admits_as_before_and_says_so(path):
    warnings = []
    store = FakeStore(down=True)
    assert fence.admit(path, 7, True, "weight 5%", store_epoch=store, warnings=warnings) == 7
    assert fence.read_fence(path)["epoch"] == 7
    assert len(warnings) == 1 and "could not be read" in warnings[0], warnings
    assert "weight 5%" in warnings[0] and "did not answer" in warnings[0]


def test_a_node_without_a_fence_file_takes_the_stores_epoch_before_a_raise(path):
    store = FakeStore(epoch=5)
    with pytest.raises(fence.FenceRefused) as refused:
        fence.admit(path, 3, True, "weight 5%", store_epoch=store)
    assert refused.value.details == {"field": "epoch", "epoch": 3, "node_epoch": 5}
    kept = fence.read_fence(path)
    assert kept["epoch"] == 5 and kept["action"] == fence.REREAD_ACTION, kept
    # A writer without an epoch is refused as well: a reimage must not read as "no fence".
    os.unlink(path)
    with pytest.raises(fence.FenceRefused):
        fence.admit(path, None, True, "weight 5%", store_epoch=store)
    assert fence.read_fence(path)["epoch"] == 5
    # The store's epoch itself is admitted.
    os.unlink(path)
    assert fence.admit(path, 5, True, "weight 5%", store_epoch=store) == 5


def test_check_mode_reads_the_store_but_writes_no_fence(path):
    store = FakeStore(epoch=5)
    with pytest.raises(fence.FenceRefused):
        fence.admit(path, 3, True, "weight 5%", check_mode=True, store_epoch=store)
    assert fence.admit(path, 5, True, "weight 5%", check_mode=True, store_epoch=store) == 5
    assert not os.path.exists(path)


def test_a_node_without_a_fence_file_and_no_store_answer_admits_and_says_so(path):
    warnings = []
    store = FakeStore(down=True)
    assert fence.admit(path, None, True, "weight 5%", store_epoch=store, warnings=warnings) == 0
    assert len(warnings) == 1 and not os.path.exists(path)


def test_a_store_epoch_that_is_no_epoch_is_said_not_trusted(path):
    warnings = []
    for bad in (True, -1):
        store = FakeStore(epoch=bad)
        assert fence.admit(path + str(bad), 2, True, "w", store_epoch=store, warnings=warnings) == 2
    assert len(warnings) == 2 and all("no whole epoch" in w for w in warnings), warnings


def test_the_reader_is_the_watchers_store_config_and_none_without_one(tmp_path):
    assert fence.store_epoch_reader(None) is None
    assert fence.store_epoch_reader(str(tmp_path / "no-store.json")) is None
    config = tmp_path / "store.json"
    # A port nothing listens on: refused at once, as a store that is down.
    config.write_text(json.dumps({"endpoints": ["http://127.0.0.1:9"], "node": "n1"}))
    read = fence.store_epoch_reader(str(config))
    with pytest.raises(StoreUnavailable):
        read()
    warnings = []
    path = str(tmp_path / "fence.json")
    assert fence.admit(path, 4, True, "weight 5%", store_epoch=read, warnings=warnings) == 4
    assert "could not be read" in warnings[0]
    config.write_text(json.dumps({"node": "n1"}))
    fence.admit(path, 6, True, "weight 5%", store_epoch=read, warnings=warnings)
    assert "names no endpoints" in warnings[1], warnings
