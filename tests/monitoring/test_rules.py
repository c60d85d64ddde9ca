"""The alert and recording rules: valid, unit-tested, and reading real metric names."""

import subprocess

import yaml
from promql_names import (
    ENGINE_NAME,
    EXTERNAL_METRICS,
    REPO,
    RULES,
    STORE_EXPORTER_NAME,
    base_name,
    documented_metrics,
    metric_names,
    recorded_names,
    scraped_names,
    store_exporter_text,
)

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


def test_rules_read_only_metrics_the_system_emits(engine_sim_metrics):
    documented = documented_metrics()
    simulated = scraped_names(engine_sim_metrics)
    stored = scraped_names(store_exporter_text())
    recorded = recorded_names()
    unknown = {}
    for rule in rules():
        for name in metric_names(rule["expr"]):
            if name in recorded or name in EXTERNAL_METRICS:
                continue
            base = base_name(name)
            if ENGINE_NAME.match(base):
                known = name in simulated and base in documented
            elif STORE_EXPORTER_NAME.match(base):
                known = name in stored and base in documented
            else:
                known = base in documented
            if not known:
                unknown.setdefault(rule.get("alert") or rule.get("record"), []).append(name)
    assert not unknown, f"rules read metrics nothing emits: {unknown}"


def test_store_exporter_text_has_every_family_it_can_serve():
    # The rule check above is only as good as this rendering: every family of the store's
    # exporter must be in it.
    served = scraped_names(store_exporter_text())  # puts the collection on sys.path
    from ansible_collections.zerolayer.fleet.plugins.module_utils import store_exporter

    assert served >= set(store_exporter._HELP)
