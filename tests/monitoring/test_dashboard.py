"""The Grafana dashboard: well-formed, every query parses and reads real metric names."""

import json
import re
import subprocess

import pytest
import yaml
from promql_names import (
    DASHBOARD,
    ENGINE_NAME,
    EXPORTER_NAME,
    EXTERNAL_METRICS,
    base_name,
    documented_metrics,
    exporter_text,
    fixture_metric_names,
    metric_names,
    recorded_names,
    scraped_names,
)

# Grafana replaces these before a query reaches Prometheus; promtool sees the stand-ins.
GRAFANA_VARIABLES = {
    "$__rate_interval": "1m",
    "$__interval": "30s",
    "$__range": "6h",
    "$node": ".*",
    "$route": ".*",
}


def dashboard():
    return json.loads(DASHBOARD.read_text())


def query_panels():
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def all_queries():
    """(where, PromQL) for every panel target and annotation query."""
    queries = []
    for panel in query_panels():
        for target in panel["targets"]:
            queries.append((f"panel '{panel['title']}' {target['refId']}", target["expr"]))
    for annotation in dashboard()["annotations"]["list"]:
        if "expr" in annotation:
            queries.append((f"annotation '{annotation['name']}'", annotation["expr"]))
    return queries


def variable_queries():
    """The metric selectors inside label_values(...) of the query variables."""
    selectors = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+),\s*\w+\)", variable["query"]["query"])
        assert match, f"variable {variable['name']}: expected label_values(selector, label)"
        selectors.append((f"variable {variable['name']}", match.group(1)))
    return selectors


def substitute(expr):
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    assert "$" not in expr, f"unknown Grafana variable in {expr}"
    return expr


def test_dashboard_shape():
    board = dashboard()
    assert board["uid"] and board["title"] and board["schemaVersion"] >= 36
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert {"node", "route"} <= set(variables)
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"


def test_every_panel_has_datasource_and_targets():
    panels = query_panels()
    assert panels
    for panel in panels:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], f"panel '{panel['title']}' has no targets"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            assert target["expr"].strip(), panel["title"]


def test_every_query_parses(promtool, tmp_path):
    queries = all_queries() + variable_queries()
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{index}", "expr": substitute(expr)}
                    for index, (_, expr) in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert f"SUCCESS: {len(queries)} rules found" in output, output


def test_promtool_rejects_a_broken_query(promtool, tmp_path):
    # The parse check above is only worth something if promtool does parse PromQL.
    path = tmp_path / "broken.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "groups": [
                    {
                        "name": "x",
                        "rules": [{"record": "x:y", "expr": "sum by (node (rate(x[1m]))"}],
                    }
                ]
            }
        )
    )
    result = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        (
            'sum by (node, le) (rate(vllm:time_to_first_token_seconds_bucket{path="direct"}[1m]))',
            {"vllm:time_to_first_token_seconds_bucket"},
        ),
        (
            'a{x="b c"} > ignoring (path) 1.25 * b:c:d{y=~"e|f"} and on (node) up == 0',
            {"a", "b:c:d", "up"},
        ),
        ("histogram_quantile(0.99, sum by (le) (rate(m_bucket[5m]))) > 5e-06", {"m_bucket"}),
    ],
)
def test_metric_name_extraction(expr, expected):
    assert metric_names(expr) == expected


def test_dashboard_reads_only_metrics_the_system_emits():
    documented = documented_metrics()
    recorded_fixtures = fixture_metric_names()
    exported = scraped_names(exporter_text())
    recorded = recorded_names()
    unknown = {}
    for where, expr in all_queries() + variable_queries():
        for name in metric_names(expr):
            if name in recorded or name in EXTERNAL_METRICS:
                continue
            base = base_name(name)
            if ENGINE_NAME.match(base):
                known = name in recorded_fixtures and base in documented
            elif EXPORTER_NAME.match(base):
                known = name in exported and base in documented
            else:
                known = base in documented
            if not known:
                unknown.setdefault(where, []).append(name)
    assert not unknown, f"dashboard reads metrics nothing emits: {unknown}"


# Panels that show something only when it happens; on the recorded fleets it does not.
SHOWN_ONLY_WHEN_IT_HAPPENS = {
    # No route falls back or fails to assign a socket on the recorded fleets.
    "panel 'Fallbacks and assign errors' A",
    # A rollback in the last 2 minutes; the recorded one is older.
    "annotation 'Rollbacks'",
}


def test_every_panel_shows_data_from_stock_engines(recorded_prometheus):
    at = recorded_prometheus.rules_at
    empty = []
    shown = {}
    for where, expr in all_queries():
        reply = recorded_prometheus.api(substitute(expr), at=at)
        assert reply["status"] == "success", (where, reply.get("error"))
        result = reply["data"]["result"]
        shown[where] = {item["metric"].get("node") for item in result}
        if not result and where not in SHOWN_ONLY_WHEN_IT_HAPPENS:
            empty.append(where)
    assert not empty, f"panels with no data on the recorded fleets: {empty}"
    # The engine panels show vLLM and Triton nodes alike, each from its own names.
    assert {"vllm-1.test", "triton-1.test"} <= shown["panel 'Success rate' A"]
    assert {"vllm-1.test", "triton-histograms-1.test"} <= shown["panel 'Time to first token p99' A"]
    assert "vllm-1.test" in shown["panel 'Requests in flight' A"]
    assert "triton-1.test" in shown["panel 'Requests in flight' B"]
    assert {"vllm-1.test", "triton-1.test", "vllm-dcgm-1.test"} <= shown[
        "panel 'GPU memory in use' A"
    ]


def test_exporter_text_has_every_family_it_can_serve():
    # The dashboard check above is only as good as this rendering: it must hold the
    # router, route and rollout families, the rollback moment included.
    exported = scraped_names(exporter_text())
    for name in (
        "zerolayer_router_info",
        "zerolayer_route_decision_duration_seconds_bucket",
        "zerolayer_rollout_stage",
        "zerolayer_rollout_weight_ratio",
        "zerolayer_rollout_info",
        "zerolayer_rollout_rollback_timestamp_seconds",
        "zerolayer_engine_memory_pressure_seconds_total",
    ):
        assert name in exported, name
    assert "zerolayer_rollback_total" not in exported
