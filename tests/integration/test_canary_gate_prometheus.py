"""canary_gate against a real Prometheus that scrapes a metrics server the test controls.

Prometheus (the Debian binary) runs on 127.0.0.1 with a throw-away storage directory and a
1 s scrape interval. The scraped server is a small HTTP server in this process whose series
the tests set. A few cases run the module through `ansible`; the rest call module_utils.
Waits are bounded polls for data to arrive; no assertion depends on how long anything took.
"""

import datetime
import json
import math
import os
import pathlib
import socket
import subprocess
import threading
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import clock
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import gates as g
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry.prometheus_api import (
    PrometheusClient,
)
from jinja2.nativetypes import NativeEnvironment
from prometheus_process import PROMETHEUS, PrometheusProcess, poll_until

REPO = pathlib.Path(__file__).resolve().parents[2]
JOB = "zl-canary-test"
WAIT_LIMIT = 90  # seconds a poll may wait for Prometheus before the test fails with a message


@pytest.fixture(scope="module", autouse=True)
def prometheus_installed():
    """Prometheus is part of the test profile (bindep.txt): missing, it is a failure."""
    if not os.path.exists(PROMETHEUS):
        pytest.fail(
            "%s is missing: install the Debian package prometheus (scripts/setup test)" % PROMETHEUS
        )


# ---------------------------------------------------------------- the scraped server


class Exposition:
    """Series served on /metrics: gauges as set, counters advanced by their step per scrape."""

    def __init__(self):
        self.lock = threading.Lock()
        self.gauges = {}
        self.counters = {}
        self.steps = {}
        self.scrapes = 0

    @staticmethod
    def _key(name, labels):
        return name, tuple(sorted((labels or {}).items()))

    def set_gauge(self, name, value, **labels):
        with self.lock:
            self.gauges[self._key(name, labels)] = value

    def remove(self, name):
        with self.lock:
            for table in (self.gauges, self.counters, self.steps):
                for key in [key for key in table if key[0] == name]:
                    del table[key]

    def set_counter_step(self, name, step, **labels):
        with self.lock:
            key = self._key(name, labels)
            self.counters.setdefault(key, 0.0)
            self.steps[key] = step

    def render(self):
        with self.lock:
            self.scrapes += 1
            for key, step in self.steps.items():
                self.counters[key] += step
            lines = []
            for (name, labels), value in sorted({**self.gauges, **self.counters}.items()):
                text = ",".join('%s="%s"' % pair for pair in labels)
                number = "NaN" if math.isnan(value) else repr(float(value))
                lines.append("%s{%s} %s" % (name, text, number))
            return ("\n".join(lines) + "\n").encode()


class MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = self.server.exposition.render()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def exposition():
    server = ThreadingHTTPServer(("127.0.0.1", 0), MetricsHandler)
    server.exposition = Exposition()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.exposition, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# ---------------------------------------------------------------- Prometheus


class PrometheusServer(PrometheusProcess):
    """Prometheus scraping the test's exposition every second."""

    def __init__(self, target_port):
        super().__init__("zl-canary-prom-", WAIT_LIMIT)
        self.target_port = target_port

    def start(self):
        self.launch(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "static_configs": [{"targets": ["127.0.0.1:%d" % self.target_port]}],
                    }
                ],
            },
            retention="1h",
        )

    def query(self, promql):
        url = self.url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback http
            return json.load(response)["data"]["result"]


def wait_for(condition, what, prometheus=None):
    """Poll until condition() is true; fail naming what never happened (with Prometheus's
    log when given)."""
    if prometheus is None:
        poll_until(condition, what, WAIT_LIMIT)
    else:
        prometheus.wait_for(condition, what)


@pytest.fixture(scope="module")
def prometheus(exposition):
    _metrics, port = exposition
    server = PrometheusServer(port)
    try:
        server.start()
        wait_for(lambda: bool(server.query('up{job="%s"} == 1' % JOB)), "the first scrape", server)
        yield server
    finally:
        server.cleanup()


def wait_for_value(prometheus, promql, expected):
    """Wait until Prometheus' latest value of promql is expected (the scrape happened)."""

    def seen():
        result = prometheus.query(promql)
        return bool(result) and float(result[0]["value"][1]) == expected

    wait_for(seen, "%s == %s" % (promql, expected), prometheus)


def wait_for_nan(prometheus, promql):
    def seen():
        result = prometheus.query(promql)
        return bool(result) and math.isnan(float(result[0]["value"][1]))

    wait_for(seen, "%s to be NaN" % promql, prometheus)


# ---------------------------------------------------------------- helpers


def utc(seconds_ago=0.0):
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(seconds=seconds_ago)


def evaluate(prometheus_url, definitions, hold_started_at=None, window="10s", timeout=10):
    gates = g.validate_gates(definitions)
    client = PrometheusClient(prometheus_url, timeout=timeout)
    values = g.placeholder_values(hold_started_at, utc(), window)
    return g.evaluate_gates(gates, client.query, values)


LATENCY_GATE = {
    "name": "latency",
    "query": "max by (node) (zl_test_latency_seconds)",
    "comparison": "<",
    "threshold": 0.005,
}


def run_ansible_module(args, tmp_path, check=False):
    """Run zerolayer.fleet.canary_gate through `ansible` from the checkout; returns its result."""
    env = dict(os.environ)
    env.update(
        {
            "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"),
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1",
            "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_LOCAL_TEMP": str(tmp_path / "ansible-local"),
            "ANSIBLE_REMOTE_TEMP": str(tmp_path / "ansible-remote"),
            "PATH": "%s:%s" % (REPO / ".venv" / "bin", env.get("PATH", "")),
        }
    )
    venv_python = REPO / ".venv" / "bin" / "python"
    command = [
        str(REPO / ".venv" / "bin" / "ansible"),
        "localhost",
        "-i",
        "localhost,",
        "-c",
        "local",
        "-e",
        "ansible_python_interpreter=%s" % venv_python,
        "-m",
        "zerolayer.fleet.canary_gate",
        "-a",
        json.dumps(args),
    ]
    if check:
        command.append("--check")
    completed = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    try:
        report = json.loads(completed.stdout)
    except ValueError:
        raise AssertionError(
            "ansible printed no JSON:\n%s\n%s" % (completed.stdout, completed.stderr)
        ) from None
    return report["plays"][0]["tasks"][0]["hosts"]["localhost"]


# ---------------------------------------------------------------- cases through ansible


def test_passing_gates_through_ansible_then_complete_when_the_hold_is_over(
    exposition, prometheus, tmp_path
):
    metrics, _port = exposition
    metrics.set_gauge("zl_test_latency_seconds", 0.002, node="a")
    metrics.set_gauge("zl_test_latency_seconds", 0.003, node="b")
    wait_for_value(prometheus, 'zl_test_latency_seconds{node="b"}', 0.003)
    state_file = tmp_path / "gates.json"
    args = {
        "prometheus_url": prometheus.url,
        "gates": [LATENCY_GATE],
        "state_file": str(state_file),
        "rollout_id": "it-pass",
        "stage": 1,
        "weight": 5,
        "hold": "1h",
        "hold_started_at": clock.format_timestamp(utc(seconds_ago=600)),
    }
    result = run_ansible_module(args, tmp_path)
    assert result.get("failed") is not True, result
    assert (result["verdict"], result["decision"]) == ("pass", "continue")
    (latency,) = result["gates"]
    assert latency["value"] == 0.003
    assert latency["worst_series"] == {"node": "b"}
    assert latency["series"] == 2
    assert 3000 - 60 < result["hold_remaining_s"] <= 3000
    assert json.loads(state_file.read_text())["evaluations"] == 1

    # The next stage, whose hold started two hours ago: its first evaluation finds the
    # hold over (the hold counts time watched, so an earlier start of the same stage's hold
    # would not: only a stage's own gaps count).
    args.update(stage=2, hold_started_at=clock.format_timestamp(utc(seconds_ago=7200)))
    result = run_ansible_module(args, tmp_path)
    assert (result["verdict"], result["decision"]) == ("pass", "complete")
    assert result["hold_remaining_s"] == 0
    assert json.loads(state_file.read_text())["evaluations"] == 1


def test_check_mode_through_ansible_evaluates_but_writes_nothing(exposition, prometheus, tmp_path):
    metrics, _port = exposition
    metrics.set_gauge("zl_test_latency_seconds", 0.002, node="a")
    metrics.set_gauge("zl_test_latency_seconds", 0.003, node="b")
    wait_for_value(prometheus, "max(zl_test_latency_seconds)", 0.003)
    state_file = tmp_path / "gates.json"
    args = {
        "prometheus_url": prometheus.url,
        "gates": [LATENCY_GATE],
        "state_file": str(state_file),
    }
    result = run_ansible_module(args, tmp_path, check=True)
    assert result["verdict"] == "pass"
    assert not state_file.exists()


def test_stopped_prometheus_holds_through_ansible_never_fails(exposition, tmp_path):
    _metrics, port = exposition
    stopped = PrometheusServer(port)
    try:
        stopped.start()
        url = stopped.url
        stopped.stop()
        result = run_ansible_module(
            {
                "prometheus_url": url,
                "gates": [LATENCY_GATE, dict(LATENCY_GATE, name="other")],
                "state_file": str(tmp_path / "gates.json"),
                "consecutive_failure_limit": 1,
            },
            tmp_path,
        )
    finally:
        stopped.cleanup()
    assert result.get("failed") is not True, result
    assert (result["verdict"], result["decision"]) == ("hold", "continue")
    assert {gate["verdict"] for gate in result["gates"]} == {"hold"}
    assert "Connection refused" in result["reason"]


def test_bad_gate_definition_through_ansible_fails_naming_the_field(prometheus, tmp_path):
    state_file = tmp_path / "gates.json"
    result = run_ansible_module(
        {
            "prometheus_url": prometheus.url,
            "state_file": str(state_file),
            "gates": [dict(LATENCY_GATE, threshold="fast")],
        },
        tmp_path,
    )
    assert result["failed"] is True
    assert result["field"] == "gates[0].threshold"
    assert not state_file.exists()


# ---------------------------------------------------------------- cases through module_utils


def stage_decisions(prometheus_url, definitions, rounds, limits, wait=None):
    """Evaluate `rounds` times against Prometheus, recording each in one stage history."""
    history = g.new_history("it", 0)
    outcomes = []
    start = utc(seconds_ago=60)
    for _round in range(rounds):
        if wait is not None:
            wait()
        evaluation = evaluate(prometheus_url, definitions)
        history, outcome = g.record_evaluation(
            history, evaluation["verdict"], utc(), 3600, start, limits
        )
        outcome["gates"] = evaluation["gates"]
        outcomes.append(outcome)
    return outcomes


def test_failing_gate_fails_and_rolls_back_after_consecutive_failures(exposition, prometheus):
    metrics, _port = exposition
    metrics.set_gauge("zl_test_latency_seconds", 0.002, node="a")
    metrics.set_gauge("zl_test_latency_seconds", 0.020, node="b")
    wait_for_value(prometheus, 'zl_test_latency_seconds{node="b"}', 0.020)
    limits = g.Limits(
        consecutive_failure_limit=3, failure_limit=10, max_holds=10, max_hold_extension_s=600
    )
    outcomes = stage_decisions(prometheus.url, [LATENCY_GATE], 3, limits)
    assert [o["verdict"] for o in outcomes] == ["fail", "fail", "fail"]
    assert [o["decision"] for o in outcomes] == ["continue", "continue", "rollback"]
    assert outcomes[-1]["gates"][0]["worst_series"] == {"node": "b"}
    assert outcomes[-1]["gates"][0]["value"] == 0.020


def test_metric_that_does_not_exist_holds(prometheus):
    evaluation = evaluate(prometheus.url, [dict(LATENCY_GATE, query="zl_test_never_exported")])
    assert evaluation["verdict"] == "hold"
    assert evaluation["gates"][0]["reason"] == "no data"


def test_no_data_passes_when_not_required(prometheus):
    definition = dict(LATENCY_GATE, query="zl_test_never_exported", require_data=False)
    evaluation = evaluate(prometheus.url, [definition])
    assert evaluation["verdict"] == "pass"
    assert evaluation["gates"][0]["reason"] == "no data, not required"


def test_nan_from_prometheus_holds(exposition, prometheus):
    metrics, _port = exposition
    metrics.set_gauge("zl_test_ratio", float("nan"))
    wait_for_nan(prometheus, "zl_test_ratio")
    evaluation = evaluate(prometheus.url, [dict(LATENCY_GATE, query="zl_test_ratio")])
    assert evaluation["verdict"] == "hold"
    assert "NaN" in evaluation["gates"][0]["reason"]


def test_too_few_samples_holds_then_enough_samples_decide(exposition, prometheus):
    metrics, _port = exposition
    metrics.set_gauge("zl_test_latency_seconds", 0.020, node="a")
    metrics.set_gauge("zl_test_requests", 12)
    wait_for_value(prometheus, "zl_test_requests", 12)
    wait_for_value(prometheus, 'zl_test_latency_seconds{node="a"}', 0.020)
    definition = dict(
        LATENCY_GATE,
        query='zl_test_latency_seconds{node="a"}',
        min_samples_query="sum(zl_test_requests)",
        min_samples=100,
    )
    evaluation = evaluate(prometheus.url, [definition])
    assert evaluation["verdict"] == "hold"
    assert evaluation["gates"][0]["reason"] == "too few samples: 12 < 100"
    metrics.set_gauge("zl_test_requests", 500)
    wait_for_value(prometheus, "zl_test_requests", 500)
    evaluation = evaluate(prometheus.url, [definition])
    assert evaluation["verdict"] == "fail"


def test_inconclusive_beyond_max_holds_pauses(prometheus):
    limits = g.Limits(
        consecutive_failure_limit=3, failure_limit=5, max_holds=2, max_hold_extension_s=3600
    )
    definition = dict(LATENCY_GATE, query="zl_test_never_exported")
    outcomes = stage_decisions(prometheus.url, [definition], 4, limits)
    assert [o["verdict"] for o in outcomes] == ["hold"] * 4
    assert [o["decision"] for o in outcomes] == ["continue", "continue", "pause", "pause"]
    assert "a person must decide" in outcomes[2]["decision_reason"]


def test_server_that_never_answers_times_out_into_hold():
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        evaluation = evaluate(url, [LATENCY_GATE, dict(LATENCY_GATE, name="other")], timeout=1)
    assert evaluation["verdict"] == "hold"
    assert [gate["error_kind"] for gate in evaluation["gates"]] == ["timeout", "timeout"]


def test_promql_error_holds_with_prometheus_message(prometheus):
    evaluation = evaluate(prometheus.url, [dict(LATENCY_GATE, query="sum(")])
    assert evaluation["verdict"] == "hold"
    assert evaluation["gates"][0]["error_kind"] == "query"
    assert "bad_data" in evaluation["gates"][0]["reason"]


# ---------------------------------------------------------------- the default gates


def default_gates():
    """The default gates (roles/rollout_settings/defaults/main/gates.yml) rendered as Ansible
    would, selecting this test's job."""
    data = yaml.safe_load(
        (REPO / "roles" / "rollout_settings" / "defaults" / "main" / "gates.yml").read_text()
    )
    context = dict(data)
    selector = 'job="%s"' % JOB
    context.update(
        {
            "canary_gates_router_selector": selector,
            "canary_gates_engine_selector": selector,
            "canary_gates_gpu_selector": selector,
        }
    )
    environment = NativeEnvironment()
    rendered = []
    for gate in data["canary_gates_default"]:
        rendered.append(
            {
                key: environment.from_string(value).render(context)
                if isinstance(value, str) and ("{{" in value or "{%" in value)
                else value
                for key, value in gate.items()
            }
        )
    return rendered


ROUTE_BUCKETS = ("1.024e-06", "2.048e-06", "4.096e-06", "8.192e-06", "+Inf")
TTFT_BUCKETS = ("0.1", "0.25", "0.5", "1.0", "+Inf")
GPU_MIB = 4000


def serve_fleet(metrics, route_bucket, gpu_used_mib, direct_ttft_bucket):
    """Counters that grow each scrape: decisions in one bucket, requests, first tokens (the
    simulator's `path` label, which the gates add up); the GPU memory in use, from DCGM."""
    for index, bound in enumerate(ROUTE_BUCKETS):
        step = 300 if index >= ROUTE_BUCKETS.index(route_bucket) else 0
        metrics.set_counter_step("zerolayer_route_decision_duration_seconds_bucket", step, le=bound)
    metrics.set_counter_step("zerolayer_route_decision_duration_seconds_count", 300)
    metrics.set_counter_step(
        "http_requests_total", 1000, handler="/v1/chat/completions", status="2xx"
    )
    metrics.set_counter_step("http_requests_total", 0, handler="/v1/chat/completions", status="5xx")
    metrics.set_counter_step("http_requests_total", 5, handler="/metrics", status="2xx")
    for path, bucket in (("direct", direct_ttft_bucket), ("proxy", "0.25")):
        for index, bound in enumerate(TTFT_BUCKETS):
            step = 50 if index >= TTFT_BUCKETS.index(bucket) else 0
            metrics.set_counter_step(
                "vllm:time_to_first_token_seconds_bucket", step, le=bound, path=path
            )
        metrics.set_counter_step("vllm:time_to_first_token_seconds_count", 50, path=path)
    metrics.set_gauge("DCGM_FI_DEV_FB_USED", gpu_used_mib, gpu="0")
    metrics.set_gauge("DCGM_FI_DEV_FB_FREE", GPU_MIB - gpu_used_mib, gpu="0")


def wait_for_verdict(prometheus_url, definitions, hold_started_at, wanted):
    """Evaluate until the verdict is no longer `hold` (windows filling); return that evaluation."""
    seen = {}

    def decided():
        seen["evaluation"] = evaluate(prometheus_url, definitions, hold_started_at)
        return seen["evaluation"]["verdict"] in wanted

    wait_for(decided, "a verdict in %s" % (wanted,))
    return seen["evaluation"]


def test_default_gates_pass_a_healthy_fleet_and_catch_regressions(exposition, prometheus):
    # No stage nodes given: every node is the stage's, so the first-token gate compares the
    # fleet with itself before the stage began.
    metrics, _port = exposition
    serve_fleet(metrics, route_bucket="2.048e-06", gpu_used_mib=1000, direct_ttft_bucket="0.25")
    wait_for_value(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="0"}', 1000)
    wait_for(
        lambda: bool(prometheus.query("count_over_time(DCGM_FI_DEV_FB_USED[1m]) >= 12")),
        "10 s of history before the stage",
        prometheus,
    )
    hold_started_at = utc()
    definitions = default_gates()

    healthy = wait_for_verdict(prometheus.url, definitions, hold_started_at, ("pass", "fail"))
    verdicts = {gate["name"]: (gate["verdict"], gate["reason"]) for gate in healthy["gates"]}
    assert healthy["verdict"] == "pass", verdicts
    by_name = {gate["name"]: gate for gate in healthy["gates"]}
    assert 1.024e-06 < by_name["route_decision_p99"]["value"] <= 2.048e-06
    assert by_name["success_rate"]["value"] == 1.0
    assert by_name["gpu_memory_spike"]["value"] == 0.0
    assert by_name["ttft_p99_ratio"]["value"] == pytest.approx(1.0)

    # Regressions: slow route decisions, a quarter of the GPU memory more in use and a slow
    # direct path.
    serve_fleet(metrics, route_bucket="8.192e-06", gpu_used_mib=1500, direct_ttft_bucket="1.0")
    wait_for_value(prometheus, 'DCGM_FI_DEV_FB_USED{gpu="0"}', 1500)

    def all_fail():
        evaluation = evaluate(prometheus.url, definitions, hold_started_at)
        failing = {gate["name"] for gate in evaluation["gates"] if gate["verdict"] == "fail"}
        return failing == {"route_decision_p99", "gpu_memory_spike", "ttft_p99_ratio"}

    wait_for(all_fail, "the three regressed gates to fail", prometheus)
    evaluation = evaluate(prometheus.url, definitions, hold_started_at)
    assert evaluation["verdict"] == "fail"
    by_name = {gate["name"]: gate for gate in evaluation["gates"]}
    assert by_name["success_rate"]["verdict"] == "pass"
    assert by_name["gpu_memory_spike"]["value"] == pytest.approx(0.125)


def test_default_gpu_gate_without_dcgm_reads_vllm_kv_cache_and_holds_without_either(
    exposition, prometheus
):
    metrics, _port = exposition
    metrics.remove("DCGM_FI_DEV_FB_USED")
    metrics.remove("DCGM_FI_DEV_FB_FREE")
    metrics.set_gauge("vllm:kv_cache_usage_perc", 0.2, model_name="m")
    wait_for(
        lambda: not prometheus.query("DCGM_FI_DEV_FB_USED"), "DCGM series to go stale", prometheus
    )
    wait_for_value(prometheus, "vllm:kv_cache_usage_perc", 0.2)
    wait_for(
        lambda: bool(prometheus.query("count_over_time(vllm:kv_cache_usage_perc[1m]) >= 3")),
        "KV-cache history before the stage",
        prometheus,
    )
    hold_started_at = utc()
    (memory,) = [gate for gate in default_gates() if gate["name"] == "gpu_memory_spike"]
    metrics.set_gauge("vllm:kv_cache_usage_perc", 0.5, model_name="m")
    wait_for_value(prometheus, "vllm:kv_cache_usage_perc", 0.5)
    failed = wait_for_verdict(prometheus.url, [memory], hold_started_at, ("fail",))
    assert failed["gates"][0]["value"] == pytest.approx(0.3)

    metrics.remove("vllm:kv_cache_usage_perc")
    wait_for(
        lambda: not prometheus.query("vllm:kv_cache_usage_perc"),
        "KV-cache series to go stale",
        prometheus,
    )
    assert evaluate(prometheus.url, [memory], utc())["verdict"] == "hold"
