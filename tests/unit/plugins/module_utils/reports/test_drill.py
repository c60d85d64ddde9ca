"""The drill's judge: checks, JSON/JUnit/PNG outputs, and its refusals of bad input.

The inputs are built the way the drill builds them: a rollout record through the rollout
module's own transitions, a load summary in the load client's format, rollback reports in
rollback.yml's format. Times are Unix seconds from T0.
"""

import datetime
import json
import xml.etree.ElementTree as ET

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import drill
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

T0 = 1_796_000_000.0
ME = "drill@controller"
SCHEDULE = [
    {"weight": 1, "hold": 10},
    {"weight": 5, "hold": 10},
    {"weight": 20, "hold": 10},
    {"weight": 100, "hold": 0},
]
# Per second while each stage holds, the client sees this many requests on each path.
RATE = 100
FAST_AT, DEEP_AT, END = 70.0, 80.0, 120.0


def at(seconds):
    return datetime.datetime.fromtimestamp(T0 + seconds, datetime.timezone.utc)


def drill_record():
    """Stages 1, 5 and 20 % held for 10 s each from t=10, 30, 50, then paused at 20 %."""
    record, _changed, _note = r.plan(None, "drill:gpu_nodes", SCHEDULE, None, False, at(0), ME)
    for stage, start in enumerate((5, 25, 45)):
        record, _changed = r.apply(record, "stage_started", {"stage": stage}, at(start), ME)
        record, _changed = r.apply(record, "hold_started", {}, at(start + 5), ME)
        record, _changed = r.apply(record, "stage_completed", {}, at(start + 15), ME)
    record, _changed = r.apply(record, "pause", {"reason": "as planned"}, at(61), ME)
    return record


def weight_at(second):
    for start, weight in ((50, 20), (30, 5), (10, 1)):
        if start <= second < FAST_AT:
            return weight
    return 0


def load_summary(failed_at=(), direct_after_rollback=False, last_direct=None):
    series = []
    for second in range(int(END)):
        direct = RATE * weight_at(second) // 100
        if direct_after_rollback and second == 75:
            direct = 3
        bucket = {"second": second, "direct": direct, "proxy": RATE - direct}
        if second in failed_at:
            bucket["failed"] = 1
        series.append(bucket)
    if last_direct is None:
        last_direct = 75.5 if direct_after_rollback else FAST_AT - 0.2
    return {
        "started_unix": T0,
        "requests_ok": sum(b["direct"] + b["proxy"] for b in series),
        "requests_failed": len(failed_at),
        "streams_completed": 42,
        "paths": {"direct": {"requests": 1, "last_began_unix": T0 + last_direct}},
        "failures_by_cause": {"reset": len(failed_at)} if failed_at else {},
        "failure_examples": [],
        "series": series,
    }


def rollback_report(mode, started, wall, confirmed=3):
    # As rollback_report.yml writes it: the ISO time to the second, the Unix times exact.
    return {
        "mode": mode,
        "started_at": at(started).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "started_at_unix": round(T0 + started, 3),
        "finished_at_unix": round(T0 + started + wall, 3),
        "wall_time_s": wall,
        "nodes_total": 3,
        "nodes_confirmed": confirmed,
        "unreachable": [],
        "not_confirmed": [] if confirmed == 3 else ["zl-node-03"],
    }


class FakePrometheus:
    """query_range answers with the weight in force at the window's end (a test double
    standing in for the Prometheus server, which the sandbox tests use for real)."""

    def __init__(self, url, timeout=10):
        self.queries = []

    def query_range(self, promql, start, end, step):
        self.queries.append(promql)
        points = []
        moment = start
        while moment <= end:
            points.append((moment, weight_at(int(moment - T0) - 1) / 100.0))
            moment += step
        return {'{job="zerolayer-router"}': points}


def write_inputs(tmp_path, summary=None, fast_wall=1.5, deep_confirmed=3, fast_at=FAST_AT + 0.1):
    files = {
        "summary": tmp_path / "load.json",
        "record": tmp_path / "gpu_nodes.json",
        "fast": tmp_path / "fast.json",
        "deep": tmp_path / "deep.json",
    }
    files["summary"].write_text(json.dumps(summary or load_summary()))
    files["record"].write_text(json.dumps(drill_record()))
    files["fast"].write_text(json.dumps(rollback_report("fast", fast_at, fast_wall)))
    files["deep"].write_text(
        json.dumps(rollback_report("deep", DEEP_AT + 0.1, 25.0, confirmed=deep_confirmed))
    )
    return {
        "drill_id": "drill-unit",
        "output_dir": str(tmp_path / "report"),
        "started_at": T0,
        "finished_at": T0 + END,
        "load_summary": str(files["summary"]),
        "canary_records": [str(files["record"])],
        "rollback_reports": {"fast": str(files["fast"]), "deep": str(files["deep"])},
        "events": {
            "fast_rollback_started": T0 + FAST_AT,
            "deep_rollback_started": T0 + DEEP_AT,
            "restored": T0 + 110,
        },
        "stage_weight": 20.0,
        "max_failed_requests": 0,
        "fast_budget_s": 30.0,
        "deep_budget_s": 300.0,
        "split_sigmas": 4.0,
        "split_floor_pct": 2.0,
        "prometheus_url": "",
        "prometheus_timeout": 5,
        "router_selector": 'job="zerolayer-router"',
        "plot": True,
    }


def checks_by_name(result):
    return {item["name"]: item for item in result["report"]["checks"]}


def test_a_clean_drill_passes_and_writes_json_junit_and_png(tmp_path):
    result = drill.run(write_inputs(tmp_path), False)
    assert result["passed"], result["failed_checks"]
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    assert [stage["weight"] for stage in report["stages"]] == [1, 5, 20]
    assert [stage["client_direct_pct"] for stage in report["stages"]] == [1.0, 5.0, 20.0]
    # 1.5 s of report wall time from 0.1 s after the trigger: 1.6 s, the client's last
    # direct request was before the trigger.
    assert report["rollbacks"]["fast"]["wall_time_s"] == pytest.approx(1.6, abs=0.01)
    assert report["rollbacks"]["deep"]["wall_time_s"] == pytest.approx(25.1, abs=0.01)
    suite = ET.parse(tmp_path / "report" / "report.junit.xml").getroot()  # noqa: S314 - the drill's own file
    assert suite.get("failures") == "0"
    assert int(suite.get("tests")) == len(report["checks"]) >= 9
    assert suite.find("testcase/failure") is None
    assert (tmp_path / "report" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_one_lost_request_fails_the_drill_and_the_junit_names_it(tmp_path):
    result = drill.run(write_inputs(tmp_path, summary=load_summary(failed_at=(72,))), False)
    assert not result["passed"]
    assert checks_by_name(result)["no_request_lost"]["measured"] == 1
    suite = ET.parse(tmp_path / "report" / "report.junit.xml").getroot()  # noqa: S314 - the drill's own file
    cases = suite.iter("testcase")
    failed = [case.get("name") for case in cases if case.find("failure") is not None]
    assert failed == ["no_request_lost"]


def test_a_direct_request_after_weight_zero_is_counted_in_the_fast_rollback(tmp_path):
    summary = load_summary(direct_after_rollback=True)
    result = drill.run(write_inputs(tmp_path, summary=summary), False)
    checks = checks_by_name(result)
    assert not checks["no_direct_path_after_fast_rollback"]["passed"]
    # The wall time runs until the client's last direct request (t=75.5), not the report's 71.6.
    assert checks["fast_rollback_time"]["measured"] == pytest.approx(5.5, abs=0.01)


def test_the_rollback_end_keeps_the_fraction_of_a_second_its_iso_time_drops(tmp_path):
    # Triggered at 70.0, started at 70.9 (ISO 70), every node confirmed at 72.4; the last
    # direct request began at 72.3: before the real end, after one rebuilt from the ISO time.
    summary = load_summary(last_direct=72.3)
    result = drill.run(write_inputs(tmp_path, summary=summary, fast_at=FAST_AT + 0.9), False)
    checks = checks_by_name(result)
    assert checks["no_direct_path_after_fast_rollback"]["passed"], checks
    assert checks["fast_rollback_time"]["measured"] == pytest.approx(2.4, abs=0.01)


def test_a_rollback_report_without_its_end_time_is_refused(tmp_path):
    inputs = write_inputs(tmp_path)
    fast = json.loads(open(inputs["rollback_reports"]["fast"]).read())
    del fast["finished_at_unix"]
    with open(inputs["rollback_reports"]["fast"], "w") as handle:
        json.dump(fast, handle)
    with pytest.raises(FleetError, match="finished_at_unix"):
        drill.run(inputs, False)


def test_a_rollback_over_budget_or_short_of_a_node_fails(tmp_path):
    result = drill.run(write_inputs(tmp_path, fast_wall=31.0, deep_confirmed=2), False)
    checks = checks_by_name(result)
    assert not checks["fast_rollback_time"]["passed"]
    assert not checks["deep_rollback_nodes"]["passed"]
    assert checks["deep_rollback_nodes"]["measured"] == "2/3"
    assert checks["no_request_lost"]["passed"]


def test_a_split_off_its_weight_fails_that_stage(tmp_path):
    summary = load_summary()
    for bucket in summary["series"]:
        if 30 <= bucket["second"] < 50:  # stage 2 (5 %) ran at 15 %
            bucket["direct"], bucket["proxy"] = 15, 85
    result = drill.run(write_inputs(tmp_path, summary=summary), False)
    checks = checks_by_name(result)
    assert not checks["split_client_stage_2"]["passed"]
    assert checks["split_client_stage_1"]["passed"] and checks["split_client_stage_3"]["passed"]


def test_the_router_split_comes_from_prometheus_per_stage(tmp_path):
    params = write_inputs(tmp_path)
    params["prometheus_url"] = "http://prometheus.invalid:9090"
    made = []

    def factory(url, timeout):
        made.append(FakePrometheus(url, timeout))
        return made[-1]

    result = drill.run(params, False, client_factory=factory)
    checks = checks_by_name(result)
    assert [checks["split_router_stage_%d" % n]["measured"] for n in (1, 2, 3)] == [1, 5, 20]
    assert all(checks["split_router_stage_%d" % n]["passed"] for n in (1, 2, 3))
    assert 'outcome="engine",job="zerolayer-router"' in made[0].queries[0]


def test_check_mode_writes_nothing(tmp_path):
    result = drill.run(write_inputs(tmp_path), True)
    assert result["files"] == {} and not result["changed"]
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    "change, field",
    [
        (lambda p: p["events"].pop("fast_rollback_started"), "events"),
        (lambda p: p["events"].update(restored="soon"), "events"),
        (lambda p: p.update(load_summary="/nonexistent/load.json"), "load_summary"),
        (lambda p: p.update(max_failed_requests=-1), "max_failed_requests"),
        (lambda p: p.update(pooled_load_summary="/nonexistent/p.json"), "pooled_load_summary"),
        (lambda p: p.update(pooled_direct_budget_s=0), "pooled_direct_budget_s"),
    ],
)
def test_bad_input_is_refused_with_the_field_named_and_nothing_written(tmp_path, change, field):
    params = write_inputs(tmp_path)
    change(params)
    with pytest.raises(FleetError) as raised:
        drill.run(params, False)
    assert raised.value.details["field"] == field
    assert not (tmp_path / "report").exists()


# -- the pooled keep-alive client beside it --------------------------------------------------


def pooled_summary(last_direct_after_fast, failed=0):
    """A pooled client's summary: its last direct answer that long after the fast trigger."""
    summary = load_summary()
    summary.update(
        connection_mode="pooled",
        requests_failed=failed,
        failures_by_cause={"connection_reset": failed} if failed else {},
        stale_connection_retries=2,
    )
    summary["paths"]["direct"]["last_ended_unix"] = T0 + FAST_AT + last_direct_after_fast
    return summary


def with_pooled(tmp_path, summary, budget=2.0):
    params = write_inputs(tmp_path)
    path = tmp_path / "load-pooled.json"
    path.write_text(json.dumps(summary))
    params.update(pooled_load_summary=str(path), pooled_direct_budget_s=budget)
    return params


def test_a_pooled_client_off_the_direct_path_in_time_passes_and_is_reported(tmp_path):
    result = drill.run(with_pooled(tmp_path, pooled_summary(0.4)), False)
    assert result["passed"], result["failed_checks"]
    checks = checks_by_name(result)
    assert checks["pooled_clients_leave_the_direct_path"]["measured"] == 0.4
    pooled = result["report"]["clients"]["pooled"]
    assert pooled["connection_mode"] == "pooled" and pooled["stale_connection_retries"] == 2
    assert pooled["last_direct_answer_after_fast_trigger_s"] == 0.4
    assert result["report"]["clients"]["per_request"]["connection_mode"] == "per-request"


def test_a_pooled_client_still_direct_past_the_budget_fails_the_drill(tmp_path):
    # Without the engines' direct drain a pooled client stayed direct until it stopped.
    result = drill.run(with_pooled(tmp_path, pooled_summary(35.0)), False)
    assert not result["passed"]
    check = checks_by_name(result)["pooled_clients_leave_the_direct_path"]
    assert (check["passed"], check["measured"], check["expected"]) == (False, 35.0, "<= 2.0 s")


def test_a_request_the_pooled_client_lost_fails_the_drill(tmp_path):
    result = drill.run(with_pooled(tmp_path, pooled_summary(0.4, failed=1)), False)
    assert checks_by_name(result)["pooled_no_request_lost"]["passed"] is False
    assert not result["passed"]


def test_without_a_pooled_client_neither_check_runs(tmp_path):
    result = drill.run(write_inputs(tmp_path), False)
    assert not {"pooled_no_request_lost", "pooled_clients_leave_the_direct_path"} & set(
        checks_by_name(result)
    )
    assert set(result["report"]["clients"]) == {"per_request"}


# -- a cohort stage first: the load client's own address is the cohort -----------------------

CLIENT = "192.0.2.7/32"
NODES = ("zl-node-01", "zl-node-02", "zl-node-03")
# As the rollout module normalises [{cohort: [CLIENT], hold: 10}, 1, 5, 20, 100 %]: every
# stage has a "cohort" list, the cohort stage's weight is 0.
COHORT_SCHEDULE = [
    {"weight": 0, "weight_bp": 0, "hold_s": 10, "cohort": [CLIENT]},
    {"weight": 1, "weight_bp": 100, "hold_s": 10, "cohort": []},
    {"weight": 5, "weight_bp": 500, "hold_s": 10, "cohort": []},
    {"weight": 20, "weight_bp": 2000, "hold_s": 10, "cohort": []},
    {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
]
# The stages start at these seconds; each holds from 3 s after its start for 10 s.
COHORT_STARTS = (2, 18, 34, 50)


def cohort_split(**change):
    """One node's split of the cohort stage as the canary kept it (stage_split's result)."""
    split = {"ok": True, "cohort": True, "opt_in": 350, "connections": 350, "to_engine": 0,
             "weight_pct": 0.0, "measured_pct": 0.0, "low_pct": 0.0, "high_pct": 0.0,
             "addresses": 0}  # fmt: skip
    split.update(change)
    return split


def cohort_drill_record(splits=None):
    """The cohort stage, then 1, 5 and 20 %, each held 10 s; paused at 20 % as planned."""
    plain = [{"weight": w, "hold": 10} for w in (1, 2, 5, 20)] + [{"weight": 100}]
    record, _changed, _note = r.plan(None, "drill:gpu_nodes", plain, None, False, at(0), ME)
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    splits = {node: cohort_split() for node in NODES} if splits is None else splits
    for stage, start in enumerate(COHORT_STARTS):
        record, _changed = r.apply(record, "stage_started", {"stage": stage}, at(start), ME)
        if stage == 0 and splits:
            read_back = {node: {"weight": 0, "generation": 2} for node in splits}
            record, _c = r.apply(
                record, "weight_confirmed", {"nodes": read_back}, at(start + 1), ME
            )
            record, _c = r.apply(record, "split_measured", {"splits": splits}, at(start + 2), ME)
        record, _changed = r.apply(record, "hold_started", {}, at(start + 3), ME)
        record, _changed = r.apply(record, "stage_completed", {}, at(start + 13), ME)
    record, _changed = r.apply(record, "pause", {"reason": "as planned"}, at(64), ME)
    return record


def cohort_share_at(second):
    """The direct share the client (the cohort) sees: all of it at the cohort stage."""
    for start, share in ((50, 0.20), (34, 0.05), (18, 0.01), (2, 1.0)):
        if start <= second < FAST_AT:
            return share
    return 0.0


def cohort_summary(proxy_at_cohort_stage=0):
    summary = load_summary()
    for bucket in summary["series"]:
        direct = round(RATE * cohort_share_at(bucket["second"]))
        if bucket["second"] == 8:  # inside the cohort stage's hold (5-15 s)
            direct -= proxy_at_cohort_stage
        bucket["direct"], bucket["proxy"] = direct, RATE - direct
    summary["requests_ok"] = sum(b["direct"] + b["proxy"] for b in summary["series"])
    return summary


class CohortPrometheus(FakePrometheus):
    """The router's share of new connections: the client's, times `scale` at the cohort stage."""

    scale = 1.0

    def query_range(self, promql, start, end, step):
        self.queries.append(promql)
        share = cohort_share_at(int(end - T0) - 1)
        return {'{job="zerolayer-router"}': [(end, share * (self.scale if share == 1.0 else 1))]}


def cohort_inputs(tmp_path, record=None, summary=None, router_scale=None):
    params = write_inputs(tmp_path, summary=summary or cohort_summary())
    with open(params["canary_records"][0], "w") as handle:
        json.dump(record or cohort_drill_record(), handle)
    params["stage_weight"] = 20.0
    factory = None
    if router_scale is not None:
        params["prometheus_url"] = "http://prometheus.invalid:9090"
        CohortPrometheus.scale = router_scale

        def factory(url, timeout):
            return CohortPrometheus(url, timeout)

    return params, factory


def run_cohort(tmp_path, **kwargs):
    params, factory = cohort_inputs(tmp_path, **kwargs)
    return drill.run(params, False, client_factory=factory)


def test_a_cohort_stage_is_judged_against_every_request_direct(tmp_path):
    result = run_cohort(tmp_path, router_scale=1.0)
    assert result["passed"], result["failed_checks"]
    checks = checks_by_name(result)
    client = checks["cohort_stage_direct_client"]
    assert (client["measured"], client["expected"]) == (100.0, "100% (every request direct)")
    assert "cohort 192.0.2.7/32 (the load client): 1000 requests" in client["detail"]
    router = checks["cohort_stage_direct_router"]
    assert (router["passed"], router["measured"], router["expected"]) == (
        True,
        100.0,
        "100% (98.0-100.0%)",
    )
    assert "cohort 192.0.2.7/32" in router["detail"]
    confirmed = checks["cohort_stage_confirmed"]
    assert (confirmed["passed"], confirmed["measured"]) == (True, "3/3 nodes")
    # The cohort stage takes the place of split_*_stage_1; the weights' stages keep theirs.
    names = [item["name"] for item in result["report"]["checks"]]
    assert "split_client_stage_1" not in names and "split_router_stage_1" not in names
    for n in (2, 3, 4):
        assert checks["split_client_stage_%d" % n]["passed"]
        assert checks["split_router_stage_%d" % n]["passed"]
    stages = result["report"]["stages"]
    assert [(s["weight"], s["cohort"]) for s in stages] == [(0, [CLIENT]), (1, []), (5, []),
                                                            (20, [])]  # fmt: skip
    assert [s["client_direct_pct"] for s in stages] == [100.0, 1.0, 5.0, 20.0]
    # The table: the cohort stage by its cohort, its split the client's requests, all direct.
    row = result["report"]["stage_rows"][0]
    assert row["cohort"] == [CLIENT] and row["split"]["opt_in"] == 1000
    cohort_line = result["table"].split("\n")[1]
    assert "cohort (1 prefix)" in cohort_line and "opt-in 1000 conn." in cohort_line
    assert " OFF" not in cohort_line


@pytest.mark.parametrize(
    "change, reason",
    [
        ({"to_engine": 4, "ok": False}, "not ok, to_engine 4"),
        ({"to_engine": 4}, "to_engine 4"),
        ({"opt_in": 0, "ok": False}, "not ok, opt_in 0"),
        ({"cohort": False}, "not measured as a cohort stage"),
    ],
)
def test_a_node_that_did_not_confirm_the_cohort_fails_it_by_name(tmp_path, change, reason):
    splits = {node: cohort_split() for node in NODES}
    splits["zl-node-02"] = cohort_split(**change)
    result = run_cohort(tmp_path, record=cohort_drill_record(splits))
    assert not result["passed"]
    checks = checks_by_name(result)
    confirmed = checks["cohort_stage_confirmed"]
    assert (confirmed["passed"], confirmed["measured"]) == (
        False,
        "2/3 nodes (not confirmed: zl-node-02)",
    )
    assert confirmed["detail"] == "wave gpu_nodes, stage 1: zl-node-02: %s" % reason
    assert result["failed_checks"] == [
        "cohort_stage_confirmed: measured 2/3 nodes (not confirmed: zl-node-02), expected every "
        "node: ok, cohort, opt_in > 0, to_engine 0"
    ]
    assert checks["cohort_stage_direct_client"]["passed"], "the client saw it all direct"


def test_a_cohort_stage_without_a_measured_split_is_not_confirmed(tmp_path):
    result = run_cohort(tmp_path, record=cohort_drill_record(splits={}))
    confirmed = checks_by_name(result)["cohort_stage_confirmed"]
    assert (confirmed["passed"], confirmed["measured"]) == (False, "0/0 nodes")
    assert "no node's split of stage 1" in confirmed["detail"]


def test_a_cohort_request_on_the_proxy_fails_the_client_check(tmp_path):
    result = run_cohort(tmp_path, summary=cohort_summary(proxy_at_cohort_stage=3))
    assert not result["passed"]
    client = checks_by_name(result)["cohort_stage_direct_client"]
    # 997 of 1000: inside the floor of a 100 % weight, but a cohort has no chance in it.
    assert (client["passed"], client["measured"]) == (False, 99.7)
    assert (
        "1000 requests answered during the hold of stage 1, 3 of them on the proxy"
        in (client["detail"])
    )
    assert [line.split(":")[0] for line in result["failed_checks"]] == [
        "cohort_stage_direct_client"
    ]
    assert "OFF client" in result["table"].split("\n")[1]


def test_a_router_share_short_of_the_cohort_fails_the_router_check(tmp_path):
    result = run_cohort(tmp_path, router_scale=0.9)
    router = checks_by_name(result)["cohort_stage_direct_router"]
    assert (router["passed"], router["measured"]) == (False, 90.0)
    assert [line.split(":")[0] for line in result["failed_checks"]] == [
        "cohort_stage_direct_router"
    ]


def test_a_drill_without_a_cohort_stage_has_exactly_the_checks_it_had(tmp_path):
    result = drill.run(write_inputs(tmp_path), False)
    assert [item["name"] for item in result["report"]["checks"]] == [
        "no_request_lost",
        "streams_completed",
        "split_client_stage_1",
        "split_client_stage_2",
        "split_client_stage_3",
        "canary_reached_its_stage",
        "fast_rollback_time",
        "fast_rollback_nodes",
        "deep_rollback_time",
        "deep_rollback_nodes",
        "no_direct_path_after_fast_rollback",
    ]
    assert [stage["cohort"] for stage in result["report"]["stages"]] == [[], [], []]
    assert "cohort" not in result["table"] and "opt-in" not in result["table"]
