"""The sandbox fleet: `scripts/sandbox up` gives booted systemd nodes that the sandbox
inventory finds and Ansible reaches; `scripts/sandbox down` leaves nothing behind.

Runs as root on a machine with podman (the test profile of bindep.txt).
"""

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from sandbox_inventory import named_fleet_inventory

ROOT = Path(__file__).resolve().parents[2]
SANDBOX = ROOT / "scripts" / "sandbox"
LABEL = "zerolayer.sandbox=fleet"
NETWORK = "zerolayer-sandbox"
NODES = ["zl-node-01", "zl-node-02"]
MONITOR = "zl-monitor"

# One sandbox fleet at a time on a machine: every test that brings it up runs in one worker.
pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]


@pytest.fixture(scope="module", autouse=True)
def root_and_podman():
    """The test profile runs as root with podman installed (bindep.txt): else a failure."""
    if os.geteuid() != 0:
        pytest.fail("the sandbox fleet needs root: run the tests as root")
    if shutil.which("podman") is None:
        pytest.fail("podman is missing: install the Debian package podman (scripts/setup test)")


def run(*argv, check=True, **env_vars):
    env = dict(os.environ, CONTAINERS_CONF=str(ROOT / "tests" / "sandbox" / "containers.conf"))
    env.update(env_vars)
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=check)


def in_node(node, *argv):
    return run("podman", "exec", node, *argv, check=False).stdout.strip()


def fleet_containers(label=LABEL):
    out = run("podman", "ps", "-a", "--filter", f"label={label}", "--format", "{{.Names}}").stdout
    return sorted(out.split())


def plain(value):
    """A value as ansible-inventory --list prints it: label values come marked unsafe."""
    return value.get("__ansible_unsafe", value) if isinstance(value, dict) else value


def network_exists(network=NETWORK):
    return run("podman", "network", "exists", network, check=False).returncode == 0


@pytest.fixture(scope="module")
def fleet():
    if fleet_containers() or network_exists():
        pytest.fail("a sandbox fleet is already up; run `scripts/sandbox down` first")
    try:
        run(str(SANDBOX), "up", str(len(NODES)))
        yield NODES
    finally:
        run(str(SANDBOX), "down", check=False)


def test_up_starts_every_node_with_systemd_running(fleet):
    assert fleet_containers() == sorted([MONITOR, *fleet])
    for node in [MONITOR, *fleet]:
        state = in_node(node, "systemctl", "is-system-running")
        assert state in {"running", "degraded"}, (node, state)
        assert in_node(node, "hostname") == node


def test_nodes_run_on_runc_with_the_allowed_ulimits(fleet):
    for node in fleet:
        inspect = json.loads(run("podman", "inspect", node).stdout)[0]
        assert inspect["OCIRuntime"] == "runc"
        assert inspect["HostConfig"]["Privileged"] is True
        limits = in_node(node, "sh", "-c", "ulimit -Hn; ulimit -Sn").split()
        assert limits == ["20000", "20000"]


def test_nodes_have_bpffs_and_keep_apt_lists(fleet):
    for node in fleet:
        assert in_node(node, "findmnt", "-n", "-o", "FSTYPE", "/sys/fs/bpf") == "bpf"
        lists = in_node(node, "ls", "/var/lib/apt/lists").split()
        assert any(name.endswith("_Packages") for name in lists)


def test_inventory_groups_scale_with_the_fleet(fleet):
    inventory = json.loads(run("ansible-inventory", "-i", "inventories/sandbox", "--list").stdout)
    assert sorted(inventory["gpu_nodes"]["hosts"]) == fleet
    assert inventory["wave_canary"]["hosts"] == fleet[:1]
    assert sorted(inventory["wave_rest"]["hosts"]) == fleet[1:]
    assert inventory["monitoring"]["hosts"] == [MONITOR]
    addresses = {
        host: json.loads(
            run("ansible-inventory", "-i", "inventories/sandbox", "--host", host).stdout
        )
        for host in [MONITOR, *fleet]
    }
    assert all(vars_["zerolayer_node_address"] for vars_ in addresses.values())
    assert len({str(vars_["zerolayer_node_address"]) for vars_ in addresses.values()}) == 3
    # Ansible reaches every node over SSH at that address, as it reaches a real node.
    assert sorted(inventory["sandbox_nodes"]["hosts"]) == sorted([MONITOR, *fleet])
    for vars_ in addresses.values():
        assert vars_["ansible_connection"] == "ansible.builtin.ssh"
        assert vars_["ansible_host"] == vars_["zerolayer_node_address"]


def test_ansible_reaches_every_node(fleet):
    result = run(
        "ansible",
        "-i",
        "inventories/sandbox",
        "gpu_nodes",
        "-m",
        "ansible.builtin.ping",
        "-o",
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for node in fleet:
        assert f"{node} | SUCCESS" in result.stdout


def test_up_refuses_a_smaller_fleet_over_a_larger_one_and_changes_nothing(fleet):
    # A larger fleet left running (a bench's --keep-fleet) would join every playbook's
    # inventory: `up` names its extra nodes and stops.
    before = fleet_containers()
    refused = run(str(SANDBOX), "up", "1", check=False)
    assert refused.returncode != 0
    assert "zl-node-02" in refused.stderr and "scripts/sandbox down" in refused.stderr, refused
    assert fleet_containers() == before
    for node in fleet:
        assert in_node(node, "systemctl", "is-system-running") in {"running", "degraded"}, node


def test_a_named_fleet_needs_a_valid_name_and_its_own_subnet(fleet):
    for env_vars, field in (
        ({"ZEROLAYER_SANDBOX_FLEET": "Second!"}, "ZEROLAYER_SANDBOX_FLEET"),
        ({"ZEROLAYER_SANDBOX_FLEET": "spare"}, "ZEROLAYER_SANDBOX_SUBNET_PREFIX"),
        (
            {"ZEROLAYER_SANDBOX_FLEET": "spare", "ZEROLAYER_SANDBOX_SUBNET_PREFIX": "10.89"},
            "ZEROLAYER_SANDBOX_SUBNET_PREFIX",
        ),
    ):
        refused = run(str(SANDBOX), "up", "1", check=False, **env_vars)
        assert refused.returncode != 0 and field in refused.stderr, (env_vars, refused)
    assert fleet_containers("zerolayer.sandbox=spare") == []
    assert not network_exists("zerolayer-sandbox-spare")


def test_a_named_fleet_runs_beside_the_first_and_goes_alone(fleet, tmp_path):
    # Not "second": the playbook tests' second fleet may be up on another worker meanwhile.
    spare = {"ZEROLAYER_SANDBOX_FLEET": "spare", "ZEROLAYER_SANDBOX_SUBNET_PREFIX": "10.89.215"}
    try:
        run(str(SANDBOX), "up", "1", **spare)
        assert fleet_containers("zerolayer.sandbox=spare") == [
            "zl-spare-monitor",
            "zl-spare-node-01",
        ]
        assert network_exists("zerolayer-sandbox-spare")
        assert fleet_containers() == sorted([MONITOR, *fleet]), "the first fleet is unchanged"
        # Each inventory finds its own fleet, and Ansible reaches the spare one by SSH.
        first = json.loads(run("ansible-inventory", "-i", "inventories/sandbox", "--list").stdout)
        assert sorted(first["sandbox_nodes"]["hosts"]) == sorted([MONITOR, *fleet])
        inventory = str(named_fleet_inventory("spare", tmp_path / "inventory"))
        found = json.loads(run("ansible-inventory", "-i", inventory, "--list").stdout)
        assert found["gpu_nodes"]["hosts"] == ["zl-spare-node-01"]
        assert found["monitoring"]["hosts"] == ["zl-spare-monitor"]
        node = found["_meta"]["hostvars"]["zl-spare-node-01"]
        assert plain(node["zerolayer_node_address"]) == "10.89.215.11", node
        assert plain(node["zerolayer_sandbox_fleet"]) == "spare", node
        pinged = run(
            "ansible", "-i", inventory, "sandbox_nodes", "-m", "ansible.builtin.ping", "-o",
            check=False,
        )  # fmt: skip
        assert pinged.returncode == 0, pinged.stdout + pinged.stderr
        # Its `down` removes it alone.
        run(str(SANDBOX), "down", **spare)
        assert fleet_containers("zerolayer.sandbox=spare") == []
        assert not network_exists("zerolayer-sandbox-spare")
        assert fleet_containers() == sorted([MONITOR, *fleet])
        assert network_exists()
    finally:
        run(str(SANDBOX), "down", check=False, **spare)


def test_down_removes_everything_and_is_idempotent(fleet):
    run(str(SANDBOX), "down")
    assert fleet_containers() == []
    assert not network_exists()
    run(str(SANDBOX), "down")
