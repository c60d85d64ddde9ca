"""The node's fence (fence.py): what it admits, what it refuses, what it keeps."""

import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import fence


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "state" / "fence.json")


def test_a_node_without_a_fence_file_is_at_epoch_zero(path):
    assert fence.read_fence(path) == {"epoch": 0}
    assert fence.admit(path, None, True, "weight 5%") == 0


def test_a_higher_epoch_is_recorded_and_an_older_one_cannot_raise_traffic(path):
    assert fence.admit(path, 3, True, "weight 5%") == 3
    assert fence.read_fence(path)["epoch"] == 3
    with pytest.raises(fence.FenceRefused) as refused:
        fence.admit(path, 2, True, "weight 20% on route 'chat'")
    message = refused.value.message
    assert "epoch 2" in message and "fence epoch 3" in message and "'chat'" in message
    assert refused.value.details == {"field": "epoch", "epoch": 2, "node_epoch": 3}
    assert fence.read_fence(path)["epoch"] == 3, "a refusal changes nothing"


def test_the_safe_direction_is_admitted_with_any_epoch(path):
    fence.raise_fence(path, 6)
    assert fence.admit(path, 1, False, "weight 0%") == 6
    assert fence.admit(path, None, False, "weight 0%") == 6


def test_check_mode_records_nothing(path):
    assert fence.admit(path, 4, True, "weight 5%", check_mode=True) == 0
    assert fence.raise_fence(path, 4, check_mode=True) == (0, 4)
    assert fence.read_fence(path) == {"epoch": 0}


def test_raise_keeps_the_higher_epoch_or_goes_one_above_its_own(path):
    assert fence.raise_fence(path, 5, "fast rollback") == (0, 5)
    assert fence.raise_fence(path, 2, "fast rollback") == (5, 5)
    assert fence.raise_fence(path, None, "deep rollback") == (5, 6)
    kept = fence.read_fence(path)
    assert kept["epoch"] == 6 and kept["action"] == "deep rollback" and kept["at"].endswith("Z")


@pytest.mark.parametrize("bad", [-1, True, 1.5, "three", [1]])
def test_a_bad_epoch_names_the_field(path, bad):
    with pytest.raises(FleetError) as failed:
        fence.admit(path, bad, True, "weight 5%")
    assert failed.value.details["field"] == "epoch"
    assert "whole number" in failed.value.message


def test_parse_epoch_takes_digits_and_none():
    assert fence.parse_epoch("12") == 12 and fence.parse_epoch(None) is None
    with pytest.raises(FleetError):
        fence.parse_epoch("12a")


@pytest.mark.parametrize("content", ["not json", json.dumps({"epoch": "3"}), json.dumps([3])])
def test_an_unreadable_fence_refuses_rather_than_reading_as_zero(tmp_path, content):
    path = tmp_path / "fence.json"
    path.write_text(content)
    with pytest.raises(FleetError) as failed:
        fence.admit(str(path), 9, True, "weight 5%")
    assert failed.value.details["field"] == "fence_file"
    assert path.read_text() == content


def test_the_fence_file_is_private_and_replaced_whole(path):
    import os

    fence.raise_fence(path, 2)
    assert os.stat(path).st_mode & 0o777 == 0o600
    # No temp file left behind; the lock file of the read-modify-writes stays, also private.
    assert sorted(os.listdir(os.path.dirname(path))) == ["fence.json", "fence.json.lock"]
    assert os.stat(path + ".lock").st_mode & 0o777 == 0o600


def test_writes_keep_the_records_other_keys(path):
    fence.write_fence(path, {"epoch": 2, "router": {"mode": "detached", "epoch": 2}})
    assert fence.admit(path, 3, True, "weight 5%") == 3
    assert fence.raise_fence(path, None, "fast rollback") == (3, 4)
    kept = fence.read_fence(path)
    assert kept["router"] == {"mode": "detached", "epoch": 2}, kept
    assert (kept["epoch"], kept["action"]) == (4, "fast rollback")


def test_raise_writes_the_record_it_is_given_in_the_same_write(path):
    assert fence.raise_fence(path, 5, "deep rollback", record=lambda e: {"mode_at": e}) == (0, 5)
    assert fence.read_fence(path)["mode_at"] == 5
    # An unchanged epoch still writes the record; check mode writes nothing.
    fence.raise_fence(path, 5, record=lambda e: {"note": "again"})
    assert fence.read_fence(path)["note"] == "again"
    fence.raise_fence(path, 9, check_mode=True, record=lambda e: {"note": "preview"})
    assert fence.read_fence(path)["note"] == "again" and fence.read_fence(path)["epoch"] == 5


def test_a_raise_and_a_writers_record_never_lose_each_other(path):
    """Processes raising the fence (no epoch: one above) at once: no raise is lost."""
    import multiprocessing

    fence.raise_fence(path, 1)
    workers = [multiprocessing.Process(target=_raise_many, args=(path, 25)) for _worker in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    assert fence.read_fence(path)["epoch"] == 1 + 4 * 25


def _raise_many(path, times):
    for _time in range(times):
        fence.raise_fence(path, None, "fast rollback")


@pytest.mark.parametrize("recorded", ['{"epoch": true}', '{"epoch": -1}', '{"epoch": 1.5}', "[3]"])
def test_a_fence_file_without_a_whole_epoch_is_refused_not_read_as_one(path, recorded):
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as handle:
        handle.write(recorded)
    with pytest.raises(FleetError) as refused:
        fence.read_fence(path)
    assert refused.value.details["field"] == "fence_file"
    # Nothing raises a weight while the file is wrong, and nothing rewrites it.
    with pytest.raises(FleetError):
        fence.admit(path, 4, True, "a canary step")
    with open(path) as handle:
        assert handle.read() == recorded


def test_the_fence_file_is_written_whole_and_private(path):
    fence.write_fence(path, {"epoch": 7, "action": "fast"})
    assert fence.read_fence(path) == {"epoch": 7, "action": "fast"}
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [n for n in os.listdir(os.path.dirname(path)) if n.startswith(".")] == []


def test_the_fence_files_directory_is_synced_after_the_rename(path, monkeypatch):
    """A rename that only the page cache knows of can be lost by a crash: the node would
    then come back with its old fence, or none."""
    import stat

    synced = []
    real_fsync = os.fsync

    def spy(fd):
        synced.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fence.raise_fence(path, 3, "fast rollback")
    assert synced == [False, True], "the file, then its directory"
