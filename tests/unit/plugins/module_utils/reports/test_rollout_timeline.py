"""The rollout timeline's series (rollout_timeline.timeline): what each kind of transition
makes of the weight line, the markers, the pause spans and the stop lines. Records are made
with the rollout module's own actions; times are minutes from T0."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import rollout_timeline as tl
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

from unit.helpers.rollout_steps import ME, T0, act, at, unix

SCHEDULE = [{"weight": 1, "hold": 600}, {"weight": 20, "hold": 600}, {"weight": 100, "hold": 0}]


def planned(wave="wave_canary", minutes=0):
    return r.plan(None, "chat:%s" % wave, SCHEDULE, None, False, at(minutes), ME)[0]


def started(stage=0, minutes=1, record=None):
    return act(record or planned(), "stage_started", minutes, stage=stage)


def confirmed(record, minutes, weight, nodes=("n1", "n2")):
    found = {name: {"generation": 1 + int(minutes), "weight": weight} for name in nodes}
    return act(record, "weight_confirmed", minutes, nodes=found)


def one(record, now_minutes=60):
    (wave,) = tl.timeline({"wave_canary": record}, unix(now_minutes))["waves"]
    return wave


def minutes_steps(wave):
    return [[round((moment - unix(0)) / 60, 3), weight] for moment, weight in wave["weight_steps"]]


def test_a_plan_alone_is_weight_0_until_now():
    wave = one(planned(), now_minutes=5)
    assert minutes_steps(wave) == [[0, 0.0], [5, 0.0]]
    assert (wave["confirmed"], wave["verdicts"], wave["pauses"], wave["stops"]) == ([], [], [], [])


def test_stage_started_steps_to_its_weight_and_hold_and_completion_change_nothing():
    record = started(0, 1)
    record = act(act(record, "hold_started", 2), "stage_completed", 12)
    record = act(act(record, "stage_started", 13, stage=1), "hold_started", 14)
    assert minutes_steps(one(record, 30)) == [[0, 0.0], [1, 1.0], [13, 20.0], [30, 20.0]]


def test_weight_confirmed_is_a_marker_with_its_nodes():
    record = confirmed(started(0, 1), 1.5, 1)
    wave = one(record)
    assert wave["confirmed"] == [
        {"at": unix(1.5), "stage": 0, "weight": 1.0, "nodes": ["n1", "n2"]}
    ]
    assert wave["readback_off"] == []


def test_a_node_that_read_back_another_weight_is_named():
    record = confirmed(started(0, 1), 1.5, 1, nodes=("n1",))
    record = act(record, "weight_confirmed", 2, nodes={"n2": {"generation": 3, "weight": 0}})
    assert one(record)["readback_off"] == [{"at": unix(2), "node": "n2", "stage": 0, "weight": 0.0}]


def test_verdicts_are_markers_of_their_kind():
    record = act(started(0, 1), "hold_started", 1)
    for minutes, verdict, reason in (
        (2, "pass", "all 2 gates passed"),
        (3, "hold", "p99 holds: no data"),
        (4, "hold", "p99 holds: too few samples: 3 < 10"),
        (5, "fail", "p99 failed: 9 > 5"),
    ):
        result = {"verdict": verdict, "decision": "continue", "reason": reason}
        record = act(record, "verdict", minutes, verdict=result)
    assert [(p["at"], p["kind"], p["stage"]) for p in one(record)["verdicts"]] == [
        (unix(2), "pass", 0),
        (unix(3), "no_data", 0),
        (unix(4), "hold", 0),
        (unix(5), "fail", 0),
    ]


@pytest.mark.parametrize("ending", ["resume", "promote", "promote_full", "abort"])
def test_a_pause_is_a_span_to_whatever_ended_it(ending):
    record = act(started(0, 1), "pause", 3, reason="look")
    record = act(record, ending, 7, reason="done")
    assert one(record)["pauses"] == [{"from": unix(3), "to": unix(7), "reason": "look"}]


def test_a_pause_still_on_runs_to_now():
    record = act(started(0, 1), "pause", 3, reason="look")
    assert one(record, 45)["pauses"] == [{"from": unix(3), "to": unix(45), "reason": "look"}]


def test_abort_drops_the_weight_to_0_and_its_rollback_is_a_second_stop():
    record = act(started(1, 13, act(started(0, 1), "stage_completed", 12)), "abort", 20, reason="x")
    record = act(record, "rolled_back", 20.2, reason="fast: abort", details={"mode": "fast"})
    wave = one(record, 90)
    # Finished: the line ends at the last change, not at now.
    assert minutes_steps(wave) == [[0, 0.0], [1, 1.0], [13, 20.0], [20, 0.0], [20.2, 0.0]]
    assert wave["stops"] == [
        {"at": unix(20), "kind": "abort", "label": "abort"},
        {"at": unix(20.2), "kind": "fast", "label": "fast rollback"},
    ]


@pytest.mark.parametrize(
    "mode, kind, label", [("deep", "deep", "deep rollback"), (None, "rollback", "rollback")]
)
def test_a_rollback_is_labelled_with_its_mode(mode, kind, label):
    details = {"mode": mode} if mode else {}
    record = act(started(0, 1), "rolled_back", 4, reason="gates", details=details)
    wave = one(record)
    assert wave["stops"] == [{"at": unix(4), "kind": kind, "label": label}]
    assert wave["weight_steps"][-2:] == [[unix(4), 0.0], [unix(4), 0.0]]


def test_promote_full_waits_for_the_100_stage_to_start_and_completed_keeps_100():
    record = act(started(0, 1), "promote_full", 5, reason="go")
    record = act(started(2, 6, record), "completed", 7)
    assert minutes_steps(one(record)) == [[0, 0.0], [1, 1.0], [6, 100.0], [7, 100.0]]


def test_epoch_taken_is_weight_0_until_the_weight_is_confirmed_again():
    record = confirmed(started(0, 1), 1.5, 1)
    record, _changed, _note = r.plan(record, "chat:wave_canary", SCHEDULE, None, False, at(5), ME,
                                     epoch=2, take_epoch=True)  # fmt: skip
    record = confirmed(record, 6, 1)
    assert minutes_steps(one(record, 10)) == [[0, 0.0], [1, 1.0], [5, 0.0], [6, 1.0], [10, 1.0]]


def test_waves_come_in_plan_order_and_the_span_covers_them_all():
    rest = started(0, 30, planned("wave_rest", minutes=0.5))
    series = tl.timeline({"wave_rest": rest, "wave_canary": started(0, 1)}, unix(40))
    assert [wave["wave"] for wave in series["waves"]] == ["wave_canary", "wave_rest"]
    assert (series["origin"], series["until"]) == (unix(0), unix(40))


def test_stops_of_every_wave_at_one_moment_are_one_mark_and_close_ones_merge():
    waves = {}
    for name, minutes in (("wave_canary", 0), ("wave_rest", 0.1)):
        record = act(started(0, 1, planned(name, minutes)), "abort", 20, reason="x")
        waves[name] = act(record, "rolled_back", 20.1, reason="y", details={"mode": "fast"})
    only_rest = act(started(0, 1, planned("wave_rest")), "rolled_back", 50, reason="z")
    series = tl.timeline(waves, unix(60))
    assert [(m["at"], m["label"]) for m in tl.stop_marks(series, near_s=1)] == [
        (unix(20), "abort"),
        (unix(20.1), "fast rollback"),
    ]
    assert [m["label"] for m in tl.stop_marks(series, near_s=30)] == ["abort + fast rollback"]
    series = tl.timeline({"wave_canary": waves["wave_canary"], "wave_rest": only_rest}, unix(60))
    assert [m["label"] for m in tl.stop_marks(series, near_s=30)] == [
        "abort (wave_canary) + fast rollback (wave_canary)",
        "rollback (wave_rest)",
    ]


@pytest.mark.parametrize(
    "span_s, unit", [(0, "seconds"), (180, "seconds"), (181, "minutes"), (86400, "hours")]
)
def test_time_units_follow_the_span(span_s, unit):
    assert tl.time_unit(span_s)[1] == unit


def test_the_picture_is_written_at_its_size(tmp_path):
    image = pytest.importorskip("matplotlib.image")
    record = act(confirmed(started(0, 1), 1.5, 1), "pause", 3, reason="look")
    series = tl.timeline({"wave_canary": record}, unix(10))
    drawn = tl.draw_png(series, str(tmp_path / "t.png"), tl.picture_title("chat", series))
    pixels = image.imread(str(tmp_path / "t.png"))
    assert pixels.shape[:2] == (drawn["height"], drawn["width"]) == (650, 1100)
    assert list(tmp_path.iterdir()) == [tmp_path / "t.png"], "no temporary file left"


def test_a_picture_that_cannot_be_written_names_the_option(tmp_path):
    pytest.importorskip("matplotlib")
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

    series = tl.timeline({"wave_canary": planned()}, unix(1))
    with pytest.raises(FleetError) as refused:
        tl.draw_png(series, str(tmp_path / "missing" / "t.png"), "x")
    assert refused.value.details["field"] == "png" and "missing" in refused.value.message


def test_a_measured_split_is_drawn_from_the_record_with_its_range():
    record, _c, _n = r.plan(None, "chat:w", [{"weight": 5, "hold": 60}, {"weight": 100}], None,
                            False, T0, "me")  # fmt: skip
    record, _c = r.apply(record, "stage_started", {"stage": 0}, T0, "me")
    record, _c = r.apply(record, "weight_confirmed",
                         {"nodes": {"n1": {"weight": 5, "generation": 1}}}, T0, "me")  # fmt: skip
    split = {"ok": False, "measured_pct": 9.0, "low_pct": 3.0, "high_pct": 7.5, "connections": 400}
    record, _c = r.apply(record, "split_measured", {"splits": {"n1": split}}, T0, "me")
    (point,) = tl.measured_splits(record)
    assert (point["node"], point["pct"], point["low"], point["high"], point["ok"]) == (
        "n1", 9.0, 3.0, 7.5, False)  # fmt: skip


COHORT_SCHEDULE = [{"cohort": ["10.1.0.0/16", "192.0.2.7/32"], "hold": 1800},
                   {"weight": 1, "hold": 600}, {"weight": 100, "hold": 0}]  # fmt: skip


def cohort_wave():
    return r.plan(None, "chat:wave_canary", COHORT_SCHEDULE, None, False, at(0), ME)[0]


def test_a_cohort_stage_is_a_span_to_the_next_stage_and_weight_0_on_the_line():
    record = act(act(cohort_wave(), "stage_started", 1, stage=0), "hold_started", 2)
    record = act(act(record, "stage_completed", 31), "stage_started", 31, stage=1)
    wave = one(record, 40)
    assert wave["cohort_stages"] == [{"from": unix(1), "to": unix(31), "prefixes": 2}]
    assert minutes_steps(wave) == [[0, 0.0], [31, 1.0], [40, 1.0]]


@pytest.mark.parametrize("ending", ["abort", "now"])
def test_a_cohort_stage_ends_at_a_stop_or_runs_to_now(ending):
    record = act(cohort_wave(), "stage_started", 1, stage=0)
    if ending == "abort":
        record = act(record, "abort", 5, reason="drill")
    spans = one(record, 9)["cohort_stages"]
    assert spans == [{"from": unix(1), "to": unix(5 if ending == "abort" else 9), "prefixes": 2}]


def test_a_plain_schedule_has_no_cohort_span():
    assert one(started(0, 1))["cohort_stages"] == []


def test_the_picture_hatches_a_cohort_stage(tmp_path):
    from matplotlib import image  # installed by setup: missing, this fails

    record = act(cohort_wave(), "stage_started", 1, stage=0)
    series = tl.timeline({"wave_canary": record}, unix(10))
    drawn = tl.draw_png(series, str(tmp_path / "t.png"), tl.picture_title("chat", series))
    assert image.imread(str(tmp_path / "t.png")).shape[:2] == (drawn["height"], drawn["width"])
