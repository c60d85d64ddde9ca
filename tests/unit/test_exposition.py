"""Prometheus text rendering of router snapshots (no kernel needed)."""

import re
import shutil
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils import exposition

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
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is missing: install the prometheus package (bindep profile test)")
    check = subprocess.run(
        [promtool, "check", "metrics"],
        input=exposition.render(case),
        capture_output=True,
        text=True,
        check=False,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    assert check.stdout.strip() == "" and check.stderr.strip() == ""
