"""Verify the prometheus_server role: a real Prometheus on node 1 scraping node 2.

Node 2's route exporter is a STAND-IN (python3 http.server serving a fixed metrics file
in the exporter's metric names); its engine is the CPU engine simulator. Prometheus, its
configuration, rules and scraping are real.
"""

import json
import os
import pathlib
import time
import urllib.parse

import testinfra.utils.ansible_runner
import yaml

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("monitoring")

REPO = pathlib.Path(__file__).resolve().parents[3]
RULES = REPO / "files/prometheus/rules/zerolayer.rules.yml"
API = "http://127.0.0.1:9090/api/v1"
GPU_NODE = RUNNER.get_hosts("gpu_nodes")[0]
# Waiting for the first scrapes and rule evaluations is not a timing assertion: the
# deadline only bounds how long a broken setup takes to report.
DEADLINE_S = 120


def api_get(host, path, **params):
    url = API + path
    if params:
        url += "?" + urllib.parse.urlencode(params)
    reply = json.loads(host.check_output("curl -sS --fail %s", url))
    assert reply["status"] == "success", reply
    return reply["data"]


def query(host, promql):
    return api_get(host, "/query", query=promql)["result"]


def wait_for(probe):
    deadline = time.monotonic() + DEADLINE_S
    while True:
        result = probe()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(1)


def test_service_enabled_and_running(host):
    service = host.service("prometheus")
    assert service.is_running
    assert service.is_enabled


def test_flags_from_the_role(host):
    command = host.check_output("systemctl show prometheus -p ExecStart --value")
    assert "--web.listen-address=0.0.0.0:9090" in command
    assert "--storage.tsdb.retention.time=1d" in command
    assert host.socket("tcp://0.0.0.0:9090").is_listening


def test_configuration_is_valid(host):
    result = host.run("promtool check config /etc/prometheus/prometheus.yml")
    assert result.rc == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr


def test_scrape_configuration_comes_from_the_inventory(host):
    config = yaml.safe_load(host.file("/etc/prometheus/prometheus.yml").content_string)
    assert config["global"]["scrape_interval"] == "2s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["zerolayer-engines", "zerolayer-router"]
    router_groups = jobs["zerolayer-router"]["static_configs"]
    engine_groups = jobs["zerolayer-engines"]["static_configs"]
    assert [group["labels"] for group in router_groups] == [{"node": GPU_NODE}]
    # The engine with state: present is installed but not running: not scraped.
    assert [group["labels"] for group in engine_groups] == [
        {"node": GPU_NODE, "engine": "chat_sim", "route": "chat"}
    ]
    address = router_groups[0]["targets"][0].rsplit(":", 1)[0]
    assert router_groups[0]["targets"] == [address + ":9464"]
    assert engine_groups[0]["targets"] == [address + ":8101"]
    assert address != GPU_NODE, "the node's address should come from its facts"


def test_targets_are_up_and_only_the_inventory_nodes(host):
    def all_up():
        targets = api_get(host, "/targets", state="active")["activeTargets"]
        return targets if targets and all(t["health"] == "up" for t in targets) else None

    targets = wait_for(all_up)
    assert targets, api_get(host, "/targets", state="active")
    assert sorted((t["labels"]["job"], t["labels"]["node"]) for t in targets) == [
        ("zerolayer-engines", GPU_NODE),
        ("zerolayer-router", GPU_NODE),
    ]
    config = yaml.safe_load(host.file("/etc/prometheus/prometheus.yml").content_string)
    configured = {
        target
        for job in config["scrape_configs"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    assert {t["labels"]["instance"] for t in targets} == configured


def test_query_returns_the_scraped_value(host):
    def weight():
        return query(host, 'zerolayer_route_weight_ratio{job="zerolayer-router"}')

    result = wait_for(weight)
    assert len(result) == 1, result
    assert result[0]["metric"]["node"] == GPU_NODE
    assert result[0]["metric"]["route"] == "chat"
    assert float(result[0]["value"][1]) == 0.25


def test_engine_metrics_are_scraped(host):
    def running():
        return query(host, 'vllm:num_requests_running{job="zerolayer-engines"}')

    result = wait_for(running)
    assert [r["metric"]["engine"] for r in result] == ["chat_sim"]


def test_every_rule_is_loaded(host):
    shipped = yaml.safe_load(RULES.read_text())
    shipped_rules = [rule for group in shipped["groups"] for rule in group["rules"]]
    expected_alerts = sorted(r["alert"] for r in shipped_rules if "alert" in r)
    expected_records = sorted(r["record"] for r in shipped_rules if "record" in r)
    groups = api_get(host, "/rules")["groups"]
    loaded = [rule for group in groups for rule in group["rules"]]
    assert sorted(r["name"] for r in loaded if r["type"] == "alerting") == expected_alerts
    assert sorted(r["name"] for r in loaded if r["type"] == "recording") == expected_records
    assert all(r["health"] != "err" for r in loaded), [r for r in loaded if r["health"] == "err"]


def test_recording_rule_is_evaluated(host):
    # The stand-in's counters never move, so the split is 0/0; the per-outcome rate
    # recording rule is 0 for each of the four outcomes.
    def outcomes():
        result = query(host, "node_route_outcome:zerolayer_route_decisions:rate1m")
        return result if len(result) == 4 else None

    result = wait_for(outcomes)
    assert result, "the recording rule produced no series"
    assert sorted(r["metric"]["outcome"] for r in result) == [
        "assign_error",
        "engine",
        "fallback_no_socket",
        "proxy_weight",
    ]
    assert all(float(r["value"][1]) == 0 for r in result)
