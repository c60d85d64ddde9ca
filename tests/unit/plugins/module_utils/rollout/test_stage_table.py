"""The per-wave, per-stage table of the final reports (stage_table): rows from records made
with the rollout module's own actions, the split merged in, and the text it renders."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import cohorts as c
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    stage_table as t,
)

from unit.helpers.rollout_steps import ME, act, at, unix

SCHEDULE = [{"weight": 1, "hold": 600}, {"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]


def gate(verdict, reason, decision="continue"):
    return {"verdict": verdict, "decision": decision, "reason": reason, "gates": []}


def measured(pct, low, high, ok=True, connections=500):
    """One node's split as split_verdict gives it, with its count."""
    return {"ok": ok, "measured_pct": pct, "low_pct": low, "high_pct": high,
            "connections": connections}  # fmt: skip


def planned(wave="wave_canary", minutes=0):
    return r.plan(None, "chat:%s" % wave, SCHEDULE, None, False, at(minutes), ME)[0]


def two_stages_then_rollback():
    """Stage 1 held 10 min with two passes; stage 2 paused 3 min, failed, rolled back (fast)."""
    record = planned()
    record = act(record, "stage_started", 1, stage=0)
    record = act(record, "hold_started", 1.5)
    record = act(record, "verdict", 5, verdict=gate("pass", "all 2 gates passed"))
    record = act(record, "verdict", 9, verdict=gate("pass", "all 2 gates passed", "complete"))
    record = act(record, "stage_completed", 11)
    record = act(record, "stage_started", 12, stage=1)
    record = act(record, "hold_started", 12.5)
    record = act(record, "verdict", 13, verdict=gate("hold", "p99 holds: no data"))
    record = act(record, "pause", 14, reason="look at p99")
    record = act(record, "resume", 17, reason="fine")
    record = act(record, "verdict", 18, verdict=gate("hold", "p99 holds: too few samples: 3 < 10"))
    record = act(record, "verdict", 19, verdict=gate("fail", "p99 failed: 9 > 5", "rollback"))
    return act(record, "rolled_back", 20, reason="fast rollback: gates", details={"mode": "fast"})


def test_rows_give_weight_verdicts_time_and_end_of_each_stage_that_ran():
    rows = t.record_rows(two_stages_then_rollback(), unix(60))
    assert [(row["stage_number"], row["weight"], row["end"]) for row in rows] == [
        (1, 1, "completed"),
        (2, 5, "rolled back (fast)"),
    ]
    first, second = rows
    assert first["wave"] == "wave_canary" and first["stage_count"] == 3
    assert (first["time_s"], first["paused_s"]) == (600.0, 0.0)
    assert first["verdicts"] == {"pass": 2} and first["last_decision"] == "complete"
    assert (second["time_s"], second["paused_s"]) == (480.0, 180.0)
    assert second["verdicts"] == {"fail": 1, "hold": 1, "no_data": 1}
    assert second["last_decision"] == "rollback"
    assert second["started_at"] == "2026-12-01T10:12:00Z"
    assert second["ended_at"] == "2026-12-01T10:20:00Z"
    assert first["split"] is None, "the record keeps no measured split"


def test_a_stage_in_progress_runs_until_now_and_says_where_it_stands():
    record = act(act(planned(), "stage_started", 1, stage=0), "hold_started", 2)
    (row,) = t.record_rows(record, unix(31))
    assert (row["time_s"], row["ended_at"], row["end"]) == (1800.0, None, "holding")
    (row,) = t.record_rows(act(record, "pause", 10, reason="x"), unix(31))
    assert (row["end"], row["paused_s"]) == ("paused", 1260.0)


@pytest.mark.parametrize(
    "finish, end",
    [
        (lambda rec: act(rec, "abort", 20, reason="bad"), "aborted"),
        (
            lambda rec: act(
                act(rec, "abort", 20, reason="bad"),
                "rolled_back",
                20.5,
                reason="deep rollback: abort",
                details={"mode": "deep"},
            ),
            "aborted, deep rollback",
        ),
        (lambda rec: act(rec, "rolled_back", 20, reason="?"), "rolled back (rollback)"),
        (lambda rec: act(rec, "promote_full", 20, reason="go"), "promoted to 100%"),
    ],
)
def test_how_a_stage_left_unfinished_ended(finish, end):
    record = finish(act(act(planned(), "stage_started", 1, stage=0), "hold_started", 2))
    row = t.record_rows(record, unix(60))[0]
    assert row["end"] == end and row["time_s"] == 1140.0


def test_a_promoted_stage_and_a_completed_rollout():
    record = act(planned(), "stage_started", 1, stage=0)
    record = act(record, "promote", 4, reason="enough")
    # Past a completed stage, promote moves on; again, it completes the 5 % stage unstarted.
    record = act(record, "promote", 5, reason="next")
    record = act(record, "promote", 5, reason="skip the 5 % stage")
    record = act(record, "stage_started", 6, stage=2)
    record = act(record, "completed", 7)
    rows = t.record_rows(record, unix(60))
    assert [(row["stage_number"], row["end"], row["time_s"]) for row in rows] == [
        (1, "promoted", 180.0),
        (2, "promoted", 0.0),
        (3, "completed", 60.0),
    ]


def test_rollout_rows_keep_plan_order_and_merge_each_waves_split():
    rest = act(planned("wave_rest", minutes=0.5), "stage_started", 30, stage=0)
    canary = two_stages_then_rollback()
    splits = {
        "wave_canary": {
            0: {
                "zl-node-01": measured(0.9, 0.5, 1.6, connections=400),
                "zl-node-02": measured(2.4, 0.4, 1.7, ok=False, connections=380),
            }
        }
    }
    rows = t.rollout_rows({"wave_rest": rest, "wave_canary": canary}, unix(60), splits)
    assert [row["wave"] for row in rows] == ["wave_canary", "wave_canary", "wave_rest"]
    assert rows[0]["split"] == {
        "nodes": 2,
        "measured_pct": [0.9, 2.4],
        "range_pct": [0.4, 1.7],
        "connections": 780,
        "off": ["zl-node-02"],
    }
    assert rows[1]["split"] is None


def test_the_text_table_has_a_header_and_one_aligned_line_per_row():
    splits = {0: {"n1": measured(1.04, 0.5, 1.6)}}
    rows = t.record_rows(two_stages_then_rollback(), unix(60), splits=splits)
    lines = t.render_table(rows)
    assert lines[0].split() == list(t.COLUMNS)
    assert len(lines) == 3
    assert lines[1].split("  ")[0] == "wave_canary"
    assert "1.04%" in lines[1] and "0.50-1.60%" in lines[1]
    assert "pass 2 -> complete" in lines[1] and "10m00s" in lines[1]
    assert "fail 1, hold 1, no data 1 -> rollback" in lines[2]
    assert "8m00s (paused 3m00s)" in lines[2] and lines[2].endswith("rolled back (fast)")
    # Columns line up: every cell of a column starts where its header does.
    split_at = lines[0].index("SPLIT")
    assert lines[1][split_at:].startswith("1.04%") and lines[2][split_at:].startswith("-")
    assert lines[1].index("1%") + 2 == lines[0].index("WEIGHT") + len("WEIGHT"), "right-aligned"


def test_split_cells_show_a_range_over_nodes_and_the_nodes_off():
    row = {
        "wave": "w", "stage_number": 1, "stage_count": 2, "weight": 5, "time_s": 1, "end": "x",
        "verdicts": {}, "split": {"nodes": 3, "measured_pct": [4.5, 5.25],
                                  "range_pct": [3.9, 6.1], "off": ["n3"]},
    }  # fmt: skip
    (line,) = t.render_table([row])[1:]
    assert "4.50..5.25% (3 nodes) OFF n3" in line and "3.90-6.10%" in line


def test_no_rows_say_so():
    assert t.render_table([]) == ["no stage has started"]
    assert t.record_rows(planned(), unix(5)) == []


@pytest.mark.parametrize(
    "entry, kind",
    [
        ({"verdict": "pass", "reason": "all 3 gates passed"}, "pass"),
        ({"verdict": "fail", "reason": "p99 failed: 9 > 5"}, "fail"),
        ({"verdict": "hold", "reason": "p99 holds: no data"}, "no_data"),
        ({"verdict": "hold", "reason": "p99 holds: no data; success holds: no data"}, "no_data"),
        ({"verdict": "hold", "reason": "p99 holds: no data; success holds: NaN"}, "hold"),
        ({"verdict": "hold", "reason": "p99 holds: prometheus unreachable"}, "hold"),
        ({"verdict": "hold", "reason": None}, "hold"),
    ],
)
def test_verdict_kinds(entry, kind):
    assert t.verdict_kind(entry) == kind


def test_pause_spans_end_at_whatever_cleared_the_pause_or_stay_open():
    record = act(act(planned(), "stage_started", 1, stage=0), "pause", 2, reason="a")
    record = act(record, "promote", 4, reason="go on")
    record = act(record, "pause", 6, reason="b")
    assert t.pause_spans(record, unix(9)) == [
        (unix(2), unix(4), "a"),
        (unix(6), unix(9), "b"),
    ]


def test_shared_formats():
    assert [t.format_seconds(s) for s in (None, 42, 125, 7260)] == ["-", "42s", "2m05s", "2h01m"]
    assert [t.format_weight(w) for w in (None, 5, 0.5)] == ["-", "5%", "0.5%"]
    assert [t.wave_of(i) for i in ("chat:wave_rest", "plain", None)] == ["wave_rest", "plain", "-"]


def test_the_drill_report_keeps_rows_with_the_split_its_client_saw():
    from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import drill

    record = r.plan(None, "drill-1:gpu_nodes", SCHEDULE, None, False, at(0), ME)[0]
    record = act(act(record, "stage_started", 1, stage=0), "hold_started", 2)
    record = act(act(record, "stage_completed", 12), "pause", 12.5, reason="as planned")
    # 100 requests a second, 2 of them on the direct path while the 1 % stage held.
    series = [{"second": second, "direct": 2, "proxy": 98} for second in range(120, 720)]
    inputs = {
        "drill_id": "drill-1",
        "started_at": unix(0),
        "finished_at": unix(13),
        "load_summary": {"started_unix": unix(0), "requests_ok": 60000, "requests_failed": 0,
                         "series": series},
        "canary_records": [record],
        "rollback_reports": {},
        "events": {},
        "limits": {"max_failed_requests": 0, "fast_budget_s": 30, "deep_budget_s": 300,
                   "split_sigmas": 4, "split_floor_pct": 2, "stage_weight": 1},
    }  # fmt: skip
    (row,) = drill.build_report(inputs)["stage_rows"]
    assert (row["wave"], row["weight"], row["end"]) == ("gpu_nodes", 1, "completed")
    assert row["split"]["measured_pct"] == [2.0, 2.0]
    assert row["split"]["connections"] == 60000 and row["split"]["off"] == []
    low, high = row["split"]["range_pct"]
    assert low < 1 < 2 <= high, "the floor of 2 points keeps 2 % inside"
    (line,) = t.render_table([row])[1:]
    assert "2.00%" in line and "%.2f-%.2f%%" % (low, high) in line


# A cohort stage (weight 0: only the clients of its source CIDRs go direct) before 1 %, as
# the rollout module normalises such a schedule: every stage has a "cohort" list.
COHORT = ["10.1.0.0/16", "192.0.2.7/32"]
COHORT_SCHEDULE = [
    {"weight": 0, "weight_bp": 0, "hold_s": 1800, "cohort": COHORT},
    {"weight": 1, "weight_bp": 100, "hold_s": 3600, "cohort": []},
    {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
]


def cohort_split(opt_in, ok=True, to_engine=0, connections=900):
    """One node's split of a cohort stage, as stage_split gives it and the record keeps it."""
    return {"ok": ok, "cohort": True, "opt_in": opt_in, "connections": connections,
            "to_engine": to_engine, "weight_pct": 0.0, "measured_pct": 0.0, "low_pct": 0.0,
            "high_pct": 0.0, "addresses": 0}  # fmt: skip


def cohort_record(splits):
    """The cohort stage held 30 min with its split measured, then the 1 % stage started."""
    record = planned()
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    record = act(record, "stage_started", 1, stage=0)
    read_back = {"weight": 0, "generation": 2}
    record = act(record, "weight_confirmed", 1.5, nodes={node: read_back for node in splits})
    record = act(record, "split_measured", 2, splits=splits)
    record = act(record, "hold_started", 2.5)
    record = act(record, "verdict", 30, verdict=gate("pass", "all 2 gates passed", "complete"))
    record = act(record, "stage_completed", 32.5)
    return act(record, "stage_started", 33, stage=1)


def test_a_cohort_stage_row_shows_the_cohort_and_its_opt_in_connections():
    record = cohort_record({"zl-node-01": cohort_split(200), "zl-node-02": cohort_split(212)})
    first, second = t.record_rows(record, unix(40))
    assert (first["weight"], first["cohort"], first["end"]) == (0, COHORT, "completed")
    assert first["split"] == {
        "nodes": 2,
        "cohort": True,
        "opt_in": 412,
        "measured_pct": None,
        "range_pct": None,
        "connections": 1800,
        "off": [],
    }
    assert (second["weight"], second["cohort"], second["split"]) == (1, [], None)
    header, cohort_line, one_percent = t.render_table([first, second])
    cells = cohort_line.split("  ")
    assert "cohort (2 prefixes)" in cells and "opt-in 412 conn. (2 nodes)" in cohort_line
    assert "0%" not in cohort_line, "a cohort stage is not shown as a bare 0 %"
    # No agreeing range at weight 0: the RANGE column says so.
    assert cohort_line[header.index("RANGE") :].startswith("- ")
    assert one_percent[header.index("SPLIT") - 1 :].startswith(" -")
    # The weight column stays right-aligned under its header.
    weight_end = header.index("WEIGHT") + len("WEIGHT")
    assert cohort_line.index("cohort (2 prefixes)") + len("cohort (2 prefixes)") == weight_end
    assert one_percent.index("1%") + 2 == weight_end


def test_a_cohort_stage_node_the_weight_sent_direct_is_off():
    record = cohort_record(
        {"n1": cohort_split(300), "n2": cohort_split(150, ok=False, to_engine=4)}
    )
    (row, _next) = t.record_rows(record, unix(40))
    assert row["split"]["opt_in"] == 450 and row["split"]["off"] == ["n2"]
    (line,) = t.render_table([row])[1:]
    assert "opt-in 450 conn. (2 nodes) OFF n2" in line
    (one,) = t.render_table([dict(row, split=t.split_summary({"n1": cohort_split(7)}))])[1:]
    assert "opt-in 7 conn." in one and "nodes" not in one


def test_a_record_from_before_cohort_stages_has_rows_without_a_cohort():
    rows = t.record_rows(two_stages_then_rollback(), unix(60))
    assert [row["cohort"] for row in rows] == [[], []]
    assert "cohort" not in "\n".join(t.render_table(rows))


def test_cohort_formats():
    assert c.format_cohort(["192.0.2.7/32"]) == "cohort (1 prefix)"
    assert c.format_cohort(COHORT) == "cohort (2 prefixes)"
    assert c.format_cohort(COHORT, listed=True) == "cohort (2 prefixes: %s)" % ", ".join(COHORT)
    many = ["10.%d.0.0/16" % n for n in range(5)]
    assert c.format_cohort(many, listed=True) == (
        "cohort (5 prefixes: 10.0.0.0/16, 10.1.0.0/16, 10.2.0.0/16 +2 more)"
    )
    assert t.format_stage_weight(0, COHORT) == "cohort (2 prefixes)"
    assert t.format_stage_weight(5, []) == t.format_stage_weight(5) == "5%"
    assert t.format_opt_in(412) == "opt-in 412 conn."
    holds = [t.format_hold(s) for s in (0, 90, 1800, 5400, 86400)]
    assert holds == ["", "1m30s", "30m", "1h30m", "1d"]
    assert t.format_schedule(COHORT_SCHEDULE) == "cohort (2 prefixes) 30m, 1% 1h, 100%"
    assert c.schedule_cohort(COHORT_SCHEDULE, 0) == COHORT
    assert c.schedule_cohort(COHORT_SCHEDULE, 1) == c.schedule_cohort(COHORT_SCHEDULE, 7) == []
    old = r.validate_schedule(SCHEDULE)
    assert [c.stage_cohort(stage) for stage in old] == [[], [], []]
