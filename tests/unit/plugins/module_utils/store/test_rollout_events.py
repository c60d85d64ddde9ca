"""Events from record writes: every transition one event, gate verdict changes, restarts."""

import datetime

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events as ev

T0 = datetime.datetime(2026, 12, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
ME = "sre@controller"
KEY = "chat-1/wave_canary"
SCHEDULE = [{"weight": 1, "hold": 60}, {"weight": 20, "hold": 60}, {"weight": 100}]


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def planned():
    record, _changed, _note = r.plan(None, "chat-1:wave_canary", SCHEDULE, None, False, at(0), ME)
    return record


def step(record, action, seconds, **params):
    after, _changed = r.apply(record, action, params, at(seconds), ME)
    return after


def gate_result(verdict, **gates):
    return {
        "verdict": verdict,
        "decision": "continue",
        "reason": "r",
        "gates": [{"name": name, "verdict": value} for name, value in gates.items()],
    }


def test_a_new_record_is_one_started_event_named_by_its_key():
    (event,) = ev.record_events(KEY, None, planned())
    assert event["type"] == "started"
    assert (event["rollout_id"], event["wave"], event["stage"], event["weight"]) == (
        "chat-1",
        "wave_canary",
        1,
        1,
    )
    assert event["actor"] == ME and event["at"] == "2026-12-01T12:00:00Z"


def started():
    return step(planned(), "stage_started", 1, stage=0)


def holding():
    return step(started(), "hold_started", 2)


@pytest.mark.parametrize(
    "before, action, params, kind",
    [
        (planned, "stage_started", {"stage": 0}, "stage_started"),
        (
            started,
            "weight_confirmed",
            {"nodes": {"n1": {"weight": 1, "generation": 2}}},
            "weight_confirmed",
        ),
        (started, "hold_started", {}, "hold_started"),
        (holding, "pause", {"reason": "look at p99"}, "paused"),
        (holding, "abort", {"reason": "bad build"}, "aborted"),
        (holding, "rolled_back", {"reason": "gate failed"}, "rolled_back"),
        (holding, "promote", {"reason": "enough data"}, "promoted"),
        (holding, "promote_full", {"reason": "all in"}, "promoted"),
    ],
)
def test_each_transition_is_one_event_of_its_type(before, action, params, kind):
    record = before()
    events = ev.record_events(KEY, record, step(record, action, 5, **params))
    assert [e["type"] for e in events] == [kind], events
    assert events[0]["rollout_id"] == "chat-1" and events[0]["wave"] == "wave_canary"
    if params.get("reason"):
        assert events[0]["reason"] == params["reason"]
    if action == "weight_confirmed":
        assert events[0]["nodes"] == ["n1"]
    if action == "promote_full":
        assert events[0]["detail"]["full"] is True


def test_resume_after_pause_and_completion_are_events():
    paused = step(holding(), "pause", 3, reason="x")
    resumed = step(paused, "resume", 4, reason="fine")
    assert [e["type"] for e in ev.record_events(KEY, paused, resumed)] == ["resumed"]
    done = step(resumed, "stage_completed", 70)
    (event,) = ev.record_events(KEY, resumed, done)
    assert (event["type"], event["stage"], event["weight"]) == ("hold_done", 1, 1)


def test_an_unchanged_record_makes_no_event():
    record = planned()
    assert ev.record_events(KEY, record, record) == []


def test_a_recorded_verdict_is_no_event_of_the_record():
    held = holding()
    judged = step(held, "verdict", 10, verdict=gate_result("pass", success_rate="pass"))
    assert ev.record_events(KEY, held, judged) == [], "canary_gate tells of verdict changes"


def test_gate_verdicts_make_an_event_only_when_they_change():
    first = {"gates": {"success_rate": "no_data"}, "verdict": "hold", "decision": "continue"}
    event = ev.verdicts_changed(KEY, 2, 5, None, first, "2026-12-01T12:00:00Z", ME)
    assert (event["type"], event["stage"], event["weight"]) == ("gate_verdicts_changed", 2, 5)
    assert event["detail"]["changed"] == ["success_rate"] and "previous" not in event["detail"]
    assert ev.verdicts_changed(KEY, 2, 5, first["gates"], first, "t", ME) is None
    passed = {"gates": {"success_rate": "pass"}, "verdict": "pass", "decision": "continue"}
    event = ev.verdicts_changed(KEY, 2, 5, first["gates"], passed, "t", ME)
    assert event["detail"]["previous"] == {"success_rate": "no_data"}
    assert event["detail"]["gates"] == {"success_rate": "pass"}
    assert (event["rollout_id"], event["wave"]) == ("chat-1", "wave_canary")


def test_a_restarted_record_counts_from_its_own_start():
    old = holding()
    new, _changed, note = r.plan(old, "chat-1:wave_canary", SCHEDULE, None, True, at(50), ME)
    assert note == "restarted"
    assert [e["type"] for e in ev.record_events(KEY, old, new)] == ["started"]


def test_event_types_are_checked():
    with pytest.raises(FleetError) as caught:
        ev.event("exploded", "chat-1", "2026-12-01T12:00:00Z", ME)
    assert caught.value.details["field"] == "type" and "fleet_rolled_back" in caught.value.message


def test_summary_line_says_what_where_why_and_who():
    event = ev.event(
        "fleet_rolled_back",
        None,
        "2026-12-01T12:00:00Z",
        ME,
        nodes=["n%d" % i for i in range(7)],
        reason="p99 page",
        mode="deep",
        seconds=2.345,
    )
    line = ev.summary_line(event)
    assert line.startswith("fleet rolled back: fleet (deep, 2.35 s)")
    assert "n0, n1, n2, n3, n4 and 2 more" in line and "p99 page" in line and ME in line


def confirmed():
    read_back = {"weight": 1, "generation": 2}
    return step(started(), "weight_confirmed", 2, nodes={"n1": read_back, "n2": read_back})


SPLIT_OK = {"ok": True, "measured_pct": 1.1, "low_pct": 0.2, "high_pct": 2.4, "connections": 900}


def test_a_measured_split_is_kept_per_stage_and_is_one_event():
    before = confirmed()
    after = step(before, "split_measured", 3, splits={"n1": SPLIT_OK, "n2": SPLIT_OK})
    assert after["splits"]["0"]["n2"]["measured_pct"] == 1.1
    (event,) = ev.record_events(KEY, before, after)
    assert (event["type"], event["nodes"], event["detail"]["off"]) == (
        "split_verified",
        ["n1", "n2"],
        [],
    )
    off = dict(SPLIT_OK, ok=False, measured_pct=9.0)
    after = step(before, "split_measured", 3, splits={"n1": SPLIT_OK, "n2": off})
    (event,) = ev.record_events(KEY, before, after)
    assert (event["type"], event["nodes"]) == ("split_off", ["n2"])


@pytest.mark.parametrize(
    "splits, field",
    [
        ({}, "splits"),
        ({"n9": SPLIT_OK}, "splits[n9]"),
        ({"n1": {"measured_pct": 1}}, "splits[n1]"),
    ],
)
def test_a_bad_split_names_the_field_and_changes_nothing(splits, field):
    before = confirmed()
    with pytest.raises(FleetError) as caught:
        r.apply(before, "split_measured", {"splits": splits}, at(3), ME)
    assert caught.value.details["field"] == field, caught.value.message
    assert "splits" not in before or before["splits"] == {}


COHORT = ["10.1.0.0/16", "192.0.2.7/32"]
# A cohort stage (weight 0, only its clients go direct) before 1 %, as the rollout module
# normalises it: every stage has a "cohort" list.
COHORT_SCHEDULE = [
    {"weight": 0, "weight_bp": 0, "hold_s": 60, "cohort": COHORT},
    {"weight": 1, "weight_bp": 100, "hold_s": 60, "cohort": []},
    {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
]


def test_a_cohort_stage_event_names_its_cohort_where_a_weight_would_say_zero():
    record = planned()
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    cohort_started = step(record, "stage_started", 1, stage=0)
    (event,) = ev.record_events(KEY, record, cohort_started)
    assert (event["type"], event["stage"], event["weight"]) == ("stage_started", 1, 0)
    assert event["detail"]["cohort"] == COHORT
    assert ev.summary_line(event) == (
        "stage started: chat-1, wave wave_canary, stage 1, cohort (2 prefixes) at 0%% [by %s]" % ME
    )
    # The next stage writes its weight and clears the cohort: its events are the weight's.
    later = step(step(cohort_started, "stage_completed", 2), "stage_started", 3, stage=1)
    (done, started_1) = ev.record_events(KEY, cohort_started, later)
    assert done["type"] == "hold_done" and done["detail"]["cohort"] == COHORT
    assert started_1["weight"] == 1 and "cohort" not in started_1["detail"]
    assert ", stage 2, 1%" in ev.summary_line(started_1)


def test_events_of_a_record_from_before_cohort_stages_have_no_cohort():
    events = ev.record_events(KEY, None, started())
    assert events and all("cohort" not in entry["detail"] for entry in events)
    assert ev.summary_line(events[-1]).startswith(
        "stage started: chat-1, wave wave_canary, stage 1, 1%"
    )
