"""engine_upgrade.yml on the sandbox fleet under load (streams included), weight 50 so both
paths carry traffic: an upgrade that loses no request and converges on a re-run; a new
engine that never answers is stopped and nothing is swapped; a failing gate swaps back.

Runs last on the session's fleet and ends by upgrading back to the inventory's engine
(chat on 8101), which is one more upgrade under load.
"""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

FAILING_GATE = [
    {
        "name": "injected_failure",
        "query": "vector(1)",
        "comparison": "<",
        "threshold": 0,
    }
]


ENGINES_VARS = (
    Path(__file__).resolve().parents[2] / "inventories/sandbox/group_vars/gpu_nodes/engines.yml"
)


@pytest.fixture(scope="module")
def chat_b_inventory(tmp_path_factory):
    """The sandbox inventory as an operator leaves it after upgrading chat to chat_b: an
    inventory source layered over the sandbox's, whose group_vars win."""
    engines = yaml.safe_load(ENGINES_VARS.read_text())
    chat = next(e for e in engines["model_engine_services"] if e["name"] == "chat")
    chat_b = copy.deepcopy(chat) | {"name": "chat_b", "listen_port": 8102}
    overlay = {
        "model_engine_services": [chat_b],
        "legacy_proxy_routes": [{"name": "chat", "listen_port": 8000, "engine_ports": [8102]}],
        "ebpf_router_routes": [
            {
                "name": "chat",
                "port": 8000,
                "engines": [{"slot": 0, "unit": "zerolayer-engine-chat_b.service", "port": 8102}],
            }
        ],
    }
    directory = tmp_path_factory.mktemp("chat-b-inventory")
    (directory / "group_vars").mkdir()
    (directory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(overlay))
    hosts = directory / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {}}}}))
    return hosts


def answering_engine(fleet, node):
    """Which engine answers a new connection to the node's service port (from the node)."""
    headers = fleet.service_headers(node)
    match = re.search(r"^X-Zerolayer-Engine-Name: (\S+)", headers, re.M | re.I)
    return match.group(1) if match else None


def slot_cookie(fleet, node):
    route = next(r for r in fleet.show(node)["routes"] if r["name"] == fleet.route["name"])
    return route["slots"].get("0")


def active(fleet, node, engine):
    unit = "zerolayer-engine-%s.service" % engine
    return fleet.exec(node, "systemctl", "is-active", unit, check=False).stdout.strip()


def recap_changed(output):
    recap = output.split("PLAY RECAP", 1)[-1]
    return {
        host: int(changed)
        for host, changed in re.findall(r"^(\S+)\s+:\s+ok=\d+\s+changed=(\d+)", recap, re.M)
    }


@pytest.fixture(scope="module")
def weight_50(fleet):
    fleet.set_weight(50)
    yield
    fleet.set_weight(0, check=False)


def test_upgrade_under_load_loses_no_request_and_converges(fleet, weight_50, load, tmp_path):
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    report_path = tmp_path / "upgrade.json"
    # The same load for 20 s before the upgrade: the latency to compare with.
    baseline = load("before-upgrade")
    time.sleep(20)
    quiet = baseline.stop()
    client = load("upgrade")
    try:
        run = fleet.engine_upgrade(
            "chat",
            {"name": "chat_b", "listen_port": 8102},
            "-e",
            "engine_upgrade_report_path=%s" % report_path,
        )
        assert run.returncode == 0, run.stdout[-8000:]
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["streams_completed"] > 0
    assert set(summary["paths"]) == {"direct", "proxy"}
    for node in fleet.nodes:
        assert slot_cookie(fleet, node) not in (None, before[node]), node
        assert answering_engine(fleet, node) == "chat_b", node
        assert active(fleet, node, "chat_b") == "active", node
        assert active(fleet, node, "chat") == "inactive", node
    nodes = json.loads(report_path.read_text())["nodes"]
    assert {node: nodes[node]["outcome"] for node in fleet.nodes} == dict.fromkeys(
        fleet.nodes, "upgraded"
    )
    timed = nodes.items()
    print(
        "upgrade chat -> chat_b: %d requests (%d streams), 0 failed, p99 during %s s, before %s s;"
        " per node (ready_s, swap_s, total_s, drained) %s"
        % (
            summary["requests_ok"],
            summary["streams_completed"],
            {path: data["latency_p99_s"] for path, data in summary["paths"].items()},
            {path: data["latency_p99_s"] for path, data in quiet["paths"].items()},
            {node: (n["ready_s"], n["swap_s"], n["total_s"], n["drained"]) for node, n in timed},
        )
    )

    again_path = tmp_path / "again.json"
    again = fleet.engine_upgrade(
        "chat",
        {"name": "chat_b", "listen_port": 8102},
        "-e",
        "engine_upgrade_report_path=%s" % again_path,
    )
    assert again.returncode == 0, again.stdout[-6000:]
    again_nodes = json.loads(again_path.read_text())["nodes"].items()
    outcomes = {node: n["outcome"] for node, n in again_nodes}
    assert outcomes == dict.fromkeys(fleet.nodes, "already upgraded")
    # The one change is the report file written on the controller.
    assert sum(recap_changed(again.stdout).values()) == 1, again.stdout[-4000:]


def test_a_new_engine_that_never_answers_is_stopped_and_nothing_is_swapped(
    fleet, weight_50, load, chat_b_inventory
):
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    client = load("never-ready")
    try:
        run = fleet.engine_upgrade(
            "chat_b",
            # Every completion fails: the engine listens but is never ready.
            {"name": "chat_c", "listen_port": 8103, "simulator": {"error_rate": 1.0}},
            "-e",
            "engine_upgrade_ready_timeout=6",
            "-e",
            "engine_upgrade_ready_poll=2",
            inventories=[chat_b_inventory],
        )
    finally:
        summary = client.stop()
    assert run.returncode != 0
    assert "Nothing was swapped" in run.stdout, run.stdout[-4000:]
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    for node in fleet.nodes:
        assert slot_cookie(fleet, node) == before[node], node
        assert answering_engine(fleet, node) == "chat_b", node
        assert active(fleet, node, "chat_c") != "active", node


def test_a_failing_gate_swaps_back_to_the_old_engine(fleet, weight_50, load, chat_b_inventory):
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    client = load("swap-back")
    try:
        run = fleet.engine_upgrade(
            "chat_b",
            {"name": "chat_c", "listen_port": 8103},
            "-e",
            "engine_upgrade_gate_checks=2",
            "-e",
            json.dumps({"canary_gates": FAILING_GATE}),
            "-e",
            "canary_consecutive_failure_limit=1",
            "-e",
            "canary_gate_interval=1",
            inventories=[chat_b_inventory],
        )
    finally:
        summary = client.stop()
    assert run.returncode != 0
    assert "swapped back" in run.stdout or "is back on chat_b" in run.stdout, run.stdout[-4000:]
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    for node in fleet.nodes:
        # The old engine's socket is back in the slot: the same socket, it never stopped.
        assert slot_cookie(fleet, node) == before[node], node
        assert answering_engine(fleet, node) == "chat_b", node
        assert active(fleet, node, "chat_c") != "active", node
        assert active(fleet, node, "chat_b") == "active", node


def test_upgrade_back_to_the_inventory_engine(fleet, weight_50, load, chat_b_inventory):
    client = load("upgrade-back")
    try:
        run = fleet.engine_upgrade(
            "chat_b", {"name": "chat", "listen_port": 8101}, inventories=[chat_b_inventory]
        )
        assert run.returncode == 0, run.stdout[-8000:]
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    for node in fleet.nodes:
        assert answering_engine(fleet, node) == "chat", node
        assert active(fleet, node, "chat_b") == "inactive", node
