"""How long the controller's store clients wait for the store, and who says so.

Every store module shares the option store_timeout, so a play's module_defaults set it for
the whole group from the inventory's rollout_store_timeout; a task's own store_timeout (the
rollback's shorter wait) wins over the group's, and canary_gate's own timeout stays
Prometheus'."""

import pathlib

import pytest
import yaml
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_store
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import DEFAULT_TIMEOUT_S

REPO = pathlib.Path(__file__).resolve().parents[5]
STORE_GROUP = "group/zerolayer.fleet.store"
FROM_INVENTORY = "{{ rollout_store_timeout | default(omit) }}"


def client_timeout(**params):
    return rollout_store.store_from_params(
        dict(endpoints=["https://127.0.0.1:2379"], **params)
    ).client.timeout


def test_store_timeout_wins_over_timeout_and_either_falls_back_to_the_default():
    assert client_timeout(timeout=2.0, store_timeout=10.0) == 10.0
    assert client_timeout(timeout=2.0, store_timeout=None) == 2.0
    assert client_timeout(timeout=None, store_timeout=None) == DEFAULT_TIMEOUT_S
    assert client_timeout() == DEFAULT_TIMEOUT_S


def test_every_store_module_takes_store_timeout():
    assert rollout_store.store_options()["store_timeout"] == {"type": "float"}
    assert rollout_store.store_options(required=False)["store_timeout"] == {"type": "float"}


def store_defaults_blocks():
    """(playbook, play name, the store group's module_defaults) for every play that has one."""
    for path in sorted((REPO / "playbooks").glob("*.yml")):
        for play in yaml.safe_load(path.read_text()) or []:
            defaults = (play.get("module_defaults") or {}).get(STORE_GROUP)
            if defaults is not None:
                yield path.name, play.get("name"), defaults


def test_every_play_passes_the_inventorys_store_timeout_to_the_store_group():
    blocks = list(store_defaults_blocks())
    assert len(blocks) >= 8, blocks
    missing = [
        (name, play)
        for name, play, defaults in blocks
        if defaults.get("store_timeout") != FROM_INVENTORY
    ]
    assert not missing, "plays whose store modules ignore rollout_store_timeout: %s" % missing


def test_the_rollback_keeps_its_own_shorter_wait_under_the_groups():
    """A task's own option wins over module_defaults only under the same name."""
    tasks = yaml.safe_load((REPO / "playbooks" / "tasks" / "raise_fence.yml").read_text())
    raise_task = next(
        task
        for task in tasks
        if task.get("zerolayer.fleet.rollout_fence", {}).get("action") == "raise"
    )
    arguments = raise_task["zerolayer.fleet.rollout_fence"]
    assert "rollout_store_rollback_timeout" in arguments["store_timeout"]
    assert "timeout" not in arguments


@pytest.mark.parametrize(
    ("current", "at_least", "catch_up_to", "expected"),
    [
        (3, 0, None, 4),
        (3, 7, None, 8),
        (3, 0, 5, 5),
        (5, 0, 5, None),
        (6, 0, 5, None),
    ],
)
def test_a_raise_goes_above_both_and_a_catch_up_to_exactly_the_nodes_epoch(
    current, at_least, catch_up_to, expected
):
    assert rollout_store.next_epoch(current, at_least, catch_up_to) == expected
