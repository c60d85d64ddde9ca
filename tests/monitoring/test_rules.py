"""The alert and recording rules: valid, unit-tested, and reading real metric names."""

import subprocess

import yaml
from promql_names import (
    ENGINE_NAME,
    EXPORTER_NAME,
    EXTERNAL_METRICS,
    REPO,
    RULES,
    STORE_EXPORTER_NAME,
    base_name,
    documented_metrics,
    exporter_text,
    fixture_metric_names,
    metric_names,
    recorded_names,
    scraped_names,
    store_exporter_text,
)
from recorded_fleet import FLEETS

RULE_TESTS = sorted((REPO / "files/prometheus/tests").glob("*.yml"))


def rules():
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


def alerts():
    return [rule for rule in rules() if "alert" in rule]


def run(argv):
    result = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=REPO)
    return result.returncode, result.stdout + result.stderr


def test_promtool_check_rules(promtool):
    rc, output = run([promtool, "check", "rules", str(RULES)])
    assert rc == 0, output
    assert f"SUCCESS: {len(rules())} rules found" in output, output


def test_promtool_test_rules(promtool):
    assert RULE_TESTS, "no rule unit tests in files/prometheus/tests"
    rc, output = run([promtool, "test", "rules", *map(str, RULE_TESTS)])
    assert rc == 0, output
    assert "FAILED" not in output, output


def test_every_alert_is_tested_firing_and_quiet():
    firing, quiet = set(), set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in alerts()}
    assert names - firing == set(), f"alerts never tested firing: {sorted(names - firing)}"
    assert names - quiet == set(), f"alerts never tested quiet: {sorted(names - quiet)}"


def test_every_recording_rule_value_is_tested():
    tested = set()
    for path in RULE_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            for check in case.get("promql_expr_test", []):
                if check.get("exp_samples"):
                    tested |= metric_names(check["expr"])
    missing = recorded_names() - tested
    assert not missing, f"recording rules without a value test: {sorted(missing)}"


def test_every_alert_has_for_severity_and_runbook():
    for rule in alerts():
        name = rule["alert"]
        assert rule.get("for"), f"{name} has no 'for'"
        assert rule["labels"]["severity"] in {"warning", "critical"}, name
        annotations = rule["annotations"]
        assert annotations.get("summary") and annotations.get("description"), name
        assert annotations["runbook_url"].startswith("docs/runbook.md#"), name


def test_rules_read_only_metrics_the_system_emits():
    documented = documented_metrics()
    recorded_fixtures = fixture_metric_names()
    stored = scraped_names(store_exporter_text())
    exported = scraped_names(exporter_text())
    recorded = recorded_names()
    unknown = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            if name in recorded or name in EXTERNAL_METRICS:
                continue
            base = base_name(name)
            if ENGINE_NAME.match(base):
                known = name in recorded_fixtures and base in documented
            elif STORE_EXPORTER_NAME.match(base):
                known = name in stored and base in documented
            elif EXPORTER_NAME.match(base):
                known = name in exported and base in documented
            else:
                known = base in documented
            if not known:
                unknown.setdefault(rule.get("alert") or rule.get("record"), []).append(name)
    assert not unknown, f"rules read metrics nothing emits: {unknown}"


# ---------------------------------------------------------------- on the recorded fleets

# The stage nodes of the fleets whose engines get worse after the stage start
# (tests/monitoring/recorded_fleet.py): the only engine nodes an alert may name.
WORSE = {name for name in FLEETS if name.endswith("-worse")}
# Nodes whose exporter holds a rollout record (a rollback, a pause): rollout alerts may
# name them.
ROLLOUT_NODES = {"rollout-rolled_back.test", "rollout-paused.test"}


def test_every_recording_rule_records_on_stock_engines(recorded_prometheus):
    at = recorded_prometheus.rules_at
    for name in sorted(recorded_names()):
        assert recorded_prometheus.query(name, at=at), f"{name} recorded nothing"

    def nodes(name, **labels):
        selector = ",".join(f'{key}="{value}"' for key, value in labels.items())
        return {
            item["metric"]["node"]
            for item in recorded_prometheus.query(f"{name}{{{selector}}}", at=at)
        }

    # Per engine kind, from its own names alone.
    success = "node_path:zerolayer_engine_request_success:ratio_rate1m"
    assert {"vllm-1.test", "triton-1.test"} <= nodes(success)
    ttft = "node_path:zerolayer_engine_first_token_seconds:p99_rate1m"
    assert "vllm-1.test" in nodes(ttft, source="vllm")
    assert "triton-histograms-1.test" in nodes(ttft, source="triton")
    # Triton without its histograms has no first response to show.
    assert "triton-1.test" not in nodes(ttft)
    gpu = "node_gpu:zerolayer_gpu_memory_used:ratio"
    assert "vllm-1.test" in nodes(gpu, engine="chat")
    assert "triton-1.test" in nodes(gpu, gpu_uuid="GPU-3f9a1c52-8e0b-4d27-b6a4-1c0e5d7f9a21")
    assert "vllm-dcgm-1.test" in nodes(gpu, gpu="0")
    # Where DCGM is there it is the source, not the KV cache of the vLLM beside it.
    assert "vllm-dcgm-1.test" not in nodes(gpu, engine="chat")


def test_healthy_stock_engines_succeed_and_the_worse_ones_do_not(recorded_prometheus):
    at = recorded_prometheus.rules_at
    success = {
        item["metric"]["node"]: float(item["value"][1])
        for item in recorded_prometheus.query(
            "node_path:zerolayer_engine_request_success:ratio_rate1m", at=at
        )
    }
    for node, value in success.items():
        fleet = node.rsplit("-", 1)[0]
        if fleet in ("vllm-worse", "triton-worse") and node.endswith("-1.test"):
            assert value < 0.9995, (node, value)
        else:
            # Cancelled Triton requests and vLLM's 4xx are no failures.
            assert value == 1.0, (node, value)


def test_every_alert_evaluates_on_stock_engines_and_names_only_what_got_worse(
    recorded_prometheus,
):
    at = recorded_prometheus.rules_at
    worse_nodes = {FLEETS[name].stage_node for name in WORSE}
    named = {}
    for rule in alerts():
        reply = recorded_prometheus.api(rule["expr"], at=at)
        assert reply["status"] == "success", (rule["alert"], reply.get("error"))
        named[rule["alert"]] = {item["metric"].get("node") for item in reply["data"]["result"]}
    for alert, nodes in named.items():
        assert nodes <= worse_nodes | ROLLOUT_NODES, (alert, nodes)
    assert named["ZerolayerEngineErrorRateHigh"] == {
        FLEETS["vllm-worse"].stage_node,
        FLEETS["triton-worse"].stage_node,
    }
    # Slower than the median node of its engine kind that takes no direct-path traffic.
    assert named["ZerolayerDirectPathFirstTokenSlower"] == {
        FLEETS["vllm-worse"].stage_node,
        FLEETS["triton-histograms-worse"].stage_node,
    }
    # Its engine's slice stalls on memory 80% of the time; every other node's 1%.
    assert named["ZerolayerEngineMemoryPressure"] == {FLEETS["vllm-worse"].stage_node}


def test_store_exporter_text_has_every_family_it_can_serve():
    # The rule check above is only as good as this rendering: every family of the store's
    # exporter must be in it.
    served = scraped_names(store_exporter_text())  # puts the collection on sys.path
    from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter

    assert served >= set(store_exporter._HELP)
