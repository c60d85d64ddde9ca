"""`zerolayer rollback` runs without Ansible's variables, so rollback_command.py keeps its own
copy of the defaults rollback.yml reads. A default changed in one place only would make the
command and the playbook roll back differently: these tests read the role defaults and the
playbook files and compare; the last ones, with the store and the push faked, how the
command orders the push beside the count."""

import re
import threading
import time
from pathlib import Path

import pytest
import yaml
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollback_command

REPO = Path(__file__).resolve().parents[5]
SETTINGS = REPO / "roles" / "rollout_settings" / "defaults" / "main" / "settings.yml"


def settings():
    return yaml.safe_load(SETTINGS.read_text())


def test_the_command_counts_and_judges_with_the_role_defaults():
    defaults = settings()
    assert rollback_command.ACK_WAIT_S == {
        "fast": defaults["rollback_ack_wait_s"],
        "deep": defaults["rollback_deep_ack_wait_s"],
    }
    assert rollback_command.ACK_QUIET_S == defaults["rollback_ack_quiet_s"]
    assert rollback_command.BUDGET_S == {
        "fast": defaults["rollback_fast_budget_s"],
        "deep": defaults["rollback_deep_budget_s"],
    }
    assert rollback_command.SHARD_NODES == defaults["rollback_push_shard_nodes"]
    assert rollback_command.PUSH_TIMEOUT_S == defaults["rollback_push_timeout_s"]


def test_the_deep_push_falls_back_on_the_role_defaults():
    defaults = settings()
    router = yaml.safe_load((REPO / "roles" / "ebpf_router" / "defaults" / "main.yml").read_text())
    assert rollback_command.DEEP_DEFAULTS == {
        "pin_dir": router["ebpf_router_pin_dir"],
        "proxy_unit": defaults["rollback_proxy_service"],
    }
    # canary_pin_dir is the router role's pin directory, with the same fallback.
    assert (
        defaults["canary_pin_dir"]
        == "{{ ebpf_router_pin_dir | default('%s') }}" % (router["ebpf_router_pin_dir"])
    )


def test_the_command_waits_for_the_store_as_long_as_the_playbook_does():
    raise_fence = (REPO / "playbooks" / "tasks" / "raise_fence.yml").read_text()
    playbook_default = re.search(r"rollout_store_rollback_timeout \| default\((\d+)\)", raise_fence)
    assert playbook_default, "raise_fence.yml no longer names its store timeout's default"
    assert rollback_command.STORE_TIMEOUT_S == float(playbook_default.group(1))


def test_the_command_without_a_store_pushes_every_node_and_asks_no_store():
    counted = rollback_command.raise_and_count({}, "fast", ["n1", "n2"], "page", "sre", 2.0)
    assert counted["lagging"] == ["n1", "n2"] and counted["store_updated"] is False


def test_the_command_gives_the_fence_core_every_option_it_reads(monkeypatch):
    """The command calls rollout_fence's core with parameters of its own making: each option
    of the module is there (an option added to the module has its default here), and the
    rollback's own settings win over the store's."""
    seen = {}

    def fence_call(params, on_absent=None):
        seen.update(params)
        return {"store_updated": False, "fence": None}

    monkeypatch.setattr(rollback_command, "fence_call", fence_call)
    store = {"endpoints": ["https://127.0.0.1:2379"], "timeout": 30.0, "prefix": "/zl/"}
    rollback_command.raise_and_count(store, "deep", ["n1"], "page", "sre", 5.0)
    assert set(rollback_command.FENCE_ARGUMENT_SPEC) <= set(seen)
    assert seen["catch_up_to"] is None and seen["at_least"] == 0
    assert (seen["action"], seen["rollback_mode"], seen["wait_s"]) == ("raise", "deep", 5.0)
    assert (seen["prefix"], seen["timeout"]) == ("/zl/", rollback_command.STORE_TIMEOUT_S)


def test_nodes_without_a_watcher_are_pushed_beside_the_count_and_not_again_after(monkeypatch):
    """The raise names the nodes whose watcher keeps no presence: their push starts then, in
    a thread, while the count still waits; the push after the count takes only the present
    nodes that did not acknowledge, and the report has every node's confirmation."""
    events = []
    count_may_end = threading.Event()

    def raise_and_count(store, mode, nodes, reason, actor, wait, epoch=None, on_absent=None):
        events.append("raised")
        on_absent(7, ["n-down"])
        # The count goes on until the push to n-down has run: it must not wait for the count.
        assert count_may_end.wait(10), "the absent node's push waited for the count"
        events.append("counted")
        return {"store_updated": True, "fence": {"epoch": 7}, "acked": {"n-up": {}},
                "lagging": ["n-stuck", "n-down"], "absent": ["n-down"]}  # fmt: skip

    def push(nodes, mode, epoch, reason, inventories, processes=0, env=None):
        events.append(("push", list(nodes), epoch))
        if nodes == ["n-down"]:
            count_may_end.set()
        return {node: {"node": node, "reached": True, "confirmed": True,
                       "confirmed_by": "push"} for node in nodes}, []  # fmt: skip

    monkeypatch.setattr(rollback_command, "raise_and_count", raise_and_count)
    monkeypatch.setattr(rollback_command, "push", push)
    result = rollback_command.roll_back(
        {"endpoints": ["https://127.0.0.1:2379"]}, ["n-up", "n-stuck", "n-down"], "fast",
        "page", "sre", ["inventory"], started_at=time.time(),
    )  # fmt: skip
    assert events[:2] == ["raised", ("push", ["n-down"], 7)], events
    assert events[2:] == ["counted", ("push", ["n-stuck"], 7)], events
    assert result["pushed_with_the_count"] == ["n-down"]
    assert result["push_with_the_count_started_s"] >= 0
    assert result["confirmed_by_watcher"] == ["n-up"]
    assert result["pushed"] == ["n-stuck", "n-down"] and result["nodes_confirmed"] == 3
    assert "1 of them beside the count" in rollback_command.summary_line(result)


def test_a_push_beside_the_count_that_fails_fails_the_rollback_in_the_caller(monkeypatch):
    def raise_and_count(store, mode, nodes, reason, actor, wait, epoch=None, on_absent=None):
        on_absent(3, nodes)
        return {"store_updated": True, "fence": {"epoch": 3}, "acked": {}, "lagging": nodes}

    def push(nodes, mode, epoch, reason, inventories, processes=0, env=None):
        if nodes:
            raise rollback_command.FleetError("ansible-playbook could not start", {})
        return {}, []

    monkeypatch.setattr(rollback_command, "raise_and_count", raise_and_count)
    monkeypatch.setattr(rollback_command, "push", push)
    with pytest.raises(rollback_command.FleetError, match="could not start"):
        rollback_command.roll_back({}, ["n1"], "fast", "page", "sre", [], started_at=time.time())
