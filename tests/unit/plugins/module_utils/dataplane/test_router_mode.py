"""The router's mode record (router_mode.py): what a deep rollback keeps, what a restore leaves."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_mode
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    raise_fence,
    read_fence,
    write_fence,
)

SEEDS = (0x0123456789ABCDEF, 42)


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "fence.json")


def deep_rollback(path, epoch, seeds=None, reason=None):
    raise_fence(
        path, epoch, "deep rollback", record=router_mode.detached_record(path, reason, seeds)
    )
    return router_mode.read_mode(path)


def test_a_node_with_no_record_is_active(path):
    assert router_mode.read_mode(path) == {"mode": router_mode.ACTIVE}
    assert router_mode.is_detached(path) is False


def test_a_deep_rollback_keeps_its_epoch_reason_and_seeds(path):
    mode = deep_rollback(path, 4, SEEDS, "p99 above target")
    assert (mode["mode"], mode["epoch"], mode["reason"]) == (
        router_mode.DETACHED,
        4,
        "p99 above target",
    )
    assert router_mode.kept_seeds(mode) == SEEDS
    assert read_fence(path)["epoch"] == 4


def test_a_repeat_at_the_same_epoch_keeps_the_first_record(path):
    first = deep_rollback(path, 4, SEEDS, "first")
    assert deep_rollback(path, 4, None, "second") == first


def test_a_second_deep_rollback_with_nothing_attached_carries_the_kept_seeds_on(path):
    deep_rollback(path, 4, SEEDS)
    again = deep_rollback(path, 7, None, "fence rose again")
    assert (again["epoch"], again["reason"]) == (7, "fence rose again")
    assert router_mode.kept_seeds(again) == SEEDS


def test_a_deep_rollback_with_seeds_read_replaces_the_kept_ones(path):
    deep_rollback(path, 4, SEEDS)
    assert router_mode.kept_seeds(deep_rollback(path, 5, (1, 2))) == (1, 2)


def test_a_restore_leaves_detached_and_a_later_rollback_keeps_no_old_seeds(path):
    deep_rollback(path, 4, SEEDS)
    left = router_mode.record_active(path)
    assert left["mode"] == router_mode.DETACHED
    assert router_mode.read_mode(path)["mode"] == router_mode.ACTIVE
    assert router_mode.kept_seeds(deep_rollback(path, 5)) is None


def test_check_mode_restore_changes_nothing(path):
    deep_rollback(path, 4, SEEDS)
    before = read_fence(path)
    router_mode.record_active(path, check_mode=True)
    assert read_fence(path) == before


@pytest.mark.parametrize(
    "seeds",
    [None, [1], [1, 2, 3], [1, "2"], [-1, 2], [1, 1 << 64], [True, 2], "12"],
)
def test_only_two_64_bit_seeds_count_as_kept(seeds):
    assert router_mode.kept_seeds({"mode": router_mode.DETACHED, "seeds": seeds}) is None


@pytest.mark.parametrize("record", ["detached", {"mode": "paused"}, {"epoch": 3}, 7])
def test_a_record_it_does_not_understand_is_refused_never_read_as_active(path, record):
    write_fence(path, {"epoch": 3, router_mode.MODE_KEY: record})
    with pytest.raises(FleetError) as refused:
        router_mode.read_mode(path)
    assert refused.value.details["field"] == "fence_file"


def test_a_shown_mode_record_says_seeds_were_kept_and_never_shows_them(path):
    deep_rollback(path, 4, SEEDS)
    fence = read_fence(path)
    shown = router_mode.shown_fence(fence)
    assert shown["router"]["seeds_kept"] is True and "seeds" not in shown["router"]
    assert fence["router"]["seeds"] == list(SEEDS), "the file keeps them for a restore"
    assert router_mode.shown({"mode": router_mode.DETACHED, "seeds": [1]})["seeds_kept"] is False
    plain = {"mode": router_mode.ACTIVE, "epoch": 4}
    assert router_mode.shown(plain) == plain and router_mode.shown_fence({"epoch": 0}) == {
        "epoch": 0
    }
