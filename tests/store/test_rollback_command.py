"""`zerolayer rollback` and the push after `zerolayer rollout abort -i`, against a real etcd,
real fence watcher processes and the real push (ansible-playbook rollback_push.yml).

The nodes are reached with Ansible's local connection, and their `zerolayer-routectl` is a
test double (a script that prints what `zerolayer-routectl rollback` prints, or fails): the
kernel side of a push is the data-plane tests' and the sandbox fleet's. What is tested here
is the command's own path: the nodes named from the inventory, the fence raised, the
watchers counted, ansible-playbook started for the lagging nodes only, the report, the
records and the event, and the exit status.
"""

import json
import os
import signal
import subprocess
import sys

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollback_command
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from waiting import wait_until

from .conftest import COLLECTIONS_PATH
from .planted_records import T0, completed, planted, record_of
from .watcher_processes import presence_of

REPO = os.path.dirname(COLLECTIONS_PATH)
ZEROLAYER = os.path.join(REPO, "scripts", "zerolayer")
# What `zerolayer-routectl rollback [--epoch N]` prints on a node it rolled back.
ROUTECTL_OK = """#!/bin/sh
echo "$@" >> "$0.calls"
epoch=null
[ "$2" = "--epoch" ] && epoch=$3
routes='[{"route": "chat", "weight_bp": 0}]'
echo '{"rolled_back": true, "fence_epoch": '"$epoch"', "elapsed_ms": 1, "routes": '"$routes"'}'
"""
# The same, noting when it ran after its arguments.
ROUTECTL_TIMED = ROUTECTL_OK.replace('echo "$@" >>', 'echo "$@ $(date +%s.%N)" >>')
ROUTECTL_FAILS = """#!/bin/sh
echo "$@" >> "$0.calls"
echo "zerolayer-routectl: the router's pins are gone (test)" >&2
exit 1
"""


@pytest.fixture
def fleet_files(tmp_path):
    """An inventory of local nodes with their zerolayer-routectl doubles:
    nodes(name=ok|timed|fails)."""
    doubles = {"ok": ROUTECTL_OK, "timed": ROUTECTL_TIMED, "fails": ROUTECTL_FAILS}

    def nodes(**kinds):
        lines = ["[gpu_nodes]"]
        for node, kind in kinds.items():
            script = tmp_path / ("routectl-%s" % node)
            script.write_text(doubles[kind])
            script.chmod(0o755)
            lines.append("%s ansible_connection=local rollback_routectl=%s" % (node, script))
        inventory = tmp_path / "inventory.ini"
        inventory.write_text("\n".join(lines) + "\n")
        return inventory

    return nodes


def calls(tmp_path, node):
    path = tmp_path / ("routectl-%s.calls" % node)
    return path.read_text().split("\n")[:-1] if path.exists() else []


def zerolayer(etcd_url, store, tmp_path, *argv):
    env = dict(
        os.environ,
        ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
        HOME=str(tmp_path / "home"),
        PATH="%s:%s" % (os.path.dirname(sys.executable), os.environ.get("PATH", "")),
    )
    result = subprocess.run(
        [sys.executable, ZEROLAYER, "--endpoints", etcd_url, "--prefix", store.prefix,
         "-o", "json", *argv],
        capture_output=True, text=True, timeout=180, env=env, check=False, cwd=str(tmp_path),
    )  # fmt: skip
    said = json.loads(result.stdout) if result.stdout.strip().startswith("{") else None
    return result.returncode, said, result.stderr


def test_the_watching_node_confirms_and_only_the_silent_one_is_pushed(
    store, etcd_url, watchers, fleet_files, tmp_path
):
    up = watchers("n-up").start()
    wait_until(lambda: presence_of(store, "n-up"), "n-up's presence")
    inventory = fleet_files(**{"n-up": "ok", "n-down": "ok"})
    report_file = tmp_path / "report.json"
    status, said, err = zerolayer(
        etcd_url, store, tmp_path, "rollback", "-i", str(inventory), "--report", str(report_file),
        "--reason", "p99 page", "--ack-wait", "20",
    )  # fmt: skip
    assert status == 0, (said, err)
    assert said["fence_epoch"] == 1 and store.fence()["epoch"] == 1, said
    assert said["confirmed_by_watcher"] == ["n-up"] and said["pushed"] == ["n-down"], said
    assert said["watchers_absent"] == ["n-down"], said
    assert said["pushed_with_the_count"] == ["n-down"], said
    # The count did not wait for the absent watcher (it waits up to 20 s for the present).
    assert said["count_waited_s"] < 5, said
    assert calls(tmp_path, "n-up") == [], "a node its watcher confirmed is not pushed"
    assert calls(tmp_path, "n-down") == ["rollback --epoch 1"]
    assert said["nodes_confirmed"] == said["nodes_total"] == 2
    # The whole command is reported beside the time to the last confirmation.
    assert 0 < said["wall_time_s"] <= said["command_s"], said
    assert json.loads(report_file.read_text())["pushed"] == ["n-down"]
    # After the act: the event is in the store, with the report's figures.
    events = [e for e in rollout_events.list_events(store) if e["type"] == "fleet_rolled_back"]
    assert len(events) == 1 and events[0]["detail"]["nodes_confirmed"] == 2, events
    assert said["records"]["event_stored"] and said["records"]["error"] is None, said
    up.stop()


def test_a_node_without_presence_is_pushed_while_the_count_still_waits_for_a_present_one(
    store, etcd_url, watchers, fleet_files, tmp_path
):
    """A watcher that is present at the raise but stopped (SIGSTOP) keeps the count waiting
    for all of --ack-wait; the node without a watcher is pushed meanwhile, not after."""
    stuck = watchers("n-stuck").start()
    wait_until(lambda: presence_of(store, "n-stuck"), "n-stuck's presence")
    inventory = fleet_files(**{"n-stuck": "timed", "n-down": "timed"})
    os.killpg(stuck.proc.pid, signal.SIGSTOP)
    try:
        status, said, err = zerolayer(
            etcd_url, store, tmp_path, "rollback", "-i", str(inventory), "--ack-wait", "8",
            "--report", str(tmp_path / "r.json"),
        )  # fmt: skip
    finally:
        os.killpg(stuck.proc.pid, signal.SIGCONT)
    assert status == 0, (said, err)
    assert said["watchers_absent"] == ["n-down"] and said["count_waited_s"] >= 7.9, said
    assert said["pushed_with_the_count"] == ["n-down"], said
    assert sorted(said["pushed"]) == ["n-down", "n-stuck"], said
    # n-down's zerolayer-routectl ran before the count gave up on n-stuck.
    fenced_at = store.fence()["at_unix"]
    pushed_at = float(calls(tmp_path, "n-down")[0].split()[-1])
    assert pushed_at < fenced_at + said["count_waited_s"], (pushed_at, fenced_at, said)
    assert calls(tmp_path, "n-stuck")[0].startswith("rollback --epoch 1 ")
    stuck.stop()


def test_a_node_not_confirmed_fails_the_command_and_the_others_are_still_rolled_back(
    store, etcd_url, fleet_files, tmp_path
):
    inventory = fleet_files(a="ok", b="fails")
    status, said, err = zerolayer(
        etcd_url, store, tmp_path, "rollback", "-i", str(inventory), "--ack-wait", "0",
        "--report", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert status == 5, (said, err)
    assert said["pushed"] == ["a", "b"] and said["not_confirmed"] == ["b"], said
    assert said["nodes_confirmed"] == 1 and said["unreachable"] == [], said
    assert "pins are gone" in next(n for n in said["nodes"] if n["node"] == "b")["error"]
    assert calls(tmp_path, "a") == ["rollback --epoch 1"] == calls(tmp_path, "b")


def test_with_the_store_down_every_node_is_pushed_with_its_own_fence(fleet_files, tmp_path):
    inventory = fleet_files(a="ok", b="ok")
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(REPO, "ansible.cfg"),
               HOME=str(tmp_path / "home"))  # fmt: skip
    result = subprocess.run(
        [sys.executable, ZEROLAYER, "--endpoints", "http://127.0.0.1:9", "-o", "json",
         "rollback", "-i", str(inventory), "--report", str(tmp_path / "r.json")],
        capture_output=True, text=True, timeout=180, env=env, check=False,
    )  # fmt: skip
    said = json.loads(result.stdout)
    assert result.returncode == 0, result.stderr
    assert said["store_updated"] is False and said["fence_epoch"] is None, said
    assert said["store_error"], said
    # No epoch given: each node goes one above its own.
    assert calls(tmp_path, "a") == ["rollback"] == calls(tmp_path, "b")
    assert "could not" in said["records"]["error"] or said["records"]["error"], said


def test_a_pattern_that_names_no_node_changes_nothing(store, etcd_url, fleet_files, tmp_path):
    inventory = fleet_files(a="ok")
    status, said, err = zerolayer(
        etcd_url, store, tmp_path, "rollback", "-i", str(inventory), "--hosts", "wave_eu"
    )
    assert status == 2 and said is None, said
    assert "--hosts 'wave_eu' matches no node" in err, err
    assert store.fence()["epoch"] == 0 and calls(tmp_path, "a") == []


def test_the_rollback_marks_the_completed_rollouts_it_superseded(
    store, etcd_url, fleet_files, tmp_path
):
    completed(store, "chat-v2", T0)
    planted(store, "chat-running", waves=("wave_all",))
    inventory = fleet_files(a="ok")
    status, said, err = zerolayer(
        etcd_url, store, tmp_path, "rollback", "-i", str(inventory), "--ack-wait", "0",
        "--report", str(tmp_path / "r.json"),
    )  # fmt: skip
    assert status == 0, (said, err)
    # The completed rollout no longer reads "completed 100 %"; another's running one is
    # left to read fenced (its runner stops at its next gate).
    assert said["records"]["marked"]["marked"] == ["chat-v2/wave_all"], said
    assert record_of(store, "chat-v2/wave_all")["outcome"] == "rolled_back"
    assert record_of(store, "chat-running/wave_all")["outcome"] == "running"


def test_bad_modes_and_waits_are_refused_before_anything_is_written(store, etcd_url):
    settings = {"endpoints": [etcd_url], "prefix": store.prefix}
    with pytest.raises(rollback_command.FleetError, match="mode must be one of fast, deep"):
        rollback_command.roll_back(settings, ["a"], "sideways", "r", "t", [], 0.0)
    with pytest.raises(rollback_command.FleetError, match="--ack-wait must be 0 or more"):
        rollback_command.roll_back(settings, ["a"], "fast", "r", "t", [], 0.0, ack_wait_s=-1)
    assert store.fence()["epoch"] == 0


def test_abort_with_an_inventory_counts_and_pushes_at_the_epoch_it_raised(
    store, etcd_url, fleet_files, tmp_path
):
    planted(store, "chat-a", waves=("wave_all",))
    inventory = fleet_files(a="ok")
    status, said, err = zerolayer(
        etcd_url, store, tmp_path, "rollout", "abort", "chat-a", "-i", str(inventory)
    )
    assert status == 0, (said, err)
    epoch = said["fence"]["epoch"]
    assert said["waves"]["wave_all"]["outcome"] == "aborted", said
    # One fence: the abort's, counted and pushed at, not raised again by the rollback.
    assert said["rollback"]["fence_epoch"] == epoch == store.fence()["epoch"], said
    assert calls(tmp_path, "a") == ["rollback --epoch %d" % epoch]
    assert said["rollback"]["nodes_confirmed"] == 1 and said["rollback"]["pushed"] == ["a"]
