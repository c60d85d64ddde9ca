"""engine_upgrade.yml with CUDA MPS instances, on the sandbox fleet under load (weight 50,
streams included), after test_engine_upgrade.py has left chat serving again.

The nodes have no GPU and no NVIDIA driver: a module fixture installs the cuda_mps
scenario's TEST DOUBLES of nvidia-cuda-mps-control and nvidia-smi (two pretend GPUs) on
every node, and removes them afterwards with every MPS instance and engine this module made.
The engine is the CPU engine simulator (kind sim), which joins an MPS instance the way a GPU
engine does (its unit loads the instance's environment and requires its daemon), so the
orchestration runs for real against real systemd.

In module order:
  chat (no MPS)            -> chat_m1, own instance chat_m1 on GPU 0
  chat_m1                  -> chat_m2, own instance chat_m2 on GPU 1; chat_m1's instance stops
  chat_m2 -> chat_m3 refused twice: GPU 1 already taken; one shared instance out of memory
  chat_m2 -> chat_m3, own instance on GPU 0, never ready: chat_m3 and its instance stop
  chat_m2                  -> chat_m3, sharing instance chat_m2 (0.5 + 0.4 of its memory)
  chat_m3                  -> chat (no MPS) again; instance chat_m2 stops
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

REPO = Path(__file__).resolve().parents[2]
DOUBLES = REPO / "molecule" / "cuda_mps" / "doubles"
DOUBLE_TOOLS = ("nvidia-cuda-mps-control", "nvidia-smi")
DOUBLE_LIB = "/usr/local/lib/zerolayer-test-doubles"
DOUBLE_STATE = "/var/lib/zerolayer-test-doubles"
DOUBLE_RECORDS = "/var/log/zerolayer-test-doubles"
MPS_RECORD = DOUBLE_RECORDS + "/nvidia-cuda-mps-control.jsonl"
PRETEND_GPUS = [
    {
        "index": 0,
        "uuid": "GPU-3b6f0c2e-91d4-4a57-8e2c-5f7a1d9b0c31",
        "pci_bus_id": "00000000:17:00.0",
        "compute_mode": "Default",
    },
    {
        "index": 1,
        "uuid": "GPU-a84d27f1-0c6e-4b39-9d15-7e2f8c3a6b54",
        "pci_bus_id": "00000000:65:00.0",
        "compute_mode": "Default",
    },
]
ENGINES = ("chat_m1", "chat_m2", "chat_m3")
MPS_BASE = "/var/lib/zerolayer/mps"
MPS_ENV = "/etc/zerolayer/mps"
ENGINES_VARS = REPO / "inventories/sandbox/group_vars/gpu_nodes/engines.yml"
ACTIVE_STATES = ("active", "activating", "reloading")


def instance(name, gpu):
    return {"name": name, "gpu": gpu, "pinned_mem_limit": "2G", "active_thread_percentage": 50}


def node_run(fleet, node, *argv, stdin=None, check=True):
    """A command on the node, optionally fed stdin (Fleet.exec takes none)."""
    return subprocess.run(
        ["podman", "exec", "-i", node, *argv],
        env=fleet.env,
        input=stdin,
        capture_output=True,
        text=True,
        check=check,
        timeout=120,
    )


def install_doubles(fleet, node):
    for tool in DOUBLE_TOOLS:
        present = fleet.exec(node, "test", "-e", "/usr/bin/" + tool, check=False)
        assert present.returncode != 0, "%s: /usr/bin/%s exists; refusing to replace it" % (
            node,
            tool,
        )
    fleet.exec(node, "mkdir", "-p", DOUBLE_LIB, DOUBLE_STATE)
    for tool in DOUBLE_TOOLS:
        source = (DOUBLES / ("%s-double.py" % tool)).read_text()
        node_run(
            fleet, node, "sh", "-c", "cat > %s/%s-double.py" % (DOUBLE_LIB, tool), stdin=source
        )
        wrapper = (
            "#!/bin/sh\n"
            "# TEST DOUBLE of %s for GPU-less sandbox nodes (zerolayer.fleet playbook tests).\n"
            'exec /usr/bin/python3 %s/%s-double.py "$@"\n' % (tool, DOUBLE_LIB, tool)
        )
        node_run(fleet, node, "sh", "-c", "cat > /usr/bin/%s" % tool, stdin=wrapper)
        fleet.exec(node, "chmod", "0755", "/usr/bin/" + tool)
    state = json.dumps({"gpus": PRETEND_GPUS}) + "\n"
    node_run(fleet, node, "sh", "-c", "cat > %s/nvidia-smi-state.json" % DOUBLE_STATE, stdin=state)


def remove_mps(fleet, node, instances):
    """Stop and remove the MPS `instances`, the cuda_mps role's files and the TEST DOUBLES;
    each step runs whatever failed."""
    mps_units = ["zerolayer-mps@%s.service" % name for name in instances]
    fleet.exec(node, "systemctl", "disable", "--now", *mps_units, check=False)
    paths = [
        "/usr/bin/nvidia-cuda-mps-control",
        "/usr/bin/nvidia-smi",
        DOUBLE_LIB,
        DOUBLE_STATE,
        DOUBLE_RECORDS,
        MPS_BASE,
        MPS_ENV,
        "/etc/systemd/system/zerolayer-mps@.service",
        "/usr/local/libexec/zerolayer/mps-control-send",
        "/usr/local/libexec/zerolayer/mps-exclusive-mode",
        "/usr/local/libexec/zerolayer/mps-pinned-mem-limits",
    ]
    fleet.exec(node, "rm", "-rf", *paths, check=False)
    fleet.exec(node, "systemctl", "daemon-reload", check=False)
    fleet.exec(node, "systemctl", "reset-failed", check=False)


def remove_everything(fleet, node):
    """Stop and remove what this module made on the node; each step runs whatever failed."""
    units = ["zerolayer-engine-%s.service" % name for name in ENGINES]
    fleet.exec(node, "systemctl", "disable", "--now", *units, check=False)
    paths = []
    for name in ENGINES:
        unit = "/etc/systemd/system/zerolayer-engine-%s" % name
        paths += [unit + ".service", unit + ".service.d", unit + ".slice"]
        paths.append("/etc/zerolayer/engines/%s" % name)
    fleet.exec(node, "rm", "-rf", *paths, check=False)
    remove_mps(fleet, node, ENGINES)


@contextlib.contextmanager
def doubles_on_every_node(fleet, remove):
    """The TEST DOUBLES on every node for the block; remove(node) afterwards on each,
    whatever happened."""
    try:
        for node in fleet.nodes:
            install_doubles(fleet, node)
        yield
    finally:
        for node in fleet.nodes:
            remove(node)


@pytest.fixture(scope="module")
def mps_doubles(fleet):
    with doubles_on_every_node(fleet, lambda node: remove_everything(fleet, node)):
        yield


@pytest.fixture(scope="module")
def weight_50(fleet, mps_doubles):
    fleet.set_weight(50)
    yield
    fleet.set_weight(0, check=False)


@pytest.fixture(scope="module")
def inventory_with(tmp_path_factory):
    """An inventory source layered over the sandbox's, as an operator leaves it after an
    upgrade: `engine` is the route's engine, `instances` the node's MPS instances."""

    def write(engine, instances):
        overlay = {
            "model_engine_services": [engine],
            "cuda_mps_instances": instances,
            "legacy_proxy_routes": [
                {"name": "chat", "listen_port": 8000, "engine_ports": [engine["listen_port"]]}
            ],
            "ebpf_router_routes": [
                {
                    "name": "chat",
                    "port": 8000,
                    "engines": [
                        {
                            "slot": 0,
                            "unit": "zerolayer-engine-%s.service" % engine["name"],
                            "port": engine["listen_port"],
                        }
                    ],
                }
            ],
        }
        directory = tmp_path_factory.mktemp("%s-inventory" % engine["name"])
        (directory / "group_vars").mkdir()
        (directory / "group_vars" / "gpu_nodes.yml").write_text(yaml.safe_dump(overlay))
        hosts = directory / "hosts.yml"
        hosts.write_text(yaml.safe_dump({"all": {"children": {"gpu_nodes": {}}}}))
        return hosts

    return write


def chat_entry():
    engines = yaml.safe_load(ENGINES_VARS.read_text())
    return next(e for e in engines["model_engine_services"] if e["name"] == "chat")


def entry(name, port, gpu, mps, **extra):
    """The inventory's chat entry as the upgrades below leave it for engine `name`."""
    merged = chat_entry() | {"name": name, "listen_port": port, "cuda_mps_instance": mps}
    merged["hardware_profile"] = merged["hardware_profile"] | {"gpu": gpu}
    return merged | extra


def own_instance(name, gpu):
    """-e for a new engine with an MPS instance of its own, defined on the command line."""
    return (
        "-e",
        json.dumps(
            {
                "engine_upgrade_mps_instance": {
                    k: v for k, v in instance(name, gpu).items() if k != "name"
                }
            }
        ),
    )


def props(fleet, node, unit, *names):
    """The unit's properties; systemctl show leaves empty ones out, which come back as ""."""
    result = fleet.exec(node, "systemctl", "show", "--property=" + ",".join(names), unit)
    shown = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {name: shown.get(name, "") for name in names}


def state(fleet, node, unit):
    return props(fleet, node, unit, "ActiveState")["ActiveState"]


def engine_unit(name):
    return "zerolayer-engine-%s.service" % name


def mps_unit(name):
    return "zerolayer-mps@%s.service" % name


def answering_engine(fleet, node):
    match = re.search(r"^X-Zerolayer-Engine-Name: (\S+)", fleet.service_headers(node), re.M | re.I)
    return match.group(1) if match else None


def slot_cookie(fleet, node):
    route = next(r for r in fleet.show(node)["routes"] if r["name"] == fleet.route["name"])
    return route["slots"].get("0")


def mps_events(fleet, node, name):
    """What the nvidia-cuda-mps-control TEST DOUBLE recorded for instance `name`."""
    raw = fleet.exec(node, "cat", MPS_RECORD, check=False).stdout
    pipe = "%s/%s/pipe" % (MPS_BASE, name)
    events = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [event for event in events if event.get("pipe_dir") == pipe]


def engine_environment(fleet, node, name):
    pid = props(fleet, node, engine_unit(name), "MainPID")["MainPID"]
    raw = fleet.exec(node, "cat", "/proc/%s/environ" % pid).stdout
    return dict(pair.split("=", 1) for pair in raw.split("\0") if "=" in pair)


def assert_joined(fleet, node, engine, mps):
    """The engine's unit carries its instance, and its daemon ran before the engine started."""
    unit = props(
        fleet,
        node,
        engine_unit(engine),
        "Requires",
        "After",
        "EnvironmentFiles",
        "ActiveState",
        "InactiveExitTimestampMonotonic",
    )
    daemon = props(fleet, node, mps_unit(mps), "ActiveState", "ActiveEnterTimestampMonotonic")
    assert mps_unit(mps) in unit["Requires"].split(), (node, unit)
    assert mps_unit(mps) in unit["After"].split(), (node, unit)
    assert "%s/%s.env" % (MPS_ENV, mps) in unit["EnvironmentFiles"], (node, unit)
    assert (unit["ActiveState"], daemon["ActiveState"]) == ("active", "active"), node
    assert int(daemon["ActiveEnterTimestampMonotonic"]) <= int(
        unit["InactiveExitTimestampMonotonic"]
    ), (node, daemon, unit)
    environment = engine_environment(fleet, node, engine)
    assert environment["CUDA_MPS_PIPE_DIRECTORY"] == "%s/%s/pipe" % (MPS_BASE, mps), node
    assert environment["CUDA_VISIBLE_DEVICES"] == "0", node


def run_under_load(load, name, play):
    client = load(name)
    try:
        run = play()
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    return run, summary


def test_upgrade_gives_the_new_engine_its_own_mps_instance(fleet, weight_50, load, tmp_path):
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    report = tmp_path / "report.json"
    run, summary = run_under_load(
        load,
        "mps-own",
        lambda: fleet.engine_upgrade(
            "chat",
            {
                "name": "chat_m1",
                "listen_port": 8111,
                "cuda_mps_instance": "chat_m1",
                "hardware_profile": {"gpu": 0},
            },
            *own_instance("chat_m1", 0),
            report=report,
        ),
    )
    assert run.returncode == 0, run.stdout[-8000:]
    assert summary["streams_completed"] > 0
    nodes = json.loads(report.read_text())["nodes"]
    for node in fleet.nodes:
        assert nodes[node]["outcome"] == "upgraded", nodes[node]
        assert nodes[node]["mps_instance"] == "chat_m1", nodes[node]
        assert nodes[node]["old_mps_instance"] == "none", nodes[node]
        assert slot_cookie(fleet, node) not in (None, before[node]), node
        assert answering_engine(fleet, node) == "chat_m1", node
        assert state(fleet, node, engine_unit("chat")) == "inactive", node
        assert_joined(fleet, node, "chat_m1", "chat_m1")
        assert props(fleet, node, mps_unit("chat_m1"), "UnitFileState")["UnitFileState"] == (
            "enabled"
        )
        starts = [e for e in mps_events(fleet, node, "chat_m1") if e["event"] == "start"]
        # The daemon of GPU 0, started once.
        assert [e["cuda_visible_devices"] for e in starts] == ["0"], starts


def test_upgrade_to_another_instance_stops_the_old_one_after_the_drain(
    fleet, weight_50, load, inventory_with, tmp_path
):
    inventory = inventory_with(entry("chat_m1", 8111, 0, "chat_m1"), [instance("chat_m1", 0)])
    report = tmp_path / "report.json"
    run, _summary = run_under_load(
        load,
        "mps-move",
        lambda: fleet.engine_upgrade(
            "chat_m1",
            {
                "name": "chat_m2",
                "listen_port": 8112,
                "cuda_mps_instance": "chat_m2",
                "hardware_profile": {"gpu": 1},
            },
            *own_instance("chat_m2", 1),
            inventories=[inventory],
            report=report,
        ),
    )
    assert run.returncode == 0, run.stdout[-8000:]
    nodes = json.loads(report.read_text())["nodes"]
    for node in fleet.nodes:
        assert (nodes[node]["outcome"], nodes[node]["old_mps_instance"]) == ("upgraded", "stopped")
        assert nodes[node]["drained"] in (True, "True"), nodes[node]
        assert answering_engine(fleet, node) == "chat_m2", node
        assert_joined(fleet, node, "chat_m2", "chat_m2")
        old_engine = props(
            fleet, node, engine_unit("chat_m1"), "ActiveState", "InactiveEnterTimestampMonotonic"
        )
        old_daemon = props(
            fleet,
            node,
            mps_unit("chat_m1"),
            "ActiveState",
            "UnitFileState",
            "InactiveEnterTimestampMonotonic",
        )
        assert old_engine["ActiveState"] == "inactive", node
        assert (old_daemon["ActiveState"], old_daemon["UnitFileState"]) == ("inactive", "disabled")
        assert int(old_engine["InactiveEnterTimestampMonotonic"]) <= int(
            old_daemon["InactiveEnterTimestampMonotonic"]
        ), (node, old_engine, old_daemon)
        # Stopped through its control interface ("quit"), not killed.
        events = mps_events(fleet, node, "chat_m1")
        assert (events[-1]["event"], events[-1].get("reason")) == ("exit", "quit"), events
        starts = [e for e in mps_events(fleet, node, "chat_m2") if e["event"] == "start"]
        assert [e["cuda_visible_devices"] for e in starts] == ["1"], starts


def refused(fleet, inventory, to, *extra):
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    run = fleet.engine_upgrade("chat_m2", to, *extra, inventories=[inventory])
    assert run.returncode != 0
    assert "Nothing was changed" in run.stdout, run.stdout[-4000:]
    for node in fleet.nodes:
        assert slot_cookie(fleet, node) == before[node], node
        assert state(fleet, node, engine_unit("chat_m3")) == "inactive", node
        assert state(fleet, node, mps_unit("chat_m3")) == "inactive", node
        assert state(fleet, node, mps_unit("chat_m2")) == "active", node
        assert answering_engine(fleet, node) == "chat_m2", node
    return run.stdout


def test_a_new_instance_on_a_gpu_another_instance_uses_is_refused(fleet, weight_50, inventory_with):
    inventory = inventory_with(entry("chat_m2", 8112, 1, "chat_m2"), [instance("chat_m2", 1)])
    output = refused(
        fleet,
        inventory,
        {"name": "chat_m3", "listen_port": 8113, "cuda_mps_instance": "chat_m3"},
        *own_instance("chat_m3", 1),
    )
    assert "chat_m3 would take GPU 1, which MPS instance chat_m2" in output, output[-4000:]


def test_sharing_an_instance_needs_memory_for_both_engines(fleet, weight_50, inventory_with):
    inventory = inventory_with(entry("chat_m2", 8112, 1, "chat_m2"), [instance("chat_m2", 1)])
    output = refused(fleet, inventory, {"name": "chat_m3", "listen_port": 8113})
    assert "would both be clients of MPS instance chat_m2" in output, output[-4000:]
    assert "lower engine_upgrade_to.gpu_memory_utilization to at most 0.1" in output


def test_a_new_engine_that_never_answers_is_stopped_with_its_instance(
    fleet, weight_50, load, inventory_with
):
    inventory = inventory_with(entry("chat_m2", 8112, 1, "chat_m2"), [instance("chat_m2", 1)])
    before = {node: slot_cookie(fleet, node) for node in fleet.nodes}
    run, _summary = run_under_load(
        load,
        "mps-never-ready",
        lambda: fleet.engine_upgrade(
            "chat_m2",
            # Every completion fails: the engine listens but is never ready.
            {
                "name": "chat_m3",
                "listen_port": 8113,
                "cuda_mps_instance": "chat_m3",
                "hardware_profile": {"gpu": 0},
                "simulator": {"error_rate": 1.0},
            },
            *own_instance("chat_m3", 0),
            "-e",
            "engine_upgrade_ready_timeout=6",
            "-e",
            "engine_upgrade_ready_poll=2",
            inventories=[inventory],
        ),
    )
    assert run.returncode != 0
    assert "Nothing was swapped" in run.stdout, run.stdout[-4000:]
    assert "its MPS instance chat_m3 too" in run.stdout, run.stdout[-4000:]
    # The first wave fails, and any_errors_fatal stops the play there: later waves are
    # never reached. A node reached brought chat_m3's instance up, then stopped it.
    reached = [node for node in fleet.nodes if mps_events(fleet, node, "chat_m3")]
    assert reached, run.stdout[-4000:]
    for node in fleet.nodes:
        assert slot_cookie(fleet, node) == before[node], node
        assert answering_engine(fleet, node) == "chat_m2", node
        assert state(fleet, node, engine_unit("chat_m3")) != "active", node
        assert state(fleet, node, mps_unit("chat_m3")) == "inactive", node
        assert_joined(fleet, node, "chat_m2", "chat_m2")
    for node in reached:
        new_daemon = props(fleet, node, mps_unit("chat_m3"), "UnitFileState")
        assert new_daemon["UnitFileState"] == "disabled", (node, new_daemon)
        # It ran (brought up before the engine), and was stopped through "quit".
        events = mps_events(fleet, node, "chat_m3")
        assert events[0]["event"] == "start", events
        assert (events[-1]["event"], events[-1].get("reason")) == ("exit", "quit"), events


def test_an_upgrade_sharing_the_old_instance_keeps_it(
    fleet, weight_50, load, inventory_with, tmp_path
):
    inventory = inventory_with(
        entry("chat_m2", 8112, 1, "chat_m2", gpu_memory_utilization=0.5), [instance("chat_m2", 1)]
    )
    daemon_before = {
        node: props(fleet, node, mps_unit("chat_m2"), "MainPID")["MainPID"] for node in fleet.nodes
    }
    report = tmp_path / "report.json"
    run, _summary = run_under_load(
        load,
        "mps-shared",
        lambda: fleet.engine_upgrade(
            "chat_m2",
            {"name": "chat_m3", "listen_port": 8113, "gpu_memory_utilization": 0.4},
            inventories=[inventory],
            report=report,
        ),
    )
    assert run.returncode == 0, run.stdout[-8000:]
    nodes = json.loads(report.read_text())["nodes"]
    for node in fleet.nodes:
        assert nodes[node]["old_mps_instance"] == "shared with chat_m3", nodes[node]
        assert answering_engine(fleet, node) == "chat_m3", node
        assert state(fleet, node, engine_unit("chat_m2")) == "inactive", node
        assert_joined(fleet, node, "chat_m3", "chat_m2")
        # One MPS server throughout: the daemon was neither stopped nor restarted.
        assert props(fleet, node, mps_unit("chat_m2"), "MainPID")["MainPID"] == daemon_before[node]


def test_upgrade_back_to_the_inventory_engine_stops_the_last_instance(
    fleet, weight_50, load, inventory_with, tmp_path
):
    inventory = inventory_with(
        entry("chat_m3", 8113, 1, "chat_m2", gpu_memory_utilization=0.4), [instance("chat_m2", 1)]
    )
    report = tmp_path / "report.json"
    run, _summary = run_under_load(
        load,
        "mps-back",
        lambda: fleet.engine_upgrade(
            "chat_m3",
            {
                "name": "chat",
                "listen_port": 8101,
                "cuda_mps_instance": None,
                "hardware_profile": {"gpu": None},
            },
            inventories=[inventory],
            report=report,
        ),
    )
    assert run.returncode == 0, run.stdout[-8000:]
    nodes = json.loads(report.read_text())["nodes"]
    for node in fleet.nodes:
        assert (nodes[node]["mps_instance"], nodes[node]["old_mps_instance"]) == (
            "none",
            "stopped",
        )
        assert answering_engine(fleet, node) == "chat", node
        unit = props(fleet, node, engine_unit("chat"), "Requires", "EnvironmentFiles")
        assert "zerolayer-mps@" not in unit["Requires"] + unit["EnvironmentFiles"], unit
        for name in ENGINES:
            assert state(fleet, node, mps_unit(name)) == "inactive", (node, name)
            assert state(fleet, node, engine_unit(name)) == "inactive", (node, name)
