"""The canary's end-of-run report (reports/canary_report.py), its filter and the lookup that
reads the controller's copies of the records it is made from."""

import json

import pytest
from ansible.errors import AnsibleFilterError, AnsibleLookupError
from ansible_collections.zerolayer.fleet.plugins.filter.canary_report import (
    canary_report as report_filter,
)
from ansible_collections.zerolayer.fleet.plugins.lookup.record_copies import LookupModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import canary_report as cr
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    mirror_copies,
)

from unit.helpers.rollout_steps import ME, act, at, unix

SCHEDULE = [{"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]
WAVES = [
    {"wave": "wave_canary", "outcome": "completed", "weight": 100},
    {"wave": "wave_rest", "outcome": "completed", "weight": 100},
]
HALT = {"kind": "paused", "wave": "wave_rest", "message": "Paused at stage 1 of wave wave_rest"}


def started(wave, minutes):
    record = r.plan(None, "chat:%s" % wave, SCHEDULE, None, False, at(minutes), ME)[0]
    return act(record, "stage_started", minutes + 1, stage=0)


def test_a_run_that_went_through_says_each_waves_outcome_and_weight():
    assert cr.summary_line("chat-2", {}, WAVES) == (
        "Rollout chat-2: wave wave_canary completed at 100%; wave wave_rest completed at 100%."
    )


def test_a_run_that_stopped_says_the_stops_own_message():
    assert cr.summary_line("chat-2", HALT, WAVES[:1]) == HALT["message"]


def test_the_report_has_the_stop_the_waves_and_one_row_per_wave_and_stage():
    records = {"wave_rest": started("wave_rest", 5), "wave_canary": started("wave_canary", 0)}
    report = cr.canary_report("chat-2", HALT, WAVES[:1], records, unix(30))
    assert set(report) == {"rollout_id", "stopped", "waves", "stages", "summary"}
    assert (report["rollout_id"], report["stopped"], report["waves"]) == ("chat-2", HALT, WAVES[:1])
    # The rows in the order the waves were planned, not the dict's.
    assert [row["wave"] for row in report["stages"]] == ["wave_canary", "wave_rest"]
    assert report["summary"] == HALT["message"]
    json.dumps(report)  # written as JSON as it is


def test_a_report_without_records_has_no_rows_and_still_a_summary():
    report = cr.canary_report("chat-2", None, WAVES, {}, unix(30))
    assert (report["stopped"], report["stages"]) == ({}, [])
    assert report["summary"].startswith("Rollout chat-2: wave wave_canary completed")


@pytest.mark.parametrize("stopped", [["paused"], {"kind": "paused"}], ids=["a list", "no message"])
def test_a_stop_that_is_not_a_halt_is_refused_naming_the_field(stopped):
    with pytest.raises(FleetError) as caught:
        cr.canary_report("chat-2", stopped, WAVES, {}, unix(30))
    assert caught.value.details["field"] == "stopped"
    with pytest.raises(AnsibleFilterError, match="canary_report: stopped must be"):
        report_filter({}, "chat-2", stopped, WAVES)


def test_the_filter_takes_the_records_first_and_builds_the_same_report():
    records = {"wave_canary": started("wave_canary", 0)}
    report = report_filter(records, "chat-2", {}, WAVES)
    assert [row["wave"] for row in report["stages"]] == ["wave_canary"]
    assert report["summary"] == cr.summary_line("chat-2", {}, WAVES)
    with pytest.raises(AnsibleFilterError, match="canary_report"):
        report_filter({"wave_canary": "not a record"}, "chat-2", {}, WAVES)


def test_the_copies_are_read_wave_by_wave_leaving_writes_in_progress_and_other_files(tmp_path):
    canary = started("wave_canary", 0)
    record_codec.write_record(str(tmp_path / "wave_canary.json"), canary)
    (tmp_path / ".wave_rest.json.x1y2").write_text("{half a write")
    (tmp_path / "notes.txt").write_text("not a record")
    (tmp_path / "sub.json").mkdir()
    assert mirror_copies(str(tmp_path)) == {"wave_canary": canary}
    assert mirror_copies(str(tmp_path / "none")) == {}


def test_a_copy_that_is_not_json_names_its_file(tmp_path):
    (tmp_path / "wave_canary.json").write_text("{half a write")
    with pytest.raises(FleetError, match=r"wave_canary\.json is not valid JSON"):
        mirror_copies(str(tmp_path))
    with pytest.raises(AnsibleLookupError, match=r"wave_canary\.json is not valid JSON"):
        LookupModule().run([str(tmp_path)])


def test_the_lookup_returns_one_dict_and_wants_one_directory(tmp_path):
    record_codec.write_record(str(tmp_path / "wave_canary.json"), started("wave_canary", 0))
    (copies,) = LookupModule().run([str(tmp_path)])
    assert list(copies) == ["wave_canary"]
    for terms in ([], [str(tmp_path), str(tmp_path)], [""]):
        with pytest.raises(AnsibleLookupError, match="one term"):
            LookupModule().run(terms)
