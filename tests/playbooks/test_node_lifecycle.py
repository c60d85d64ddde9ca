"""A driver change, an MPS change and an engine change roll through the sandbox fleet node by
node, each node drained first.

The NVIDIA driver is a TEST DOUBLE here (tests/playbooks/driver_doubles.yml: a signed local
apt repository of dummy packages at two releases, a sysfs tree with one GPU, a recording
update-initramfs, and a daemon restart standing in for the reboot, which would stop a
container), and so are nvidia-cuda-mps-control and nvidia-smi (the cuda_mps scenario's, as
test_engine_upgrade_mps.py installs them). Everything else is the product: site.yml with its
batch of one, the nvidia_driver and cuda_mps roles, node_drain's drain and undrain, the
router, nginx and the engines, under load from every node's service port.
"""

from __future__ import annotations

import json
import time

import pytest
from fleet_groups import SECOND_FLEET
from test_engine_upgrade_mps import doubles_on_every_node, mps_events, remove_mps

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SECOND_FLEET)]

FIRST = "550.127.05"
NEXT = "550.144.03"
ENGINE_UNIT = "zerolayer-engine-chat.service"
# The role's settings that point it at the test doubles (see driver_doubles.yml).
DRIVER_VARS = {
    "nvidia_driver_branch": "550",
    "nvidia_driver_cuda_repo_base_url": "file:///srv/zerolayer-test-doubles/cuda-repos",
    "_nvidia_driver_test_double_root": "/var/lib/zerolayer-test-doubles/root-gpu",
    "_nvidia_driver_test_double_reboot_command": "systemctl restart nvidia-persistenced.service",
    "_nvidia_driver_test_double_boot_time_command": "cat /proc/sys/kernel/random/uuid",
    "node_drain_timeout_s": 30,
}


def unit_times(fleet, node, since, unit=ENGINE_UNIT):
    """(stopped, started) unix times of the unit's one stop and start since `since`."""
    text = fleet.exec(
        node,
        "journalctl",
        "--unit",
        unit,
        "--since",
        "@%d" % int(since),
        "--output",
        "short-unix",
        "--no-pager",
    ).stdout
    stopped = [float(line.split()[0]) for line in text.splitlines() if "Stopped " in line]
    started = [float(line.split()[0]) for line in text.splitlines() if "Started " in line]
    assert len(stopped) == 1 and len(started) == 1, (node, unit, text)
    return stopped[0], started[0]


def installed_at(fleet, node, package="libcuda1"):
    """(version, unix time dpkg last changed the package's file list); libcuda1 is the
    package the role reads the installed driver version from on Debian."""
    out = fleet.exec(
        node, "dpkg-query", "-W", "-f", "${Version} ${db-fsys:Last-Modified}", package
    ).stdout.split()
    return out[0], float(out[1])


def assert_undrained(fleet, node):
    """Back in service: the weight it had (20 %), the engine registered, the proxy home,
    no drain record left."""
    assert fleet.routes(node)[fleet.route["name"]][0] == 2000, node
    assert all(route["slots"] for route in fleet.show(node)["routes"]), node
    assert fleet.exec(node, "test", "-e", "/var/lib/zerolayer/drain.json", check=False).returncode
    assert "Drained" not in fleet.exec(node, "cat", "/etc/nginx/nginx.conf").stdout


def one_node_at_a_time(windows):
    """Each node's engine was back before the next one's stopped; the seconds each was down.
    windows: (stopped, restarted, node) per node."""
    windows = sorted(windows)
    for earlier, later in zip(windows, windows[1:]):
        assert earlier[1] < later[0], (earlier[2], later[2], windows)
    return {node: round(back - gone, 1) for gone, back, node in windows}


def drained_change(fleet, client, *site_args):
    """site.yml with site_args under the load of `client`: it succeeds, drains every node
    once (one batch, a node, at a time) and loses no request; returns (run, summary)."""
    run = fleet.playbook("site.yml", *site_args)
    assert run.returncode == 0, run.stdout[-8000:]
    client.wait_for_more(100, "requests after the change")
    summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    drains = run.stdout.count("node_drain : Send no new connection on the direct path]")
    assert drains == len(fleet.nodes), run.stdout[-8000:]
    return run, summary


@pytest.fixture
def driver_doubles(fleet, tmp_path):
    """The test doubles and the first release on every node; all removed afterwards."""
    vars_file = tmp_path / "driver-vars.json"
    vars_file.write_text(json.dumps(DRIVER_VARS))
    common = (
        "-e",
        "@%s" % vars_file,
        "-e",
        "driver_first=%s" % FIRST,
        "-e",
        "driver_next=%s" % NEXT,
        "-e",
        "driver_build_dir=%s" % (tmp_path / "repo"),
    )
    try:
        prepared = fleet.playbook(
            "../tests/playbooks/driver_doubles.yml", "--tags", "prepare", *common
        )
        assert prepared.returncode == 0, prepared.stdout[-6000:]
        yield vars_file
    finally:
        cleaned = fleet.playbook(
            "../tests/playbooks/driver_doubles.yml", "--tags", "cleanup", *common
        )
        assert cleaned.returncode == 0, cleaned.stdout[-6000:]


def test_a_driver_change_drains_each_node_in_turn_and_loses_no_request(
    fleet, baseline, load, driver_doubles
):
    for node in fleet.nodes:
        assert installed_at(fleet, node)[0] == FIRST + "-1", node
    # Some of the traffic on the direct path, so the drain has a weight to take away and give back.
    fleet.set_weight(20)
    client = load("driver-change")
    client.wait_for_more(100, "requests before the change")
    started = time.time() - 1

    run = fleet.playbook(
        "site.yml",
        "--tags",
        "nvidia_driver",
        "-e",
        "@%s" % driver_doubles,
        "-e",
        "nvidia_driver_version=%s" % NEXT,
    )
    assert run.returncode == 0, run.stdout[-8000:]
    client.wait_for_more(100, "requests after the change")
    summary = client.stop()

    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    windows = []
    for node in fleet.nodes:
        version, changed_at = installed_at(fleet, node)
        stopped, restarted = unit_times(fleet, node, started)
        # Drained before its change: the engine stopped before dpkg touched the driver, and
        # came back only after it.
        assert version == NEXT + "-1", node
        assert stopped < changed_at < restarted, (node, stopped, changed_at, restarted)
        windows.append((stopped, restarted, node))
        assert_undrained(fleet, node)
    down = one_node_at_a_time(windows)
    print(
        "driver change %s -> %s: %d requests (%d streams), 0 failed; engine down per node %s s"
        % (
            FIRST,
            NEXT,
            summary["requests_ok"],
            summary["streams_completed"],
            down,
        )
    )


def test_an_engine_change_drains_each_node_in_turn_and_loses_no_request(fleet, baseline, load):
    """site.yml with a setting that restarts every node's engine (its drain time is in the
    unit): the model_engine role drains each node before the restart and undrains it after,
    one node at a time, under load."""
    fleet.set_weight(20)
    client = load("engine-change")
    client.wait_for_more(100, "requests before the change")
    started = time.time() - 1
    try:
        # Drained by the model_engine role, one batch (node) at a time.
        _run, summary = drained_change(
            fleet,
            client,
            "--tags",
            "model_engine",
            "-e",
            json.dumps({"model_engine_drain_seconds": 31, "node_drain_timeout_s": 30}),
        )
        windows = []
        for node in fleet.nodes:
            # Restarted with the new setting, once.
            unit = fleet.exec(node, "systemctl", "cat", ENGINE_UNIT).stdout
            assert "TimeoutStopSec=41" in unit, (node, unit)
            stopped, restarted = unit_times(fleet, node, started)
            windows.append((stopped, restarted, node))
            assert_undrained(fleet, node)
        down = one_node_at_a_time(windows)
        print(
            "engine change: %d requests (%d streams), 0 failed; engine down per node %s s"
            % (
                summary["requests_ok"],
                summary["streams_completed"],
                down,
            )
        )
    finally:
        # The inventory's setting back, every node drained at once: the load has stopped,
        # so no client needs a peer meanwhile (a maintenance window's settings: one batch of
        # every node, drained with no peer on purpose). One drain instead of one per node.
        everything_at_once = {
            "site_drain_batch": len(fleet.nodes),
            "site_drain_max_share": 1,
            "node_drain_allow_no_peers": True,
        }
        restored = fleet.playbook(
            "site.yml", "--tags", "model_engine", "-e", json.dumps(everything_at_once)
        )
        assert restored.returncode == 0, restored.stdout[-8000:]
        for node in fleet.nodes:
            unit = fleet.exec(node, "systemctl", "cat", ENGINE_UNIT).stdout
            assert "TimeoutStopSec=41" not in unit, (node, unit)


MPS_INSTANCE = "shared"


def mps_instances(active_thread_percentage):
    """-e for one MPS instance per node on GPU 0 at the given default thread share."""
    instance = {
        "name": MPS_INSTANCE,
        "gpu": 0,
        "pinned_mem_limit": "2G",
        "active_thread_percentage": active_thread_percentage,
    }
    return ("-e", json.dumps({"cuda_mps_instances": [instance], "node_drain_timeout_s": 30}))


@pytest.fixture
def mps_doubles(fleet):
    """The TEST DOUBLES of the NVIDIA MPS tools on every node; removed afterwards with the
    instance this test runs."""
    with doubles_on_every_node(fleet, lambda node: remove_mps(fleet, node, [MPS_INSTANCE])):
        yield


def test_an_mps_change_drains_each_node_in_turn_and_loses_no_request(
    fleet, baseline, load, mps_doubles
):
    """site.yml --tags cuda_mps: a first start drains nothing (no client to lose); a setting
    that restarts every node's running control daemon drains each node first, one at a time,
    under load. The engine here joins no instance: the drain stops every engine of the node
    whichever instance it uses, so the order (engine stopped, daemon restarted, engine back)
    is the same."""
    first = fleet.playbook("site.yml", "--tags", "cuda_mps", *mps_instances(50))
    assert first.returncode == 0, first.stdout[-8000:]
    assert "node_drain : Send no new connection" not in first.stdout, first.stdout[-8000:]

    fleet.set_weight(20)
    client = load("mps-change")
    client.wait_for_more(100, "requests before the change")
    started = time.time() - 1
    _run, summary = drained_change(fleet, client, "--tags", "cuda_mps", *mps_instances(60))
    windows = []
    for node in fleet.nodes:
        engine_stopped, engine_started = unit_times(fleet, node, started)
        mps_stopped, mps_started = unit_times(
            fleet, node, started, unit="zerolayer-mps@%s.service" % MPS_INSTANCE
        )
        # The daemon went down only once the engine had stopped, and was up with the new
        # setting before the engine came back.
        assert engine_stopped <= mps_stopped < mps_started <= engine_started, (
            node,
            engine_stopped,
            mps_stopped,
            mps_started,
            engine_started,
        )
        # The daemon that runs now was told the new default when it started.
        events = mps_events(fleet, node, MPS_INSTANCE)
        last_start = max(i for i, event in enumerate(events) if event["event"] == "start")
        commands = [e["command"] for e in events[last_start:] if e["event"] == "command"]
        assert "set_default_active_thread_percentage 60" in commands, (node, events)
        windows.append((engine_stopped, engine_started, node))
        assert_undrained(fleet, node)
    down = one_node_at_a_time(windows)
    print(
        "MPS change: %d requests (%d streams), 0 failed; engine down per node %s s"
        % (summary["requests_ok"], summary["streams_completed"], down)
    )
