"""The rollback's push over several controller processes (push_shards.py): which shards, what
each node's line says, and the processes themselves (a stand-in playbook command that writes
what a shard of rollback_push.yml writes, or fails, or hangs)."""

import json
import os
import sys
import tempfile
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.push_shards import (
    ShardError,
    merge,
    plan,
    run,
    shard_argv,
    shard_vars,
)

NODES = ["node-%03d" % index for index in range(10)]


def test_few_lagging_nodes_are_not_sharded():
    assert plan(NODES, shard_nodes=10, processes=8) == []
    assert plan(NODES[:3], shard_nodes=1, processes=1) == []
    # Enough for one shard only: the play pushes them itself.
    assert plan(NODES, shard_nodes=6, processes=8) == []


def test_shards_are_capped_by_processes_and_by_their_least_size():
    assert len(plan(NODES, shard_nodes=2, processes=3)) == 3
    assert len(plan(NODES, shard_nodes=4, processes=8)) == 2
    assert len(plan(NODES, shard_nodes=1, processes=100)) == 10


def test_every_node_is_in_exactly_one_shard_dealt_in_turn():
    shards = plan(NODES + NODES[:2], shard_nodes=3, processes=3)
    assert shards == [NODES[0::3], NODES[1::3], NODES[2::3]]
    flat = [node for shard in shards for node in shard]
    assert sorted(flat) == sorted(NODES)


@pytest.mark.parametrize(
    ("shard_nodes", "processes", "field"), [(0, 4, "shard_nodes"), (5, 0, "processes")]
)
def test_bad_plan_input_names_the_field(shard_nodes, processes, field):
    with pytest.raises(ShardError) as raised:
        plan(NODES, shard_nodes, processes)
    assert raised.value.field == field
    assert "at least 1" in str(raised.value)


def test_merge_takes_each_shards_lines_and_names_what_is_missing():
    shards = [["a", "b"], ["c"], ["d"]]
    line = {"node": "a", "reached": True, "confirmed": True, "confirmed_by": "push"}
    merged = merge(shards, [{"a": line, "b": None}, "exit status 4, no results; boom", {}])
    assert merged["a"] == line
    assert merged["b"]["confirmed"] is False
    assert merged["b"]["error"] == "push shard 0 wrote nothing for it"
    assert merged["c"]["error"] == "push shard 1 failed: exit status 4, no results; boom"
    assert merged["c"]["reached"] is False
    assert merged["d"]["error"] == "push shard 2 wrote nothing for it"
    assert set(merged) == {"a", "b", "c", "d"}


def test_a_shard_gets_its_nodes_as_its_modes_play_reads_them():
    assert shard_vars({"_rollback_epoch": 9}, "deep", ["a"], "/r.json") == {
        "_rollback_epoch": 9,
        "_rollback_push_deep": ["a"],
        "rollback_push_results_file": "/r.json",
    }
    with pytest.raises(ShardError) as raised:
        shard_vars({}, "slow", ["a"], "/r.json")
    assert raised.value.field == "mode"
    argv = shard_argv(["py", "-m", "pb"], ["/inv/a", "/inv/b"], "/p.yml", "/v.json")
    assert argv == ["py", "-m", "pb", "-i", "/inv/a", "-i", "/inv/b", "/p.yml", "-e", "@/v.json"]


# A stand-in for `python -m ansible.cli.playbook`: reads the shard's vars file as the push
# playbook does, then, by the node names, confirms them, exits 3 without results, or hangs.
STAND_IN = r"""
import json, os, sys, time
vars_file = sys.argv[sys.argv.index("-e") + 1][1:]
shard = json.load(open(vars_file))
nodes = shard.get("_rollback_push_fast", []) + shard.get("_rollback_push_deep", [])
with open(os.environ["STAND_IN_LOG"], "a") as log:
    entry = {"pid": os.getpid(), "nodes": nodes, "epoch": shard["_rollback_epoch"]}
    log.write(json.dumps(entry) + "\n")
if any(node.startswith("hang") for node in nodes):
    time.sleep(60)
if any(node.startswith("fail") for node in nodes):
    print("the shard broke")
    sys.exit(3)
lines = {node: {"node": node, "reached": True, "confirmed": True, "confirmed_by": "push",
                "fence_epoch": shard["_rollback_epoch"]} for node in nodes}
json.dump(lines, open(shard["rollback_push_results_file"], "w"))
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    log = tmp_path / "shards.log"
    monkeypatch.setenv("STAND_IN_LOG", str(log))
    return [sys.executable, str(script)], log


def test_run_pushes_every_shard_in_a_process_of_its_own(stand_in):
    command, log = stand_in
    shards = plan(NODES, shard_nodes=3, processes=3)
    merged, summaries = run(shards, command, ["/inv"], "/p.yml", {"_rollback_epoch": 5}, "fast", 30)
    assert sorted(merged) == sorted(NODES)
    assert all(line["confirmed"] and line["fence_epoch"] == 5 for line in merged.values())
    seen = [json.loads(line) for line in log.read_text().splitlines()]
    assert len({entry["pid"] for entry in seen}) == 3
    assert sorted(node for entry in seen for node in entry["nodes"]) == sorted(NODES)
    assert [summary["rc"] for summary in summaries] == [0, 0, 0]


def test_a_failed_or_hung_shard_leaves_its_nodes_unconfirmed_and_the_others_confirmed(stand_in):
    command, _log = stand_in
    shards = [["ok-1", "ok-2"], ["fail-1"], ["hang-1", "hang-2"]]
    started = time.monotonic()
    merged, summaries = run(shards, command, ["/inv"], "/p.yml", {"_rollback_epoch": 6}, "deep", 3)
    assert time.monotonic() - started < 20
    assert merged["ok-1"]["confirmed"] and merged["ok-2"]["confirmed"]
    assert (
        "push shard 1 failed: exit status 3, no results; the shard broke"
        == merged["fail-1"]["error"]
    )
    for node in ("hang-1", "hang-2"):
        assert merged[node]["confirmed"] is False
        assert merged[node]["error"] == "push shard 2 failed: no answer within 3 s"
    assert [summary["rc"] for summary in summaries] == [0, 3, None]


def test_run_leaves_no_file_behind(stand_in, tmp_path, monkeypatch):
    command, _log = stand_in
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setattr(tempfile, "tempdir", None)
    run([["a"], ["b"]], command, ["/inv"], "/p.yml", {"_rollback_epoch": 1}, "fast", 30)
    assert os.listdir(scratch) == []
