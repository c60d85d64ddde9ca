"""The canary's measured split (playbooks/tasks/canary_confirm.yml) over routes that hash by
client: each client address at the weight is one draw, not each connection. The task file's
own read-back and split tasks run in one local ansible-playbook, on route_info results made
up for each case.
"""

import json
from pathlib import Path

import pytest
import yaml
from local_playbook import run_local_playbook

REPO = Path(__file__).resolve().parents[2]
CONFIRM = REPO / "playbooks/tasks/canary_confirm.yml"
TASKS = ("Note what each node read back", "Work out each node's measured split")
SETTINGS = {
    "canary_split_min_connections": 200,
    "canary_split_sigmas": 4,
    "canary_split_floor_pct": 0.5,
}


def route(name, lookups, to_engine, clients=None):
    """A route as route_info returns it (weight 50 %), with the counters the split reads."""
    entry = {
        "name": name,
        "weight": 50,
        "weight_bp": 5000,
        "generation": 2,
        "hash": "client" if clients is not None else "connection",
        "counters": {"lookups": lookups, "to_engine": to_engine},
    }
    if clients is not None:
        entry["clients"] = dict(zip(("to_engine", "to_proxy"), clients))
    return entry


# name: (routes read back when the weight took, routes read after traffic came)
CASES = {
    # Connection-hash routes as before: 1000 new connections, 500 to the engine.
    "by_connection": ([route("chat", 100, 40)], [route("chat", 1100, 540)]),
    # 24 clients of 10 connections each at 50 %: 12 addresses to the engine. Judged as 24
    # draws; the 240 connections only say that traffic came.
    "by_client": ([route("chat", 0, 0, (0, 0))], [route("chat", 240, 120, (12, 12))]),
    # Every address on the proxy at 50 %: off, whatever the connections say.
    "by_client_off": ([route("chat", 0, 0, (0, 0))], [route("chat", 240, 0, (0, 24))]),
    # Few connections: not confirmed, however well the addresses split.
    "by_client_too_little": ([route("chat", 0, 0, (0, 0))], [route("chat", 60, 30, (3, 3))]),
    # One route of each kind: 400 connection draws and 40 address draws add up.
    "mixed": (
        [route("chat", 50, 25), route("embed", 10, 5, (1, 1))],
        [route("chat", 450, 225), route("embed", 410, 205, (20, 20))],
    ),
}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """{case: _canary_node_split}, worked out by the task file's own tasks."""
    work = tmp_path_factory.mktemp("canary-split")
    confirm = yaml.safe_load(CONFIRM.read_text())
    tasks = {task["name"]: task for task in confirm if task["name"] in TASKS}
    plays = []
    for case, (read_back, measured) in CASES.items():
        steps = [{k: v for k, v in tasks[name].items() if k != "when"} for name in TASKS]
        steps.append(
            {
                "name": "Keep the split of " + case,
                "ansible.builtin.copy": {
                    "content": "{{ _canary_node_split | to_json }}",
                    "dest": str(work / (case + ".json")),
                    "mode": "0600",
                },
            }
        )
        plays.append(
            {
                "name": "Split of " + case,
                "hosts": "localhost",
                "connection": "local",
                "gather_facts": False,
                "vars": {
                    **SETTINGS,
                    "canary_routes": [r["name"] for r in read_back],
                    "_canary_weight": 50,
                    "_canary_weight_bp": 5000,
                    "_canary_readback": {"routes": read_back},
                    "_canary_split_read": {"routes": measured},
                },
                "tasks": steps,
            }
        )
    run_local_playbook(plays, work, "split.yml")
    return {case: json.loads((work / (case + ".json")).read_text()) for case in CASES}


def test_connection_hash_routes_are_judged_by_their_connections_as_before(splits):
    split = splits["by_connection"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (1000, 0, 500)
    assert split["measured_pct"] == 50.0


def test_client_hash_routes_are_judged_by_their_addresses(splits):
    split = splits["by_client"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (240, 24, 12)
    assert split["measured_pct"] == 50.0
    # The binomial over 24 draws is wide; over 240 it would be far narrower.
    assert split["low_pct"] < 25 and split["high_pct"] > 75, split


def test_addresses_that_all_took_one_path_are_off(splits):
    split = splits["by_client_off"]
    assert split["ok"] is False and split["measured_pct"] == 0.0, split


def test_client_hash_routes_still_need_the_minimum_of_connections(splits):
    split = splits["by_client_too_little"]
    assert split["ok"] is False and split["connections"] == 60, split


def test_routes_of_both_kinds_add_their_draws(splits):
    split = splits["mixed"]
    assert split["ok"] is True, split
    assert (split["connections"], split["addresses"], split["to_engine"]) == (800, 40, 220)
