"""Verify the prometheus_server role: a real Prometheus on node 1 scraping nodes 2 and 3.

The route exporters are STAND-INs (python3 http.server serving a fixed metrics file in the
exporter's metric names). Node 2 has TLS on: its engine is the CPU engine simulator serving
TLS with a throwaway self-signed certificate that names the node's address, and /metrics
only with the key. Node 3 has TLS
off and a Triton engine whose metrics port (listen_port + 1) is a STAND-IN serving a fixed
file in Triton's names. Prometheus, its configuration, rules, TLS and scraping are real.
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
TLS_NODE, PLAIN_NODE = sorted(RUNNER.get_hosts("gpu_nodes"))
GPU_NODES = [TLS_NODE, PLAIN_NODE]
ENGINE_CA = "/etc/prometheus/engine-tls-ca.pem"
ENGINE_KEY_FILE = "/etc/prometheus/engine-api-key"
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


def node_address(job_groups, node):
    (group,) = [group for group in job_groups if group["labels"]["node"] == node]
    return group["targets"][0].rsplit(":", 1)[0]


def test_scrape_configuration_comes_from_the_inventory(host):
    config = yaml.safe_load(host.file("/etc/prometheus/prometheus.yml").content_string)
    assert config["global"]["scrape_interval"] == "2s"
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert sorted(jobs) == ["zerolayer-engines", "zerolayer-router"]
    router_groups = jobs["zerolayer-router"]["static_configs"]
    assert sorted(group["labels"]["node"] for group in router_groups) == GPU_NODES
    addresses = {node: node_address(router_groups, node) for node in GPU_NODES}
    for node in GPU_NODES:
        assert addresses[node] != node, "the node's address should come from its facts"
    engines = jobs["zerolayer-engines"]
    # The engine with state: present is installed but not running: not scraped. Triton is
    # scraped on its metrics port over plain HTTP; the TLS node's engine over https.
    assert sorted(engines["static_configs"], key=lambda group: group["labels"]["node"]) == [
        {
            "targets": [addresses[TLS_NODE] + ":8101"],
            "labels": {"node": TLS_NODE, "engine": "chat_sim", "route": "chat"},
        },
        {
            "targets": [addresses[PLAIN_NODE] + ":8111"],
            "labels": {
                "node": PLAIN_NODE,
                "engine": "embed_trt",
                "route": "embed",
                "__scheme__": "http",
            },
        },
    ]
    assert engines["scheme"] == "https"
    # Verified against the engines' certificate: never without verification.
    assert engines["tls_config"] == {"ca_file": ENGINE_CA}
    # The key from a file only Prometheus reads, never in prometheus.yml itself.
    assert engines["authorization"] == {"type": "Bearer", "credentials_file": ENGINE_KEY_FILE}
    assert "sk-molecule" not in host.file("/etc/prometheus/prometheus.yml").content_string


def test_the_scrape_key_is_readable_by_prometheus_only(host):
    key_file = host.file(ENGINE_KEY_FILE)
    assert (key_file.user, key_file.group, key_file.mode) == ("root", "prometheus", 0o640)
    assert key_file.content_string == "sk-molecule-prometheus-key-01\n"


def test_engine_certificate_is_what_prometheus_verifies_against(host):
    controller_copy = pathlib.Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "tls/tls.crt"
    ca = host.file(ENGINE_CA)
    assert ca.content_string.strip() == controller_copy.read_text().strip()
    assert (ca.user, ca.group, ca.mode) == ("root", "prometheus", 0o644)
    config = yaml.safe_load(host.file("/etc/prometheus/prometheus.yml").content_string)
    (engines,) = [job for job in config["scrape_configs"] if job["job_name"] == "zerolayer-engines"]
    (target,) = [
        g["targets"][0] for g in engines["static_configs"] if g["labels"]["node"] == TLS_NODE
    ]
    # The same check Prometheus makes: the certificate, the address it names, TLS only,
    # and the key.
    curl = "curl -sS -o /dev/null -w '%%{http_code}' --cacert %s"
    with_key = curl + ' -H "Authorization: Bearer $(cat %s)" https://%s/metrics'
    assert host.check_output(with_key, ENGINE_CA, ENGINE_KEY_FILE, target) == "200"
    assert host.check_output(curl + " https://%s/metrics", ENGINE_CA, target) == "401"
    assert host.run("curl -sS --fail -o /dev/null http://%s/metrics", target).rc != 0


def test_targets_are_up_and_only_the_inventory_nodes(host):
    def all_up():
        targets = api_get(host, "/targets", state="active")["activeTargets"]
        return targets if len(targets) == 4 and all(t["health"] == "up" for t in targets) else None

    targets = wait_for(all_up)
    assert targets, api_get(host, "/targets", state="active")
    assert sorted((t["labels"]["job"], t["labels"]["node"]) for t in targets) == [
        ("zerolayer-engines", TLS_NODE),
        ("zerolayer-engines", PLAIN_NODE),
        ("zerolayer-router", TLS_NODE),
        ("zerolayer-router", PLAIN_NODE),
    ]
    config = yaml.safe_load(host.file("/etc/prometheus/prometheus.yml").content_string)
    configured = {
        target
        for job in config["scrape_configs"]
        for group in job["static_configs"]
        for target in group["targets"]
    }
    assert {t["labels"]["instance"] for t in targets} == configured
    engines = {t["labels"]["node"]: t for t in targets if t["labels"]["job"] == "zerolayer-engines"}
    assert (
        engines[TLS_NODE]["scrapeUrl"]
        == "https://%s/metrics" % engines[TLS_NODE]["labels"]["instance"]
    )
    assert (
        engines[PLAIN_NODE]["scrapeUrl"]
        == "http://%s/metrics" % engines[PLAIN_NODE]["labels"]["instance"]
    )
    assert all(t["lastError"] == "" for t in targets), [t["lastError"] for t in targets]


def test_query_returns_the_scraped_value(host):
    def weight():
        result = query(host, 'zerolayer_route_weight_ratio{job="zerolayer-router"}')
        return result if len(result) == 2 else None

    result = wait_for(weight)
    assert result, query(host, 'zerolayer_route_weight_ratio{job="zerolayer-router"}')
    assert sorted(r["metric"]["node"] for r in result) == GPU_NODES
    assert {r["metric"]["route"] for r in result} == {"chat"}
    assert all(float(r["value"][1]) == 0.25 for r in result)


def test_tls_engine_metrics_are_scraped(host):
    def running():
        return query(host, 'vllm:num_requests_running{job="zerolayer-engines"}')

    result = wait_for(running)
    assert [(r["metric"]["node"], r["metric"]["engine"]) for r in result] == [
        (TLS_NODE, "chat_sim")
    ]


def test_triton_metrics_port_is_scraped(host):
    def successes():
        return query(host, 'nv_inference_request_success{job="zerolayer-engines"}')

    result = wait_for(successes)
    assert [(r["metric"]["node"], r["metric"]["engine"]) for r in result] == [
        (PLAIN_NODE, "embed_trt")
    ]
    assert float(result[0]["value"][1]) == 42
    assert result[0]["metric"]["instance"].endswith(":8111")


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
        return result if len(result) == 8 else None

    result = wait_for(outcomes)
    assert result, "the recording rule produced no series"
    assert sorted((r["metric"]["node"], r["metric"]["outcome"]) for r in result) == [
        (node, outcome)
        for node in GPU_NODES
        for outcome in ("assign_error", "engine", "fallback_no_socket", "proxy_weight")
    ]
    assert all(float(r["value"][1]) == 0 for r in result)
