"""A short run of bench/fence_fanout.py: rollback.yml against simulated nodes with real
watchers, a real etcd and real pinned maps, fast and deep.

Structure and outcome only, never speed: the figures belong to the bench on a quiet machine.
What it does prove is the fleet path of rollback.yml: the watchers' acknowledgements
confirm most nodes, the silent ones are pushed (fast, and confirmed) or named unreachable
(deep), and every node's maps read back as the mode asks.
"""

import json
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
BENCH = REPO / "bench" / "fence_fanout.py"

pytestmark = pytest.mark.dataplane


def run_bench(out, *options):
    """The bench on 10 nodes, fast then deep: (fast run, deep run, its Markdown report)."""
    done = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "10", "--modes", "fast,deep", *options,
         "--out", str(out)],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (result_file,) = out.glob("fence-fanout-*.json")
    fast, deep = json.loads(result_file.read_text())
    return fast, deep, done.stdout


def test_fence_fanout_confirms_by_watcher_and_pushes_the_silent_nodes(tmp_path):
    fast, deep, report = run_bench(tmp_path, "--silent-pct", "20")
    for run in (fast, deep):
        assert (run["nodes"], run["silent"]) == (10, 2), run
        assert run["confirmed_by_watcher"] == 8, run
        assert run["silent_named"] is True, run
        assert run["read_back_wrong"] == 0, run["read_back_wrong_sample"]
        # The report's clock starts with the ansible-playbook process the bench launched.
        launched = run["bench_launch_unix"]
        assert launched - 0.05 <= run["started_at_unix"] <= launched + 1.0, run
    assert fast["pushed"] == 2 and fast["silent_pushed_ok"] is True and fast["playbook_rc"] == 0
    assert deep["unreachable"] == 2 and deep["playbook_rc"] != 0, deep
    assert "| fast | 10 | 2 |" in report and "| deep | 10 | 2 |" in report


def test_a_sharded_push_confirms_the_silent_nodes_from_several_processes(tmp_path):
    # Four silent nodes, pushed from two controller processes (rollback_push.yml once per
    # shard): fast, each confirmed by its shard's push; deep, each named unreachable.
    fast, deep, _report = run_bench(
        tmp_path, "--silent-pct", "40", "--push-shard-nodes", "1", "--push-processes", "2"
    )
    for run in (fast, deep):
        assert run["confirmed_by_watcher"] == 6, run
        assert [(shard["nodes"], shard["rc"]) for shard in run["push_shards"]] == [(2, 0), (2, 0)]
        assert run["silent_named"] is True, run
        assert run["read_back_wrong"] == 0, run["read_back_wrong_sample"]
    assert fast["pushed"] == 4 and fast["silent_pushed_ok"] is True and fast["playbook_rc"] == 0
    assert deep["unreachable"] == 4 and deep["playbook_rc"] != 0, deep
