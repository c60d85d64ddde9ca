"""The rollout record's file format (common/record_codec.py): the codec and its atomic files."""

import datetime
import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout

T0 = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def holding():
    """A record of the rollout code holding its first stage."""
    record, _changed, _note = rollout.plan(None, "chat-1", None, None, False, T0, "sre@ctl")
    record, _changed = rollout.apply(record, "stage_started", {"stage": 0}, T0, "sre@ctl")
    record, _changed = rollout.apply(record, "hold_started", {}, T0, "sre@ctl")
    return record


def test_codec_round_trip(tmp_path):
    record = holding()
    path = tmp_path / "rollout.json"
    record_codec.write_record(str(path), record)
    assert record_codec.read_record(str(path)) == record
    assert record_codec.read_record(str(tmp_path / "missing.json")) is None


@pytest.mark.parametrize(
    ("text", "complaint"),
    [
        ("{", "not valid JSON"),
        ("[]", "JSON object"),
        ('{"format": 1}', "missing rollout_id"),
    ],
)
def test_decode_refuses_what_is_not_a_record(tmp_path, text, complaint):
    path = tmp_path / "rollout.json"
    path.write_text(text)
    with pytest.raises(FleetError) as caught:
        record_codec.read_record(str(path))
    assert complaint in caught.value.message


def test_decode_refuses_another_format_and_unknown_outcomes():
    record = holding()
    with pytest.raises(FleetError) as caught:
        record_codec.decode_record(dict(record, format=2))
    assert "format 2" in caught.value.message
    with pytest.raises(FleetError) as caught:
        record_codec.decode_record(dict(record, outcome="exploded"))
    assert "running, paused, completed, rolled_back, aborted" in caught.value.message


def test_atomic_write_replaces_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "state" / "gates.json"
    record_codec.write_json_atomic(str(path), {"n": 1})
    record_codec.write_json_atomic(str(path), {"n": 2})
    assert json.loads(path.read_text()) == {"n": 2}
    assert os.listdir(path.parent) == ["gates.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path, monkeypatch):
    path = tmp_path / "gates.json"
    record_codec.write_json_atomic(str(path), {"n": 1})

    def refuse(source, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(FleetError) as caught:
        record_codec.write_json_atomic(str(path), {"n": 2})
    assert "No space left on device" in caught.value.message
    assert json.loads(path.read_text()) == {"n": 1}
    assert os.listdir(tmp_path) == ["gates.json"]
