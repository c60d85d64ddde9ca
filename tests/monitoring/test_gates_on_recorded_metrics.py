"""The default canary gates (roles/rollout_settings/defaults/main/gates.yml) on what stock
engines export.

A real Prometheus holds small fleets built from the recorded /metrics fixtures (see
recorded_fleet.py): vLLM alone, Triton alone (with and without its first-response
histogram), vLLM beside DCGM's exporter, and fleets whose stage node gets worse once the
stage began. The gates are rendered as Ansible renders them, with the shipped thresholds
and sample floors, and judged by module_utils/rollout/gates.py exactly as canary_gate judges them.
"""

import datetime
import math

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import gates as g
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry.prometheus_api import (
    parse_query_response,
)
from recorded_fleet import FLEETS, WINDOW, default_gates

HEALTHY = ("vllm", "triton", "triton-histograms", "vllm-dcgm")
GATE_NAMES = ("route_decision_p99", "success_rate", "gpu_memory_spike", "ttft_p99_ratio")
STAGE_NODE = object()  # stage_nodes: the fleet's first node, as a wave of one


def utc(seconds):
    return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)


def placeholders(prometheus, fleet, stage_nodes=STAGE_NODE):
    nodes = [fleet.stage_node] if stage_nodes is STAGE_NODE else stage_nodes
    return g.placeholder_values(
        utc(prometheus.stage_start), utc(prometheus.end), WINDOW, stage_nodes=nodes
    )


def evaluate(prometheus, fleet, stage_nodes=STAGE_NODE, names=GATE_NAMES, **variables):
    """One evaluation of the gates of `fleet` at END (the default ones unless `variables`
    switch an optional one on, then `names`): {gate name: result}."""
    definitions = default_gates(**fleet.selectors(), **variables)
    assert tuple(gate["name"] for gate in definitions) == names
    evaluation = g.evaluate_gates(
        g.validate_gates(definitions),
        lambda promql: parse_query_response(prometheus.api(promql)),
        placeholders(prometheus, fleet, stage_nodes),
    )
    return {result["name"]: result for result in evaluation["gates"]}


def series(prometheus, fleet, gate_name, key, stage_nodes=STAGE_NODE):
    """Every series of one gate's query (key `query`) or min-samples query, rendered."""
    (gate,) = [gate for gate in default_gates(**fleet.selectors()) if gate["name"] == gate_name]
    promql = g.render_query(gate[key], placeholders(prometheus, fleet, stage_nodes))
    return prometheus.query(promql)


def verdicts(results):
    return {name: (result["verdict"], result["reason"]) for name, result in results.items()}


@pytest.mark.parametrize("fleet_name", HEALTHY)
def test_every_gate_decides_pass_on_a_healthy_stock_fleet(recorded_prometheus, fleet_name):
    fleet = FLEETS[fleet_name]
    results = evaluate(recorded_prometheus, fleet)
    assert {name: result["verdict"] for name, result in results.items()} == dict.fromkeys(
        GATE_NAMES, "pass"
    ), verdicts(results)
    for name, result in results.items():
        # Decided on data, not passed for the want of it: every gate has data and samples
        # enough with the shipped floors (canary_gates_min_samples_scale 1).
        assert result["series"] >= 1, (name, result["reason"])
        assert result["samples"] >= result["min_samples"] > 0, (name, result["samples"])
        for key in ("query", "min_samples_query"):
            found = series(recorded_prometheus, fleet, name, key)
            assert found, (name, key)
            assert all(math.isfinite(float(item["value"][1])) for item in found), (name, found)


def source_labels(prometheus, fleet, gate_name):
    return [item["metric"] for item in series(prometheus, fleet, gate_name, "query")]


def test_vllm_alone_gives_first_token_and_kv_cache(recorded_prometheus):
    fleet = FLEETS["vllm"]
    assert source_labels(recorded_prometheus, fleet, "ttft_p99_ratio") == [{"source": "vllm"}]
    # vLLM's KV-cache usage, one series for the stage's node (no DCGM, no Triton here).
    assert source_labels(recorded_prometheus, fleet, "gpu_memory_spike") == [
        {"node": fleet.stage_node}
    ]


def test_triton_alone_gives_its_request_time_and_gpu_memory(recorded_prometheus):
    fleet = FLEETS["triton"]
    assert source_labels(recorded_prometheus, fleet, "ttft_p99_ratio") == [{"source": "triton"}]
    memory = source_labels(recorded_prometheus, fleet, "gpu_memory_spike")
    assert {labels["gpu_uuid"] for labels in memory} == {
        "GPU-3f9a1c52-8e0b-4d27-b6a4-1c0e5d7f9a21",
        "GPU-b27d4e90-51c3-4f8a-9e12-7a6d3c0b4e85",
    }
    assert {labels["node"] for labels in memory} == {fleet.stage_node}


def test_dcgm_is_the_gpu_memory_source_where_it_is_there(recorded_prometheus):
    fleet = FLEETS["vllm-dcgm"]
    memory = source_labels(recorded_prometheus, fleet, "gpu_memory_spike")
    assert {(labels["gpu"], labels["node"]) for labels in memory} == {
        ("0", fleet.stage_node),
        ("1", fleet.stage_node),
    }
    assert all("UUID" in labels for labels in memory)
    # The stage node's KV cache went from 0 to 45% at the stage start: vLLM's own figure
    # would fail the gate, DCGM's (flat) passes it, and DCGM is the one used.
    result = evaluate(recorded_prometheus, fleet)["gpu_memory_spike"]
    assert result["verdict"] == "pass"
    assert result["value"] == 0


@pytest.mark.parametrize(
    ("fleet_name", "failing", "worst"),
    [
        # Slower to the first token, 5xx answers, the KV cache filling up.
        (
            "vllm-worse",
            {"ttft_p99_ratio", "success_rate", "gpu_memory_spike"},
            {"ttft_p99_ratio": {"source": "vllm"}},
        ),
        # Twice the request time, failed requests, GPUs 16 points fuller.
        (
            "triton-worse",
            {"ttft_p99_ratio", "success_rate", "gpu_memory_spike"},
            {"ttft_p99_ratio": {"source": "triton"}},
        ),
        # Only the first response got slower: the histogram, when there, is what is judged.
        ("triton-histograms-worse", {"ttft_p99_ratio"}, {"ttft_p99_ratio": {"source": "triton"}}),
        # The frame buffer 18 points fuller, as DCGM sees it.
        ("vllm-dcgm-worse", {"gpu_memory_spike"}, {}),
    ],
)
def test_a_stage_node_that_got_worse_fails_its_gates(
    recorded_prometheus, fleet_name, failing, worst
):
    fleet = FLEETS[fleet_name]
    results = evaluate(recorded_prometheus, fleet)
    assert {name for name, result in results.items() if result["verdict"] == "fail"} == failing, (
        verdicts(results)
    )
    assert {name for name, result in results.items() if result["verdict"] == "pass"} == (
        set(GATE_NAMES) - failing
    ), verdicts(results)
    for name, labels in worst.items():
        assert results[name]["worst_series"] == labels
    if "gpu_memory_spike" in failing:
        assert results["gpu_memory_spike"]["worst_series"]["node"] == fleet.stage_node
        assert results["gpu_memory_spike"]["value"] > 0.10


@pytest.mark.parametrize(
    "stage_nodes",
    [pytest.param("both", id="last-wave-at-100-percent"), pytest.param(None, id="nodes-unknown")],
)
@pytest.mark.parametrize(("fleet_name", "verdict"), [("vllm", "pass"), ("vllm-worse", "fail")])
def test_without_other_nodes_the_baseline_is_the_stage_nodes_before_the_stage(
    recorded_prometheus, stage_nodes, fleet_name, verdict
):
    # Every node of the fleet is the stage's (a one-wave rollout, the last wave's 100%
    # stage), or the caller did not say which: no node is left to compare with, so the
    # stage's nodes are compared with themselves in the window before the stage began.
    fleet = FLEETS[fleet_name]
    nodes = fleet.nodes if stage_nodes == "both" else None
    samples = series(recorded_prometheus, fleet, "ttft_p99_ratio", "min_samples_query", nodes)
    assert {item["metric"]["side"] for item in samples} == {"canary", "baseline"}
    result = evaluate(recorded_prometheus, fleet, stage_nodes=nodes)["ttft_p99_ratio"]
    assert result["verdict"] == verdict, result["reason"]
    if verdict == "pass":
        assert result["value"] == pytest.approx(1.0)


def test_too_few_requests_hold_instead_of_deciding(recorded_prometheus):
    # Floors 100 times the shipped ones: more requests than the fleet serves in a window.
    results = evaluate(recorded_prometheus, FLEETS["vllm"], canary_gates_min_samples_scale=100)
    for name in ("route_decision_p99", "success_rate", "ttft_p99_ratio"):
        assert results[name]["verdict"] == "hold", results[name]["reason"]
        assert results[name]["reason"].startswith("too few samples"), results[name]["reason"]


def test_stage_nodes_are_matched_literally(recorded_prometheus):
    # "vllm.1.test" names no node; unescaped, its dots would match the '-' of vllm-1.test.
    fleet = FLEETS["vllm"]
    assert not series(recorded_prometheus, fleet, "ttft_p99_ratio", "query", ["vllm.1.test"])
    result = evaluate(recorded_prometheus, fleet, stage_nodes=["vllm.1.test"])
    assert result["ttft_p99_ratio"]["verdict"] == "hold"
    assert result["gpu_memory_spike"]["verdict"] == "hold"


# ---------------------------------------------------------------- the optional gates

WITH_MEMORY = (*GATE_NAMES, "engine_memory_pressure")


@pytest.mark.parametrize(
    ("fleet_name", "verdict", "value"),
    [
        # Every engine's slice stalls 1% of the time.
        ("vllm", "pass", 0.01),
        # The stage node's stalls 80% of the time since the stage began; the window (5m)
        # lies wholly after the stage start.
        ("vllm-worse", "fail", 0.8),
    ],
)
def test_engine_memory_pressure_judges_the_stage_nodes_engines(
    recorded_prometheus, fleet_name, verdict, value
):
    fleet = FLEETS[fleet_name]
    results = evaluate(
        recorded_prometheus,
        fleet,
        names=WITH_MEMORY,
        canary_gates_engine_memory_pressure_enabled="true",
    )
    result = results["engine_memory_pressure"]
    assert result["verdict"] == verdict, result["reason"]
    assert result["value"] == pytest.approx(value)
    # One series, the stage node's engine: the other node's pressure is not the stage's.
    assert result["series"] == 1
    assert result["worst_series"] == {
        "instance": f"{fleet.stage_node}:9464",
        "node": fleet.stage_node,
        "engine": "chat",
    }
    assert result["samples"] >= result["min_samples"] == 2


def test_engine_memory_pressure_is_off_unless_switched_on():
    names = [
        gate["name"] for gate in default_gates(canary_gates_engine_memory_pressure_enabled=False)
    ]
    assert names == list(GATE_NAMES)


def test_engine_memory_pressure_holds_where_the_nodes_export_none(recorded_prometheus):
    # A node without PSI (or an exporter older than the gate) exports no pressure: the gate
    # holds for want of data instead of passing blind.
    fleet = FLEETS["vllm"]
    result = evaluate(
        recorded_prometheus,
        fleet,
        stage_nodes=["no-such-node.test"],
        names=WITH_MEMORY,
        canary_gates_engine_memory_pressure_enabled=True,
    )["engine_memory_pressure"]
    assert result["verdict"] == "hold"
    assert result["reason"].startswith("too few samples: 0"), result["reason"]
