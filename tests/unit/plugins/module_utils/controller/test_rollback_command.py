"""`zerolayer rollback` runs without Ansible's variables, so rollback_command.py keeps its own
copy of the defaults rollback.yml reads. A default changed in one place only would make the
command and the playbook roll back differently: these tests read the role defaults and the
playbook files and compare."""

import re
from pathlib import Path

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

    def fence_call(params):
        seen.update(params)
        return {"store_updated": False, "fence": None}

    monkeypatch.setattr(rollback_command, "fence_call", fence_call)
    store = {"endpoints": ["https://127.0.0.1:2379"], "timeout": 30.0, "prefix": "/zl/"}
    rollback_command.raise_and_count(store, "deep", ["n1"], "page", "sre", 5.0)
    assert set(rollback_command.FENCE_ARGUMENT_SPEC) <= set(seen)
    assert seen["catch_up_to"] is None and seen["at_least"] == 0
    assert (seen["action"], seen["rollback_mode"], seen["wait_s"]) == ("raise", "deep", 5.0)
    assert (seen["prefix"], seen["timeout"]) == ("/zl/", rollback_command.STORE_TIMEOUT_S)
