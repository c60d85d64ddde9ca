"""`zerolayer rollout report`: the stage table, the JSON and the timeline picture of a
rollout read from a real etcd, its records made with the project's own actions."""

import datetime
import json

import numpy
import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import rollout_timeline as tl
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)

image = pytest.importorskip("matplotlib.image")
colors = pytest.importorskip("matplotlib.colors")

SCHEDULE = [{"weight": 1, "hold": 600}, {"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]
T0 = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0) - datetime.timedelta(
    hours=2
)
RUNNER, ONCALL = "runner@ctl", "oncall@laptop"


def at(minutes):
    return T0 + datetime.timedelta(minutes=minutes)


def plan(store, key, minutes):
    rollout_id, wave = key.split("/")
    record, _changed, _note = rollout.plan(None, "%s:%s" % (rollout_id, wave), SCHEDULE, None,
                                           False, at(minutes), RUNNER, epoch=0)  # fmt: skip
    StoreRecords(store, key).write(record, 0)


def change(store, key, action, minutes, actor=RUNNER, **params):
    """One action as the runner (or a person) makes it: read, apply, compare-and-swap."""
    records = StoreRecords(store, key)
    record, token = records.read()
    after, changed = rollout.apply(record, action, params, at(minutes), actor)
    assert changed, (key, action)
    records.write(after, token)


def gate(verdict, reason, decision="continue"):
    return {"verdict": verdict, "decision": decision, "reason": reason, "gates": []}


def run_stage(store, key, stage, minutes, verdicts, complete=True):
    weight = SCHEDULE[stage]["weight"]
    change(store, key, "stage_started", minutes, stage=stage)
    nodes = {"zl-node-01": {"generation": 10 + stage, "weight": weight}}
    change(store, key, "weight_confirmed", minutes + 0.5, nodes=nodes)
    change(store, key, "hold_started", minutes + 1)
    for offset, (verdict, reason) in enumerate(verdicts):
        change(store, key, "verdict", minutes + 2 + offset, verdict=gate(verdict, reason))
    if complete:
        change(store, key, "stage_completed", minutes + 11)


def two_waves_aborted(store):
    """wave_canary: 1 % and 5 % held (the 5 % stage paused and resumed), 100 % held.
    wave_rest: 1 % held, 5 % started, then an operator's abort and its fast rollback."""
    canary, rest = "chat-r/wave_canary", "chat-r/wave_rest"
    plan(store, canary, 0)
    plan(store, rest, 0.1)
    passed = ("pass", "all 2 gates passed")
    run_stage(store, canary, 0, 1, [passed, ("hold", "p99 holds: no data"), passed])
    run_stage(store, canary, 1, 13, [passed], complete=False)
    change(store, canary, "pause", 16, ONCALL, reason="look at p99")
    change(store, canary, "resume", 20, ONCALL, reason="fine")
    change(store, canary, "verdict", 21, verdict=gate(*passed, decision="complete"))
    change(store, canary, "stage_completed", 24)
    run_stage(store, canary, 2, 25, [], complete=False)
    change(store, canary, "completed", 26)
    run_stage(store, rest, 0, 30, [passed, passed])
    run_stage(store, rest, 1, 42, [("fail", "p99 failed: 9 > 5")], complete=False)
    store.raise_fence("abort", "chat-r: p99", ONCALL)
    change(store, rest, "abort", 46, ONCALL, reason="p99")
    change(store, rest, "rolled_back", 46.2, reason="fast rollback: p99", details={"mode": "fast"})


def report(etcd_url, store, *argv):
    return rollout_cli.main(
        ["--endpoints", etcd_url, "--prefix", store.prefix, "rollout", "report", *argv]
    )


def pixels_of(pixels, colour):
    """How many pixels are drawn in exactly this colour (the lines' cores are not blended)."""
    wanted = numpy.array(colors.to_rgb(colour))
    return int((numpy.abs(pixels[:, :, :3] - wanted).max(axis=2) < 0.02).sum())


def test_the_report_draws_the_timeline_of_both_waves(etcd_url, store, tmp_path, capsys):
    two_waves_aborted(store)
    picture = tmp_path / "chat-r.png"
    assert report(etcd_url, store, "chat-r", "--png", str(picture)) == rollout_cli.EXIT_OK
    out = capsys.readouterr().out
    assert "picture: %s" % picture in out

    pixels = image.imread(str(picture))
    assert pixels.shape == (650, 1100, 4)
    # Not blank: much of it is drawn, in many colours.
    assert (pixels[:, :, :3].min(axis=2) < 0.9).mean() > 0.02
    assert len(numpy.unique((pixels[:, :, :3] * 255).astype(int).reshape(-1, 3), axis=0)) > 50
    # Each wave's weight line, and the gate verdicts' markers.
    for wave_colour in tl.WAVE_COLOURS[:2]:
        assert pixels_of(pixels, wave_colour) > 300, wave_colour
    for kind in ("pass", "fail", "no_data"):
        assert pixels_of(pixels, tl.VERDICT_COLOURS[kind]) > 20, kind
    assert pixels_of(pixels, tl.WAVE_COLOURS[2]) == 0, "a third wave colour where there is none"


def test_the_report_prints_the_stage_table(etcd_url, store, capsys):
    two_waves_aborted(store)
    assert report(etcd_url, store, "chat-r") == rollout_cli.EXIT_OK
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["WAVE", "STAGE", "WEIGHT", "SPLIT", "RANGE", "VERDICTS", "TIME",
                                "END"]  # fmt: skip
    rows = [line.split() for line in lines[1:]]
    assert [(row[0], row[1]) for row in rows] == [
        ("wave_canary", "1/3"),
        ("wave_canary", "2/3"),
        ("wave_canary", "3/3"),
        ("wave_rest", "1/3"),
        ("wave_rest", "2/3"),
    ]
    canary_1, canary_5, _canary_100, _rest_1, rest_5 = lines[1:]
    assert "pass 2, no data 1 -> continue" in canary_1 and "11m00s" in canary_1
    assert "11m00s (paused 4m00s)" in canary_5 and "pass 2 -> complete" in canary_5
    assert "fail 1 -> continue" in rest_5 and rest_5.endswith("aborted, fast rollback")
    assert "4m00s" in rest_5, "from its start at 42 to the abort at 46"


def test_the_report_as_json_holds_the_rows_and_the_series(etcd_url, store, capsys):
    two_waves_aborted(store)
    assert report(etcd_url, store, "chat-r", "--json") == rollout_cli.EXIT_OK
    payload = json.loads(capsys.readouterr().out)
    assert [row["end"] for row in payload["rows"]][-1] == "aborted, fast rollback"
    rest = payload["timeline"]["waves"][1]
    assert rest["wave"] == "wave_rest"
    assert [stop["label"] for stop in rest["stops"]] == ["abort", "fast rollback"]
    assert [weight for _at, weight in rest["weight_steps"]] == [0.0, 1.0, 5.0, 0.0, 0.0]
    canary = payload["timeline"]["waves"][0]
    assert [(p["to"] - p["from"]) for p in canary["pauses"]] == [240.0]
    # -o json before the noun says the same.
    argv = ["--endpoints", etcd_url, "--prefix", store.prefix, "-o", "json", "rollout", "report"]
    assert rollout_cli.main([*argv, "chat-r"]) == rollout_cli.EXIT_OK
    assert json.loads(capsys.readouterr().out)["rows"] == payload["rows"]


def test_an_unknown_rollout_is_refused_naming_the_known(etcd_url, store, tmp_path, capsys):
    two_waves_aborted(store)
    picture = tmp_path / "x.png"
    assert report(etcd_url, store, "chat-z", "--png", str(picture)) == rollout_cli.EXIT_BAD_INPUT
    err = capsys.readouterr().err
    assert "'chat-z' is not a known rollout (known: chat-r)" in err
    assert not picture.exists()
    missing = tmp_path / "no-such-dir" / "x.png"
    assert report(etcd_url, store, "chat-r", "--png", str(missing)) == rollout_cli.EXIT_BAD_INPUT
    assert "png: cannot write the picture" in capsys.readouterr().err
