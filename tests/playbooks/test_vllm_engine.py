"""A real vLLM behind the router: vLLM's CPU build serving a tiny model on one sandbox node,
installed by the model_engine role like any engine, called with the official OpenAI SDK.

The runtime is scripts/vllm-cpu-runtime's (built once per recipe hash by scripts/setup,
mounted read-only into the nodes by scripts/sandbox); the model is made on the spot by
tests/sandbox/vllm-cpu/make_tiny_model.py (random weights: no model hub is reachable), and
vLLM loads it from its path as it would any Hugging Face model. Nothing here is a double.

In module order, on the first GPU node (the others keep the simulator):
  site.yml turns engine `chat` into vLLM (CPU profile, the installed vLLM's parser checks
  its flags), the unit runs `python -m vllm...api_server` and the router registers its socket;
  the SDK at weight 0, 20 and 100 on the service port: every call answers, streams complete;
  paths outside the API answer 404 on the engine's port and through the router, /v1 wants a key;
  a tokenizer that does not load fails the role, naming the engine, and the engine keeps serving;
  site.yml puts the simulator back (module teardown).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "tests" / "sandbox" / "vllm-cpu"
SDK_CLIENT = Path(__file__).resolve().parent / "openai_sdk_client.py"
RUNTIME_ON_NODE = "/var/cache/zerolayer/vllm-cpu"
PYTHON_ON_NODE = RUNTIME_ON_NODE + "/venv/bin/python"
MODEL_DIR = RUNTIME_ON_NODE + "/models/tiny-llama"
MODEL = "zerolayer/tiny-llama"
UNIT = "zerolayer-engine-chat.service"
ENGINE_PORT = 8101
SERVICE_PORT = 8000
WORK_ON_NODE = "/run/zerolayer-vllm-test"
SDK_CALLS = 40


def vllm_version():
    requirement = (RECIPE / "requirements.txt").read_text()
    return re.search(r"^vllm-cpu==(\S+)$", requirement, re.M).group(1)


def vllm_entry(**changes):
    entry = {
        "name": "chat",
        "model": MODEL,
        "hardware_profile": {"gpu": None, "memory": "4G", "cpu": "200%"},
        "inference_engine": {"kind": "vllm", "version": vllm_version(), "precision": "fp32"},
        "resource_limits": {
            "max_concurrent_requests": 4,
            "max_input_tokens": 384,
            "max_output_tokens": 128,
        },
        "listen_port": ENGINE_PORT,
        "route": "chat",
        "slot": 0,
        "cpu_kv_cache_gib": 1,
        "model_source": {"kind": "local", "path": MODEL_DIR},
    }
    entry.update(changes)
    return entry


def overlay(directory, node, entry):
    """An inventory source that gives `node` the engine `entry` instead of the simulator."""
    directory.mkdir(parents=True, exist_ok=True)
    hosts = directory / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"all": {"hosts": {node: {"model_engine_services": [entry]}}}}))
    return hosts


def unit_props(fleet, node, *names):
    result = fleet.exec(node, "systemctl", "show", "--property=" + ",".join(names), UNIT)
    shown = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {name: shown.get(name, "") for name in names}


def route_counters(fleet, node):
    route = next(r for r in fleet.show(node)["routes"] if r["name"] == fleet.route["name"])
    return route["counters"], route["slots"].get("0")


def http_status(fleet, node, port, method, path, key=None):
    """The status of one request made on the node (a new connection each time)."""
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", method]
    if key:
        argv += ["-H", "Authorization: Bearer %s" % key]
    if method == "POST":
        argv += ["-H", "Content-Type: application/json", "--data", "{}"]
    argv.append("http://127.0.0.1:%d%s" % (port, path))
    return int(fleet.exec(node, *argv).stdout)


def run_sdk(fleet, node, calls):
    result = fleet.exec(
        node,
        PYTHON_ON_NODE,
        WORK_ON_NODE + "/openai_sdk_client.py",
        "http://127.0.0.1:%d/v1" % SERVICE_PORT,
        WORK_ON_NODE + "/api-key",
        MODEL,
        str(calls),
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def vllm_node(fleet, tmp_path_factory):
    node = fleet.nodes[0]
    built = subprocess.run(
        [str(REPO / "scripts" / "vllm-cpu-runtime"), "path"], capture_output=True, text=True
    )
    marker = Path(built.stdout.strip()) / ".recipe.sha256"
    if not marker.exists():
        pytest.fail("the vLLM CPU runtime is not built: run scripts/setup test")
    mounted = fleet.exec(node, "test", "-x", PYTHON_ON_NODE, check=False)
    assert mounted.returncode == 0, "%s: no %s (scripts/sandbox mounts it)" % (node, PYTHON_ON_NODE)
    inventory = overlay(tmp_path_factory.mktemp("vllm-inventory"), node, vllm_entry())
    started = time.monotonic()
    run = fleet.playbook("site.yml", "--limit", node, inventories=[inventory], timeout=1200)
    print("site.yml with the vLLM engine on %s: %.0f s" % (node, time.monotonic() - started))
    try:
        assert run.returncode == 0, run.stdout[-6000:]
        fleet.exec(node, "mkdir", "-p", WORK_ON_NODE)
        subprocess.run(
            ["podman", "cp", str(SDK_CLIENT), "%s:%s/" % (node, WORK_ON_NODE)],
            env=fleet.env,
            check=True,
        )
        subprocess.run(
            ["podman", "cp", str(fleet.key_file), "%s:%s/api-key" % (node, WORK_ON_NODE)],
            env=fleet.env,
            check=True,
        )
        yield node, inventory
    finally:
        fleet.set_weight(0, check=False)
        fleet.exec(node, "rm", "-rf", WORK_ON_NODE, check=False)
        restored = fleet.playbook("site.yml", "--limit", node, timeout=1200)
        assert restored.returncode == 0, restored.stdout[-6000:]


def test_the_role_runs_vllm_cpu_with_its_real_flags_and_the_router_registers_it(fleet, vllm_node):
    node, _inventory = vllm_node
    unit = unit_props(fleet, node, "ActiveState", "MainPID", "ExecMainStartTimestampMonotonic")
    assert unit["ActiveState"] == "active", unit
    command_line = fleet.exec(node, "cat", "/proc/%s/cmdline" % unit["MainPID"]).stdout.split("\0")
    assert command_line[:3] == [PYTHON_ON_NODE, "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(command_line)
    for expected in (
        "--model %s" % MODEL_DIR,
        "--dtype float32",
        "--enforce-eager",
        "--port %d" % ENGINE_PORT,
        "--max-num-seqs 4",
        "--max-model-len 512",
        "--middleware zerolayer_vllm_paths.ServedPathsOnly",
    ):
        assert expected in flags, (expected, flags)
    assert "--gpu-memory-utilization" not in flags, flags
    environment = fleet.exec(node, "cat", "/proc/%s/environ" % unit["MainPID"]).stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in environment.split("\0")
    # vLLM answers on its own port, and the router's slot holds a socket (its own: the answer
    # through the service port at weight 100 below comes from vLLM).
    models = json.loads(
        fleet.exec(
            node,
            "curl",
            "-sS",
            "-H",
            "Authorization: Bearer %s" % fleet.api_key,
            "http://127.0.0.1:%d/v1/models" % ENGINE_PORT,
        ).stdout
    )
    assert [(m["id"], m["owned_by"]) for m in models["data"]] == [(MODEL, "vllm")]
    _counters, cookie = route_counters(fleet, node)
    assert cookie, fleet.show(node)


@pytest.mark.parametrize("weight", [0, 20, 100])
def test_the_openai_sdk_gets_every_answer_on_both_paths(fleet, vllm_node, weight):
    node, _inventory = vllm_node
    fleet.set_weight(weight)
    before, _cookie = route_counters(fleet, node)
    summary = run_sdk(fleet, node, SDK_CALLS)
    after, _cookie = route_counters(fleet, node)
    assert summary["failed"] == 0, summary["failures"]
    assert summary["models"] == [MODEL]
    plain = [r for r in summary["results"] if not r["stream"]]
    streams = [r for r in summary["results"] if r["stream"]]
    assert len(plain) == len(streams) == SDK_CALLS // 2
    for result in plain:
        assert (result["finish_reason"], result["completion_tokens"]) == ("length", 8), result
    for result in streams:
        # Every token arrived as its own chunk, the last one said why it ended, and the usage
        # chunk closed the stream.
        assert (result["finish_reason"], result["completion_tokens"]) == ("length", 8), result
        assert result["content_chunks"] >= 1, result
    to_engine = after["to_engine"] - before["to_engine"]
    to_proxy = after["to_proxy_by_weight"] - before["to_proxy_by_weight"]
    # One connection per call and one for the model list.
    assert to_engine + to_proxy == SDK_CALLS + 1, (before, after)
    if weight == 0:
        assert to_engine == 0, (before, after)
    elif weight == 100:
        assert to_proxy == 0, (before, after)
    else:
        assert to_engine > 0 and to_proxy > 0, (before, after)


def test_only_the_api_paths_answer_and_they_want_a_key(fleet, vllm_node):
    node, _inventory = vllm_node
    fleet.set_weight(100)
    key = fleet.api_key
    for port in (ENGINE_PORT, SERVICE_PORT):
        where = "engine port" if port == ENGINE_PORT else "service port, direct path"
        assert http_status(fleet, node, port, "GET", "/v1/models") == 401, where
        assert http_status(fleet, node, port, "GET", "/v1/models", key) == 200, where
        # vLLM itself answers these without any key: the allowlist does not.
        for method, path in (
            ("POST", "/invocations"),
            ("POST", "/tokenize"),
            ("GET", "/version"),
            ("GET", "/load"),
            ("GET", "/docs"),
        ):
            assert http_status(fleet, node, port, method, path) == 404, (where, path)
            assert http_status(fleet, node, port, method, path, key) == 404, (where, path)
    # Monitoring reads the engine's own port without a key; the service port does not serve it.
    assert http_status(fleet, node, ENGINE_PORT, "GET", "/metrics") == 200
    assert http_status(fleet, node, SERVICE_PORT, "GET", "/metrics") == 404


def test_a_tokenizer_that_does_not_load_fails_the_role_and_the_engine_keeps_serving(
    fleet, vllm_node, tmp_path
):
    node, _inventory = vllm_node
    broken = WORK_ON_NODE + "/broken-model"
    fleet.exec(node, "cp", "-r", MODEL_DIR, broken)
    fleet.exec(node, "sh", "-c", "echo '{not json' > %s/tokenizer.json" % broken)
    fleet.exec(node, "chmod", "-R", "a+rX", WORK_ON_NODE)
    before = unit_props(fleet, node, "MainPID", "ExecMainStartTimestampMonotonic")
    inventory = overlay(
        tmp_path / "inventory",
        node,
        vllm_entry(model_source={"kind": "local", "path": broken}),
    )
    run = fleet.playbook("site.yml", "--limit", node, inventories=[inventory], timeout=1200)
    assert run.returncode != 0, run.stdout[-3000:]
    said = "engine chat: the tokenizer in %s does not load" % broken
    assert said in run.stdout, run.stdout[-4000:]
    after = unit_props(fleet, node, "ActiveState", "MainPID", "ExecMainStartTimestampMonotonic")
    assert after["ActiveState"] == "active"
    assert (after["MainPID"], after["ExecMainStartTimestampMonotonic"]) == (
        before["MainPID"],
        before["ExecMainStartTimestampMonotonic"],
    )
    assert run_sdk(fleet, node, 2)["failed"] == 0
