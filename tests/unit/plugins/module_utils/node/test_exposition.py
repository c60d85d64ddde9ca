"""Prometheus text rendering of router snapshots and the rollout record (no kernel needed)."""

import datetime
import http.client
import re
import shutil
import subprocess
import threading
from http.server import ThreadingHTTPServer

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

COUNTERS = {
    "lookups": 100,
    "to_engine": 20,
    "to_proxy_by_weight": 75,
    "fallback_no_socket": 4,
    "assign_errors": 1,
}


def snapshot(**overrides):
    latency = [0] * 64
    latency[6], latency[7], latency[10] = 50, 30, 20
    base = {
        "attached": True,
        "program": {"id": 42, "tag": "40d0f0c4b441b2b2", "run_time_ns": 2_500_000, "run_cnt": 1000},
        "routes": [
            {
                "name": "chat",
                "port": 8080,
                "weight_bp": 1250,
                "generation": 3,
                "engine_sockets": 2,
                "counters": dict(COUNTERS),
            },
            {
                "name": 'odd"name\\x',
                "port": 9090,
                "weight_bp": 10000,
                "generation": 1,
                "engine_sockets": 0,
                "counters": dict.fromkeys(COUNTERS, 0),
            },
        ],
        "latency_buckets": latency,
    }
    base.update(overrides)
    return base


def samples(text):
    """{series: value} of every sample line."""
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            series, value = line.rsplit(" ", 1)
            found[series] = float(value)
    return found


def types(text):
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))


def test_every_documented_metric_has_its_type():
    assert types(exposition.render(snapshot())) == {
        "zerolayer_router_attached": "gauge",
        "zerolayer_router_info": "gauge",
        "zerolayer_router_run_seconds_total": "counter",
        "zerolayer_router_runs_total": "counter",
        "zerolayer_route_weight_ratio": "gauge",
        "zerolayer_route_generation": "gauge",
        "zerolayer_route_engine_sockets": "gauge",
        "zerolayer_route_lookups_total": "counter",
        "zerolayer_route_decisions_total": "counter",
        "zerolayer_route_decision_duration_seconds": "histogram",
    }


def test_every_family_has_help_before_type():
    lines = exposition.render(snapshot()).splitlines()
    for index, line in enumerate(lines):
        if line.startswith("# TYPE "):
            name = line.split()[2]
            assert lines[index - 1].startswith("# HELP %s " % name)


def test_values_and_labels():
    found = samples(exposition.render(snapshot()))
    assert found["zerolayer_router_attached"] == 1
    assert found['zerolayer_router_info{prog_id="42",tag="40d0f0c4b441b2b2"}'] == 1
    assert found["zerolayer_router_run_seconds_total"] == pytest.approx(0.0025)
    assert found["zerolayer_router_runs_total"] == 1000
    assert found['zerolayer_route_weight_ratio{route="chat",port="8080"}'] == 0.125
    assert found['zerolayer_route_generation{route="chat"}'] == 3
    assert found['zerolayer_route_engine_sockets{route="chat"}'] == 2
    assert found['zerolayer_route_lookups_total{route="chat"}'] == 100
    for outcome, value in (
        ("engine", 20),
        ("proxy_weight", 75),
        ("fallback_no_socket", 4),
        ("assign_error", 1),
    ):
        assert (
            found['zerolayer_route_decisions_total{route="chat",outcome="%s"}' % outcome] == value
        )


def test_label_values_are_escaped():
    text = exposition.render(snapshot())
    assert 'zerolayer_route_generation{route="odd\\"name\\\\x"} 1' in text
    assert exposition.escape_label_value("a\nb") == "a\\nb"


def test_histogram_is_cumulative_in_seconds():
    found = samples(exposition.render(snapshot()))
    name = "zerolayer_route_decision_duration_seconds"
    # bucket 6 holds [64, 128) ns: le = 128 ns
    assert found['%s_bucket{le="6.4e-08"}' % name] == 0
    assert found['%s_bucket{le="1.28e-07"}' % name] == 50
    assert found['%s_bucket{le="2.56e-07"}' % name] == 80
    assert found['%s_bucket{le="2.048e-06"}' % name] == 100
    assert found['%s_bucket{le="+Inf"}' % name] == 100
    assert found["%s_count" % name] == 100
    midpoints_ns = 50 * 96 + 30 * 192 + 20 * 1536
    assert found["%s_sum" % name] == pytest.approx(midpoints_ns / 1e9)
    bounds = [
        float(series.split('"')[1])
        for series in found
        if series.startswith(name + "_bucket") and "+Inf" not in series
    ]
    assert bounds == sorted(bounds)
    assert len(bounds) == exposition.EXPORTED_BUCKETS


def test_decisions_slower_than_the_last_bound_count_only_in_inf():
    latency = [0] * 64
    latency[40] = 3
    found = samples(exposition.render(snapshot(latency_buckets=latency)))
    name = "zerolayer_route_decision_duration_seconds"
    assert found['%s_bucket{le="4.294967296"}' % name] == 0
    assert found['%s_bucket{le="+Inf"}' % name] == 3


def test_detached_router_keeps_routes_and_drops_info():
    found = samples(exposition.render(snapshot(attached=False)))
    assert found["zerolayer_router_attached"] == 0
    assert not any(series.startswith("zerolayer_router_info") for series in found)
    assert found['zerolayer_route_weight_ratio{route="chat",port="8080"}'] == 0.125


def test_nothing_pinned_gives_only_attached_zero():
    text = exposition.render(
        {"attached": False, "program": None, "routes": [], "latency_buckets": None}
    )
    assert samples(text) == {"zerolayer_router_attached": 0}


def test_format_value_keeps_integers_exact():
    assert exposition.format_value(2**63) == "9223372036854775808"
    assert exposition.format_value(0.5) == "0.5"
    assert exposition.format_value(True) == "1"


@pytest.mark.parametrize(
    "case",
    [
        snapshot(),
        snapshot(attached=False),
        {"attached": False, "program": None, "routes": [], "latency_buckets": None},
    ],
    ids=["attached", "detached", "nothing-pinned"],
)
def test_promtool_accepts_the_text(case):
    promtool_check(exposition.render(case))


def promtool_check(text):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: install the prometheus package (bindep profile test)")
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip() == "" and check.stderr.strip() == ""


# ---------------------------------------------------------------- the rollout record

T0 = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
ME = "sre@controller"
SCHEDULE = [{"weight": 1, "hold": "10m"}, {"weight": 12.5, "hold": 600}, {"weight": 100}]


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def unix(seconds):
    return at(seconds).timestamp()


def step(record, action, seconds, **params):
    record, changed = r.apply(record, action, params, at(seconds), ME)
    assert changed, action
    return record


def at_second_stage():
    """A real record, built by the same functions the playbooks call: stage 2 (12.5%) holding."""
    record, _changed, _note = r.plan(None, "chat-7", SCHEDULE, None, False, at(0), ME)
    record = step(record, "stage_started", 10, stage=0)
    record = step(record, "hold_started", 20)
    record = step(record, "stage_completed", 700)
    record = step(record, "stage_started", 710, stage=1)
    return step(record, "hold_started", 720)


def rolled_back(mode):
    record = at_second_stage()
    return step(
        record,
        "rolled_back",
        900,
        reason="%s rollback: gates failed" % mode,
        details={"mode": mode, "wall_time_s": 1.2},
    )


def write(tmp_path, record):
    path = tmp_path / "rollout.json"
    record_codec.write_record(str(path), record)
    return str(path)


def rollout_samples(path):
    snapshot = {"attached": False, "program": None, "routes": [], "latency_buckets": None}
    snapshot["rollout"] = exposition.read_rollout(path)
    text = exposition.render(snapshot)
    promtool_check(text)
    return samples(text)


def rollout_only(found):
    return {series: value for series, value in found.items() if "zerolayer_rollout_" in series}


def status_samples(current):
    return {
        'zerolayer_rollout_stage_status{status="%s"}' % status: 1 if status == current else 0
        for status in exposition.STAGE_STATUSES
    }


def test_a_record_at_a_stage(tmp_path):
    found = rollout_samples(write(tmp_path, at_second_stage()))
    assert rollout_only(found) == {
        "zerolayer_rollout_record_ok": 1,
        'zerolayer_rollout_info{rollout_id="chat-7",outcome="running"}': 1,
        "zerolayer_rollout_stage": 2,
        "zerolayer_rollout_stages": 3,
        **status_samples("holding"),
        "zerolayer_rollout_weight_ratio": 0.125,
        "zerolayer_rollout_paused": 0,
        "zerolayer_rollout_updated_timestamp_seconds": unix(720),
    }


def test_a_paused_record(tmp_path):
    record = step(at_second_stage(), "pause", 800, reason="gates cannot see")
    found = rollout_only(rollout_samples(write(tmp_path, record)))
    assert found["zerolayer_rollout_paused"] == 1
    assert found['zerolayer_rollout_info{rollout_id="chat-7",outcome="paused"}'] == 1
    # A pause keeps the weight where it is.
    assert found["zerolayer_rollout_weight_ratio"] == 0.125
    assert found["zerolayer_rollout_stage"] == 2
    assert found["zerolayer_rollout_updated_timestamp_seconds"] == unix(800)
    assert not any("rollback" in series for series in found)


@pytest.mark.parametrize("mode", ["fast", "deep"])
def test_a_rolled_back_record(tmp_path, mode):
    found = rollout_only(rollout_samples(write(tmp_path, rolled_back(mode))))
    assert found['zerolayer_rollout_info{rollout_id="chat-7",outcome="rolled_back"}'] == 1
    # The stage it ended at stays; the weight asked for is the proxy path's.
    assert found["zerolayer_rollout_stage"] == 2
    assert found["zerolayer_rollout_weight_ratio"] == 0
    assert found["zerolayer_rollout_paused"] == 0
    rollbacks = {s: v for s, v in found.items() if s.startswith("zerolayer_rollout_rollback")}
    assert rollbacks == {
        'zerolayer_rollout_rollback_timestamp_seconds{kind="%s"}' % mode: unix(900)
    }


def test_an_abort_then_its_rollback_are_both_moments(tmp_path):
    record = step(at_second_stage(), "abort", 850, reason="aborted by request")
    record = step(
        record, "rolled_back", 851, reason="fast rollback: aborted", details={"mode": "fast"}
    )
    found = rollout_only(rollout_samples(write(tmp_path, record)))
    # A person's abort stays the outcome once its rollback is done.
    assert found['zerolayer_rollout_info{rollout_id="chat-7",outcome="aborted"}'] == 1
    assert found["zerolayer_rollout_weight_ratio"] == 0
    assert found['zerolayer_rollout_rollback_timestamp_seconds{kind="abort"}'] == unix(850)
    assert found['zerolayer_rollout_rollback_timestamp_seconds{kind="fast"}'] == unix(851)


def test_a_rollback_whose_mode_is_not_recorded_is_unknown(tmp_path):
    record = step(at_second_stage(), "rolled_back", 900, reason="by hand")
    found = rollout_only(rollout_samples(write(tmp_path, record)))
    assert found['zerolayer_rollout_rollback_timestamp_seconds{kind="unknown"}'] == unix(900)


def test_a_completed_record_asks_for_the_whole_weight(tmp_path):
    record = at_second_stage()
    record = step(record, "stage_completed", 1400)
    record = step(record, "stage_started", 1410, stage=2)
    record = step(record, "completed", 1420)
    found = rollout_only(rollout_samples(write(tmp_path, record)))
    assert found['zerolayer_rollout_info{rollout_id="chat-7",outcome="completed"}'] == 1
    assert found["zerolayer_rollout_stage"] == 3
    assert found["zerolayer_rollout_weight_ratio"] == 1
    assert found['zerolayer_rollout_stage_status{status="completed"}'] == 1


def test_no_record_means_no_rollout(tmp_path):
    found = rollout_samples(str(tmp_path / "absent.json"))
    assert rollout_only(found) == {"zerolayer_rollout_record_ok": 1, "zerolayer_rollout_stage": 0}


@pytest.mark.parametrize(
    "content",
    [
        "{not json",
        "[]",
        '{"format": 1}',
        "",
    ],
    ids=["not-json", "not-an-object", "missing-keys", "empty"],
)
def test_a_garbled_record_is_reported_and_exports_no_rollout(tmp_path, content):
    path = tmp_path / "rollout.json"
    path.write_text(content)
    found = rollout_samples(str(path))
    assert rollout_only(found) == {"zerolayer_rollout_record_ok": 0}


def test_a_record_with_a_stage_out_of_its_schedule_is_garbled(tmp_path):
    record = at_second_stage()
    record["stage"]["index"] = 7
    found = rollout_samples(write(tmp_path, record))
    assert rollout_only(found) == {"zerolayer_rollout_record_ok": 0}
    assert "stage.index" in exposition.read_rollout(write(tmp_path, record))["error"]


def test_an_unreadable_record_is_garbled(tmp_path):
    # A directory where the file should be: open() fails with EISDIR, also for root.
    path = tmp_path / "rollout.json"
    path.mkdir()
    rollout = exposition.read_rollout(str(path))
    assert rollout["state"] == "bad" and "cannot read" in rollout["error"]


def test_reader_logs_a_problem_once_until_it_changes(tmp_path):
    path = tmp_path / "rollout.json"
    path.write_text("{not json")
    logged = []
    reader = exposition.RolloutRecordReader(str(path), log=logged.append)
    reader()
    reader()
    assert len(logged) == 1 and "not valid JSON" in logged[0]
    record_codec.write_record(str(path), at_second_stage())
    assert reader()["state"] == "ok"
    path.write_text("{not json")
    reader()
    assert len(logged) == 2


def scrape(handler):
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
        connection.request("GET", "/metrics")
        response = connection.getresponse()
        body = response.read().decode()
        connection.close()
        return response.status, body
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def test_a_garbled_record_keeps_the_router_metrics_served(tmp_path):
    path = tmp_path / "rollout.json"
    path.write_text('{"format": 1, "rollout_id": ')
    reader = exposition.RolloutRecordReader(str(path), log=lambda line: None)
    status, body = scrape(exposition.make_handler(None, lambda _layout: snapshot(), reader))
    assert status == 200
    found = samples(body)
    assert found["zerolayer_rollout_record_ok"] == 0
    assert found["zerolayer_router_attached"] == 1
    assert found['zerolayer_route_weight_ratio{route="chat",port="8080"}'] == 0.125
    assert "zerolayer_rollout_stage" not in body


def test_the_record_is_read_on_every_scrape(tmp_path):
    path = tmp_path / "rollout.json"
    reader = exposition.RolloutRecordReader(str(path), log=lambda line: None)
    handler = exposition.make_handler(None, lambda _layout: snapshot(), reader)
    assert samples(scrape(handler)[1])["zerolayer_rollout_stage"] == 0
    record_codec.write_record(str(path), rolled_back("deep"))
    found = samples(scrape(handler)[1])
    assert found["zerolayer_rollout_stage"] == 2
    assert found['zerolayer_rollout_rollback_timestamp_seconds{kind="deep"}'] == unix(900)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        ([], exposition.DEFAULT_ROLLOUT_RECORD),
        (["--rollout-record", "/srv/zl/rollout.json"], "/srv/zl/rollout.json"),
        (["--rollout-record", ""], ""),
    ],
    ids=["default", "given", "off"],
)
def test_exporter_passes_the_rollout_record_option(monkeypatch, argv, expected):
    served = []
    monkeypatch.setattr(exposition, "serve", lambda *args: served.append(args))
    assert exposition.exporter_main(["--port", "9464", *argv]) == 0
    assert served[0][4] == expected


def test_serve_without_a_record_path_leaves_the_rollout_out():
    handler = exposition.make_handler(None, lambda _layout: snapshot(), None)
    assert "zerolayer_rollout_" not in scrape(handler)[1]


def test_the_watchers_count_of_direct_connections_is_exported_per_route():
    fence = {
        "epoch": 3,
        "kept_detached": False,
        "watcher": {"connected": True, "direct_connections": {"chat": 2, "batch": 0}},
    }
    found = samples(exposition.render({"fence": fence}))
    assert found['zerolayer_route_direct_connections{route="chat"}'] == 2
    assert found['zerolayer_route_direct_connections{route="batch"}'] == 0
    # A watcher that could not count (or an older one) exports no such series.
    fence["watcher"]["direct_connections"] = None
    assert "zerolayer_route_direct_connections" not in exposition.render({"fence": fence})


# ---------------------------------------------------------------- engines' memory pressure

PRESSURE = {
    "engines": [
        {
            "engine": "chat",
            "pressure": {
                "some": {"avg10": 0.0139, "total": 0.331037},
                "full": {"avg10": 0.0051, "total": 0.105491},
            },
        },
        {"engine": "embed", "pressure": {"some": {"avg10": 0.0, "total": 0.0}}},
        {"engine": "batch", "error": "memory.pressure does not exist (PSI off in this kernel?)"},
    ],
    "error": "memory.pressure does not exist (PSI off in this kernel?)",
}


def test_engine_memory_pressure_per_engine_and_kind():
    text = exposition.render(snapshot(engine_pressure=PRESSURE))
    found = samples(text)
    assert found['zerolayer_engine_memory_pressure_ok{engine="chat"}'] == 1
    assert found['zerolayer_engine_memory_pressure_ok{engine="batch"}'] == 0
    ratio = "zerolayer_engine_memory_pressure_ratio"
    assert found['%s{engine="chat",kind="some",window="10s"}' % ratio] == 0.0139
    assert found['%s{engine="chat",kind="full",window="10s"}' % ratio] == 0.0051
    seconds = "zerolayer_engine_memory_pressure_seconds_total"
    assert found['%s{engine="chat",kind="some"}' % seconds] == 0.331037
    # A kernel that wrote no "full" line: no full series, rather than a made-up zero.
    assert '%s{engine="embed",kind="full"}' % seconds not in found
    assert found['%s{engine="embed",kind="some"}' % seconds] == 0
    # An engine whose file could not be read says so, and has no pressure series.
    assert not [series for series in found if 'engine="batch"' in series and "_ok" not in series]
    assert types(text)[seconds] == "counter"
    assert types(text)[ratio] == "gauge"
    promtool_check(text)


def test_no_engine_slice_gives_no_engine_family():
    text = exposition.render(snapshot(engine_pressure={"engines": [], "error": None}))
    assert "zerolayer_engine_" not in text


def test_an_engine_slice_not_understood_keeps_everything_else_served(tmp_path):
    mount = tmp_path / "cgroup"
    engines = mount.joinpath("zerolayer.slice", "zerolayer-engine.slice")
    (engines / "zerolayer-engine-chat.slice").mkdir(parents=True)
    (engines / "zerolayer-engine-chat.slice" / "memory.pressure").write_text("garbage\n")
    (mount / "cgroup.controllers").write_text("")
    own = tmp_path / "self-cgroup"
    own.write_text("0::/system.slice/zerolayer-route-exporter.service\n")
    logged = []
    reader = exposition.engine_pressure_reader(
        log=logged.append, mounts=(str(mount),), own_cgroup=str(own)
    )
    handler = exposition.make_handler(None, lambda _layout: snapshot(), None, reader)
    status, body = scrape(handler)
    assert status == 200
    found = samples(body)
    assert found['zerolayer_engine_memory_pressure_ok{engine="chat"}'] == 0
    assert found['zerolayer_route_weight_ratio{route="chat",port="8080"}'] == 0.125
    assert "zerolayer_engine_memory_pressure_seconds_total" not in body
    # Read again on the next scrape, and the reason logged once until it changes.
    (engines / "zerolayer-engine-chat.slice" / "memory.pressure").write_text(
        "some avg10=2.00 avg60=0.00 avg300=0.00 total=5000000\n"
    )
    found = samples(scrape(handler)[1])
    assert found['zerolayer_engine_memory_pressure_seconds_total{engine="chat",kind="some"}'] == 5
    assert found['zerolayer_engine_memory_pressure_ok{engine="chat"}'] == 1
    assert len(logged) == 2, logged
    assert logged[0].startswith("engine memory pressure not exported: ")
    assert "has no 'some' line" in logged[0]
    assert logged[1] == "engine memory pressure read again\n"


def test_a_cohort_stage_is_a_stage_in_progress_at_weight_zero(tmp_path):
    # A cohort stage (weight 0: only its clients go direct) first, as the rollout module
    # normalises it: the stage is exported by its number, the weight asked for is 0.
    record, _changed, _note = r.plan(None, "chat-7", SCHEDULE, None, False, at(0), ME)
    cohort_stage = {"weight": 0, "weight_bp": 0, "hold_s": 60, "cohort": ["192.0.2.7/32"]}
    later = [dict(stage, cohort=[]) for stage in record["schedule"][1:]]
    record["schedule"] = [cohort_stage, *later]
    record = step(record, "stage_started", 10, stage=0)
    record = step(record, "hold_started", 20)
    view = exposition.rollout_from_record(record)
    assert (view["stage_number"], view["stage_status"], view["weight_ratio"]) == (1, "holding", 0.0)
    found = rollout_only(rollout_samples(write(tmp_path, record)))
    assert found["zerolayer_rollout_stage"] == 1
    assert found["zerolayer_rollout_stages"] == len(record["schedule"])
    assert found["zerolayer_rollout_weight_ratio"] == 0
    assert found['zerolayer_rollout_stage_status{status="holding"}'] == 1
