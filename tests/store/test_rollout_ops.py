"""A person's actions on the rollout store (rollout_ops, `zerolayer rollout`), the runner's
guard that honours them, and the records' compare-and-swap, against a real etcd."""

import datetime
import json
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import fence_watcher
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_guard,
    rollout_ops,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)

from .adhoc import run_module
from .planted_records import SCHEDULE, T0, completed, planted, record_of


def standing(records, store, epoch, stage=None, owner=None):
    """What stops the runner (rollout_guard's stop without the record it read)."""
    return rollout_guard.standing_and_record(records, store, epoch, stage, owner)[0]


REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def test_pause_is_seen_by_the_runner_at_its_next_evaluation(store):
    planted(store)
    runner_view = StoreRecords(store, "chat-a/wave_canary")
    assert standing(runner_view, store, 0, stage=0) is None
    rollout_ops.pause(store, "chat-a", "look at the p99 page", "oncall@laptop")
    decision, reason = standing(runner_view, store, 0, stage=0)
    assert decision == "paused" and "oncall@laptop" in reason and "p99 page" in reason
    assert record_of(store, "chat-a/wave_rest")["outcome"] == "paused", "every wave in progress"


def test_promote_ends_the_hold_for_the_runner(store):
    planted(store)
    rollout_ops.promote(store, "chat-a", "enough data", "oncall@laptop")
    decision, reason = standing(StoreRecords(store, "chat-a/wave_canary"), store, 0, stage=0)
    assert decision == "complete" and "promote by oncall@laptop" in reason
    assert record_of(store, "chat-a/wave_rest")["stage"]["status"] == "pending", "one wave only"


def test_promote_full_moves_every_wave_and_stops_the_runner(store):
    planted(store)
    rollout_ops.promote(store, "chat-a", "go", "oncall@laptop", full=True)
    decision, _reason = standing(StoreRecords(store, "chat-a/wave_canary"), store, 0, stage=0)
    assert decision == "moved"
    assert {
        record_of(store, "chat-a/%s" % w)["stage"]["index"] for w in ("wave_canary", "wave_rest")
    } == {2}


def test_a_raised_fence_stops_the_runner_whatever_its_rollout_id(store):
    planted(store, "chat-b")
    store.raise_fence("fast", "p99 page", "oncall@laptop")
    decision, reason = standing(StoreRecords(store, "chat-b/wave_canary"), store, 0, stage=0)
    assert decision == "fenced" and "from 0 to 1" in reason and "p99 page" in reason


def test_a_runner_whose_lease_lapsed_stops_at_its_next_evaluation(store):
    """A partition longer than the TTL: the heartbeat could not renew the lease (revoked
    here, as etcd does at the TTL) and a second runner took the scope. The first runner's
    next evaluation stops it, naming the new holder, before any gate is read."""
    planted(store)
    runner_view = StoreRecords(store, "chat-a/wave_canary")
    mine = store.acquire("gpu_nodes", {"host": "ctl-1", "pid": 11, "rollout_id": "chat-a"}, 10)
    owner = ("gpu_nodes", mine["lease"])
    assert standing(runner_view, store, 0, stage=0, owner=owner) is None
    store.client.revoke_lease(mine["lease"])
    decision, reason = standing(runner_view, store, 0, stage=0, owner=owner)
    assert decision == "owner_lost" and "nobody holds it now" in reason
    store.acquire("gpu_nodes", {"host": "ctl-2", "pid": 22, "rollout_id": "chat-b"}, 10)
    decision, reason = standing(runner_view, store, 0, stage=0, owner=owner)
    assert decision == "owner_lost" and "host ctl-2, pid 22, rollout chat-b" in reason


def test_the_gate_module_stops_a_runner_without_its_lease_and_reads_no_gate(store, tmp_path):
    """canary_gate with owner_scope/owner_lease: decision owner_lost, nothing evaluated
    (Prometheus here is a closed port: a query would fail the module), no history."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import hold_evaluation

    planted(store)
    mine = store.acquire("gpu_nodes", {"host": "ctl-1", "pid": 11, "rollout_id": "chat-a"}, 10)
    store.client.revoke_lease(mine["lease"])
    params = gate_params(
        store, tmp_path, owner_scope="gpu_nodes", owner_lease=mine["lease"], epoch=0
    )
    result = hold_evaluation.run(params, check_mode=False)
    assert (result["decision"], result["gates"]) == ("owner_lost", [])
    assert "no longer owns scope gpu_nodes" in result["decision_reason"]
    assert not (tmp_path / "gates.json").exists(), "no history written"


def test_a_resume_from_the_command_line_gives_the_runner_a_fresh_gate_history(store, tmp_path):
    """A pause latched by the gates (max_holds) stays the stage's decision until a person
    resumes; the resume made by `zerolayer rollout resume`, in the store's record, starts the
    history afresh at the runner's next evaluation: the runner needs no flag of its own."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import hold_evaluation

    planted(store)
    params = gate_params(store, tmp_path, max_holds=0)
    latched = hold_evaluation.run(params, check_mode=False)
    assert latched["decision"] == "pause", latched
    assert hold_evaluation.run(params, check_mode=False)["decision"] == "pause", "latched"
    rollout_ops.pause(store, "chat-a", latched["decision_reason"], "runner@ctl")
    rollout_ops.resume(store, "chat-a", "Prometheus is back", "oncall@laptop")
    fresh = hold_evaluation.run(dict(params, max_holds=5), check_mode=False)
    assert (fresh["decision"], fresh["history_reset"], fresh["holds"]) == ("continue", True, 1)
    kept = hold_evaluation.run(dict(params, max_holds=5), check_mode=False)
    assert (kept["history_reset"], kept["holds"]) == (False, 2)


def test_resume_of_a_fenced_rollout_is_refused_and_changes_nothing(store):
    planted(store)
    rollout_ops.pause(store, "chat-a", "hold on", "oncall@laptop")
    store.raise_fence("fast", "rollback", "oncall@laptop")
    before = record_of(store, "chat-a/wave_canary")
    with pytest.raises(FleetError) as refused:
        rollout_ops.resume(store, "chat-a", "go on", "oncall@laptop")
    assert refused.value.details["outcome"] == "refused"
    assert "took fence epoch 0" in refused.value.message and "now 1" in refused.value.message
    assert record_of(store, "chat-a/wave_canary") == before


def test_unknown_ids_and_waves_are_refused_listing_the_known(store):
    planted(store)
    with pytest.raises(FleetError) as unknown:
        rollout_ops.pause(store, "chat-z", "x", "me")
    assert unknown.value.details == {"field": "rollout_id", "outcome": "bad_input"}
    assert "known: chat-a" in unknown.value.message
    with pytest.raises(FleetError) as wave:
        rollout_ops.pause(store, "chat-a", "x", "me", wave="wave_nope")
    assert "wave_canary, wave_rest" in wave.value.message


def test_promote_on_a_finished_rollout_is_refused(store):
    planted(store)
    for wave in ("wave_canary", "wave_rest"):
        records = StoreRecords(store, "chat-a/%s" % wave)
        record, token = records.read()
        records.write(rollout.apply(record, "abort", {}, T0, "runner")[0], token)
    with pytest.raises(FleetError) as refused:
        rollout_ops.promote(store, "chat-a", "x", "me")
    assert refused.value.details["outcome"] == "refused"


def test_abort_raises_the_fence_first_and_marks_every_wave(store):
    planted(store)
    completed(store, "chat-done", T0, epoch=0)
    result = rollout_ops.abort(store, "chat-a", "bad answers", "oncall@laptop")
    assert result["fence"]["epoch"] == 1 and result["fence"]["action"] == "abort"
    assert {w["outcome"] for w in result["waves"].values()} == {"aborted"}
    assert [e["action"] for e in rollout_ops.history(store, "chat-a")][-2:] == ["abort", "abort"]
    # Its fence took the completed rollout's nodes back to the proxy too.
    assert result["completed_rolled_back"] == ["chat-done/wave_all"]
    done = record_of(store, "chat-done/wave_all")
    assert done["outcome"] == "rolled_back" and done["rollback"]["details"]["mode"] == "abort"


def test_two_writers_of_one_record_cannot_both_win(store):
    planted(store)
    runner = StoreRecords(store, "chat-a/wave_canary")
    record, token = runner.read()
    rollout_ops.pause(store, "chat-a", "from another shell", "oncall@laptop")
    stale, _changed = rollout.apply(record, "stage_completed", {}, T0, "runner")
    with pytest.raises(FleetError) as lost:
        runner.write(stale, token)
    assert "pause by oncall@laptop" in lost.value.message
    assert record_of(store, "chat-a/wave_canary")["outcome"] == "paused", "the pause stuck"


def test_status_shows_fence_owner_and_each_wave(store):
    planted(store)
    store.acquire("gpu_nodes", {"host": "ctl", "pid": 42, "rollout_id": "chat-a", "since": "x"}, 10)
    report = rollout_ops.status(store, "chat-a")
    assert (
        report["owners"]["gpu_nodes"]["pid"] == 42
        and report["owners"]["gpu_nodes"]["ttl_left_s"] > 0
    )
    wave = report["rollouts"]["chat-a"]["wave_canary"]
    assert (wave["stage_status"], wave["weight"], wave["fenced"]) == ("holding", 1, False)
    text = rollout_cli.render_status(report)
    assert "owner of gpu_nodes: ctl pid 42" in text and "wave_canary" in text


def test_status_shows_a_wave_stuck_past_its_deadline_and_a_live_owner_clears_it(store):
    records = StoreRecords(store, "chat-s/wave_canary")
    record, _c, _n = rollout.plan(
        None, "chat-s:wave_canary", SCHEDULE, None, False, T0, "runner@ctl",
        progress={"deadline_s": 600, "abort": False},
    )  # fmt: skip
    records.write(record, 0)
    report = rollout_ops.status(store)
    progress = report["rollouts"]["chat-s"]["wave_canary"]["progress"]
    assert progress["stuck"] is True and progress["deadline_s"] == 600
    assert progress["idle_s"] >= 3600 - 5
    text = rollout_cli.render_status(report)
    assert " STUCK " in text and "stuck: no progress since %s" % record["updated_at"] in text
    assert "deadline 600s" in text and "resume it (canary.yml)" in text
    holder = store.acquire("gpu_nodes", {"host": "ctl", "pid": 7, "rollout_id": "chat-s"}, 10)
    try:
        again = rollout_ops.status(store, "chat-s")
    finally:
        store.release("gpu_nodes", holder["lease"])
    assert again["rollouts"]["chat-s"]["wave_canary"]["progress"]["stuck"] is False
    assert "STUCK" not in rollout_cli.render_status(again)


def cli(etcd_url, store, *argv):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "zerolayer"), "--endpoints", etcd_url,
         "--prefix", store.prefix, *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_the_command_gives_a_distinct_exit_status_per_outcome(etcd_url, store):
    planted(store)
    assert cli(etcd_url, store, "rollout", "pause", "chat-z")[0] == rollout_cli.EXIT_BAD_INPUT
    status, out, _err = cli(etcd_url, store, "-o", "json", "rollout", "pause", "chat-a")
    assert status == 0 and json.loads(out)["waves"]["wave_canary"]["outcome"] == "paused"
    store.raise_fence("fast", "rollback", "me")
    status, _out, err = cli(etcd_url, store, "rollout", "resume", "chat-a")
    assert status == rollout_cli.EXIT_REFUSED and "fence" in err
    status, out, _err = cli(etcd_url, store, "-o", "json", "rollout", "status", "chat-a")
    assert status == 0 and json.loads(out)["rollouts"]["chat-a"]["wave_canary"]["fenced"] is True
    status, out, _err = cli(etcd_url, store, "rollout", "history", "chat-a")
    assert status == 0 and "pause" in out
    unreachable = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "zerolayer"), "--endpoints",
         "http://127.0.0.1:9", "rollout", "status"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert unreachable.returncode == rollout_cli.EXIT_UNREACHABLE
    assert cli(etcd_url, store, "rollout", "frobnicate", "x")[0] == rollout_cli.EXIT_BAD_INPUT


def test_abort_with_the_store_down_still_pushes_weight_0_to_the_nodes(monkeypatch, capsys):
    """The store cannot be written (here: nothing listens): with an inventory the abort still
    rolls the inventory's nodes back, without an epoch and without a store, so that each
    node fences itself; without one, or for a bad id the store refused, nothing is pushed.
    (The push itself: tests/store/test_rollback_command.py.)"""
    pushed = []

    def push(args, settings, epoch):
        pushed.append((args.inventory, settings, epoch, args.reason))
        return {"mode": "fast", "nodes_confirmed": 1, "nodes_total": 1, "wall_time_s": 0.5,
                "budget_s": 30, "within_budget": True, "confirmed_by_watcher": [],
                "pushed": ["n1"], "store_updated": False, "store_error": "down",
                "unreachable": [], "not_confirmed": []}  # fmt: skip

    monkeypatch.setattr(rollout_cli, "_push_abort", push)
    down = ["--endpoints", "http://127.0.0.1:9", "-o", "json", "rollout", "abort", "chat-a"]
    assert rollout_cli.main([*down, "-i", "inv.yml", "--reason", "p99"]) == rollout_cli.EXIT_OK
    assert pushed == [(["inv.yml"], {}, None, "p99")]
    said = json.loads(capsys.readouterr().out)
    assert said["rollback"]["pushed"] == ["n1"], said
    assert said["fence"] is None and said["store_error"], said
    pushed.clear()
    assert rollout_cli.main(down) == rollout_cli.EXIT_UNREACHABLE and pushed == []


def test_abort_of_an_unknown_rollout_pushes_nothing(etcd_url, store, monkeypatch):
    planted(store)
    monkeypatch.setattr(rollout_cli, "_push_abort", lambda *args: pytest.fail("pushed"))
    argv = ["--endpoints", etcd_url, "--prefix", store.prefix, "rollout", "abort", "chat-z"]
    assert rollout_cli.main([*argv, "-i", "inv.yml"]) == rollout_cli.EXIT_BAD_INPUT
    assert store.fence()["epoch"] == 0


def test_status_watch_redraws_a_set_number_of_times(etcd_url, store):
    planted(store)
    status, out, _err = cli(etcd_url, store, "rollout", "status", "-w", "--interval", "0.1",
                            "--count", "2")  # fmt: skip
    # The first draw is the whole screen; nothing changed by the second (the hold is long
    # over), so it rewrites no line and only parks the cursor below the table.
    assert status == 0 and out.startswith("\x1b[2J\x1b[H") and out.count("fence epoch") == 1
    rows = out.count("\n")
    assert out.endswith("\n\x1b[%d;1H" % (rows + 1)) and out.count("\x1b[2K") == 0, repr(out)


def test_status_shows_each_node_with_the_split_its_stage_measured(store):
    planted(store)
    records = StoreRecords(store, "chat-a/wave_canary")
    record, token = records.read()
    read_back = {"weight": 1, "generation": 4}
    confirmed = {"nodes": {"n1": read_back, "n2": read_back}}
    record, _c = rollout.apply(record, "weight_confirmed", confirmed, T0, "runner")
    agreeing = {"low_pct": 0.2, "high_pct": 2.5}
    splits = {
        "n1": dict(agreeing, ok=True, measured_pct=1.1),
        "n2": dict(agreeing, ok=False, measured_pct=7.0),
    }
    record, _c = rollout.apply(record, "split_measured", {"splits": splits}, T0, "runner")
    records.write(record, token)
    text = rollout_cli.render_status(rollout_ops.status(store, "chat-a"))
    assert "n1 1% (split 1.1%)" in text and "n2 1% (split 7.0% OFF)" in text, text


# ---------------------------------------------------------------- finished rollouts


def test_a_completed_rollout_rolled_back_since_never_reads_completed(store):
    completed(store, "chat-old", T0, epoch=0)
    planted(store, "chat-now", epoch=0)
    assert (
        rollout_ops.status(store, "chat-old")["rollouts"]["chat-old"]["wave_all"]["rolled_back_by"]
        is None
    ), "no rollback yet: completed stands"
    store.raise_fence("fast", "p99 page", "oncall@laptop")
    report = rollout_ops.status(store, "chat-old")
    row = report["rollouts"]["chat-old"]["wave_all"]
    assert row["outcome"] == "completed" and row["rolled_back_by"]["epoch"] == 1
    assert row["rolled_back_by"]["actor"] == "oncall@laptop"
    text = rollout_cli.render_status(report)
    assert "rolled back" in text and "rolled back at epoch 1 by oncall@laptop" in text
    assert " completed " not in text
    # What the nodes' watchers read back after that fence: n1 confirmed at 0, n2 silent.
    assert row["nodes_after_rollback"] == {"n1": {"confirmed": False}, "n2": {"confirmed": False}}
    store.client.put(
        store.key("acks", "n1"),
        {"node": "n1", "epoch": 1, "action": "fast", "confirmed": True,
         "read_back": {"weights_bp": {"chat": 0, "embed": 0}}},
    )  # fmt: skip
    report = rollout_ops.status(store, "chat-old")
    after = report["rollouts"]["chat-old"]["wave_all"]["nodes_after_rollback"]
    assert after["n1"] == {"confirmed": True, "epoch": 1, "weights_bp": {"chat": 0, "embed": 0}}
    assert after["n2"] == {"confirmed": False}
    assert "nodes since: n1 0% (epoch 1), n2 not confirmed" in rollout_cli.render_status(report)
    # Without an id: only the rollouts in progress; the finished ones are counted.
    everything = rollout_ops.status(store)
    assert set(everything["rollouts"]) == set(), "chat-now was fenced by the raise too"
    planted(store, "chat-new", epoch=1)
    everything = rollout_ops.status(store)
    assert set(everything["rollouts"]) == {"chat-new"} and everything["finished_rollouts"] == 2
    assert "2 finished rollout(s) not shown" in rollout_cli.render_status(everything)


def seen_on_node(weight_bp, epoch=0):
    """A fence watcher's read_back() of a node with one route, chat."""
    return {
        "node_epoch": epoch,
        "attached": True,
        "mode": "steer",
        "weights_bp": {"chat": weight_bp},
    }


def nodes_column(report, rollout_id, wave="wave_all"):
    row = report["rollouts"][rollout_id][wave]
    return row["live"], rollout_cli.render_status(report)


def test_status_shows_each_nodes_weight_now_beside_the_records_and_marks_a_difference(store):
    planted(store, "chat-now", waves=("wave_all",))
    records = StoreRecords(store, "chat-now/wave_all")
    record, token = records.read()
    confirmed = {
        "nodes": {"n1": {"weight": 1, "generation": 1}, "n2": {"weight": 1, "generation": 1}}
    }
    record, _c = rollout.apply(record, "weight_confirmed", confirmed, T0, "runner")
    records.write(record, token)
    n1 = fence_watcher.LiveReading(store, "n1")
    assert n1.publish(seen_on_node(100)) is True
    written_at = store.client.get(store.key("acks", "n1", "live")).mod_revision
    # Unchanged weights renew the lease and write nothing: no revision per node per recheck.
    assert n1.publish(seen_on_node(100)) is False
    assert store.client.get(store.key("acks", "n1", "live")).mod_revision == written_at
    live, text = nodes_column(rollout_ops.status(store, "chat-now"), "chat-now")
    assert live["n1"]["weights_bp"] == {"chat": 100} and live["n1"]["differs"] is False
    assert live["n2"] == {"weights_bp": None, "differs": None}, "n2 has no watcher"
    assert "n1 1% now 1%, n2 1% now unknown (no watcher)" in text
    # A hand-run rollback on n1 (or a push that did not reach it): the node is not where the
    # rollout in progress put it.
    assert n1.publish(seen_on_node(0)) is True
    live, text = nodes_column(rollout_ops.status(store, "chat-now"), "chat-now")
    assert live["n1"]["differs"] is True and "n1 1% now 0% DIFFERS" in text
    # A watcher that stops takes its reading with it.
    n1.withdraw()
    live, _text = nodes_column(rollout_ops.status(store, "chat-now"), "chat-now")
    assert live["n1"]["weights_bp"] is None


def test_after_a_rollback_status_shows_the_weights_now_and_judges_no_finished_wave(store):
    completed(store, "chat-old", T0, epoch=0)
    n1 = fence_watcher.LiveReading(store, "n1")
    n1.publish(seen_on_node(10000))
    store.raise_fence("fast", "p99 page", "oncall@laptop")
    n1.publish(seen_on_node(0, epoch=1))
    live, text = nodes_column(rollout_ops.status(store, "chat-old"), "chat-old")
    assert live["n1"]["weights_bp"] == {"chat": 0} and live["n1"]["node_epoch"] == 1
    assert "n1 100% now 0%," in text and "rolled back at epoch 1" in text
    # A later rollout may own the nodes of a finished wave: its weights are shown, not judged.
    n1.publish(seen_on_node(500, epoch=1))
    live, text = nodes_column(rollout_ops.status(store, "chat-old"), "chat-old")
    assert live["n1"]["differs"] is None and "n1 100% now 5%," in text and "DIFFERS" not in text
    n1.withdraw()


def test_a_live_reading_ends_with_its_lease_and_is_written_again_after(store):
    planted(store, "chat-a", waves=("wave_all",))
    node = fence_watcher.LiveReading(store, "n1", ttl_s=2)
    node.publish(seen_on_node(100))
    key = store.key("acks", "n1", "live")
    assert store.client.get(key) is not None
    deadline = time.monotonic() + 15
    while store.client.get(key) is not None and time.monotonic() < deadline:
        time.sleep(0.5)
    assert store.client.get(key) is None, "the lease ran out: the reading must be gone"
    # The next recheck finds its lease gone and writes the same weights on a new one.
    assert node.publish(seen_on_node(100)) is True
    assert store.client.get(key).json()["weights_bp"] == {"chat": 100}
    node.withdraw()


def test_list_shows_every_rollout_newest_first_with_how_it_ended(store):
    completed(store, "chat-1", T0 - datetime.timedelta(days=3))
    completed(store, "chat-2", T0 - datetime.timedelta(days=1))
    planted(store, "chat-3")
    listing = rollout_ops.rollouts(store)
    assert [row["rollout_id"] for row in listing["rollouts"]] == ["chat-3", "chat-2", "chat-1"]
    assert [row["standing"] for row in listing["rollouts"]] == [
        "in progress", "completed", "completed",
    ]  # fmt: skip
    store.raise_fence("fast", "rollback", "oncall@laptop")
    standing = {
        row["rollout_id"]: row["standing"] for row in rollout_ops.rollouts(store)["rollouts"]
    }
    assert standing == {"chat-3": "fenced", "chat-2": "rolled back", "chat-1": "rolled back"}
    limited = rollout_ops.rollouts(store, limit=1)
    assert [row["rollout_id"] for row in limited["rollouts"]] == ["chat-3"]
    assert limited["total"] == 3
    recent = rollout_ops.rollouts(store, since=T0 - datetime.timedelta(days=2))
    assert [row["rollout_id"] for row in recent["rollouts"]] == ["chat-3", "chat-2"]


def test_list_by_the_command_takes_since_and_limit_and_refuses_bad_ones(etcd_url, store):
    completed(store, "chat-1", T0 - datetime.timedelta(days=3))
    planted(store, "chat-2")
    status, out, _err = cli(etcd_url, store, "rollout", "list", "--since", "2d", "-o", "json")
    assert status == 0 and [r["rollout_id"] for r in json.loads(out)["rollouts"]] == ["chat-2"]
    status, out, _err = cli(etcd_url, store, "rollout", "list", "--limit", "1")
    assert status == 0 and "chat-2" in out and "1 of 2 shown" in out
    status, _out, err = cli(etcd_url, store, "rollout", "list", "--since", "yesterday")
    assert status == rollout_cli.EXIT_BAD_INPUT and "30m, 6h, 7d" in err
    status, _out, err = cli(etcd_url, store, "rollout", "list", "--limit", "0")
    assert status == rollout_cli.EXIT_BAD_INPUT and "--limit" in err


def test_a_rollback_marks_the_superseded_records_from_the_store(store, tmp_path):
    """The store is the list: a completed rollout of another controller is marked, and every
    wave of the rollout the rollback was run for (an aborted one gains the rollback); a
    running rollout of someone else stays running (it reads fenced and may be taken on
    purpose); a rollout at the fence's own epoch is not touched; the controller's copy is
    rewritten where it exists and none is created."""
    completed(store, "chat-old", T0, epoch=1)
    planted(store, "chat-now", epoch=2)
    planted(store, "chat-other", waves=("wave_all",), epoch=2)
    planted(store, "chat-stopped", waves=("wave_all",), epoch=2)
    rollout_ops.abort(store, "chat-stopped", "by hand", "oncall@laptop")
    planted(store, "chat-next", waves=("wave_all",), epoch=4)
    mirror = tmp_path / "chat-old" / "wave_all.json"
    mirror.parent.mkdir()
    record_codec.write_record(str(mirror), record_of(store, "chat-old/wave_all"))
    untouched = {
        key: record_of(store, key) for key in ("chat-next/wave_all", "chat-other/wave_all")
    }
    details = {"mode": "fast"}

    def mark(rollout_id, check=False):
        return rollout_ops.mark_rolled_back(
            store, 4, "fast rollback: p99", details, "oncall@ctl-2", rollout_id=rollout_id,
            mirror_dir=str(tmp_path), check=check,
        )  # fmt: skip

    would = mark("chat-now", check=True)
    assert record_of(store, "chat-old/wave_all")["outcome"] == "completed", "check writes nothing"
    done = mark("chat-now")
    assert done == would
    assert done["marked"] == ["chat-now/wave_canary", "chat-now/wave_rest", "chat-old/wave_all"]
    assert done["unchanged"] == [] and done["not_marked"] == {}
    old = record_of(store, "chat-old/wave_all")
    assert old["outcome"] == "rolled_back" and old["rollback"]["by"] == "oncall@ctl-2"
    assert old["rollback"]["details"] == details
    assert record_of(store, "chat-now/wave_canary")["outcome"] == "rolled_back"
    for key, record in untouched.items():
        assert record_of(store, key) == record, key
    assert record_codec.read_record(str(mirror))["outcome"] == "rolled_back", "the copy follows"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat-old"], "no copy created"
    # The aborted rollout's own rollback: it stays aborted and gains the rollback.
    assert mark("chat-stopped")["marked"] == ["chat-stopped/wave_all"]
    stopped = record_of(store, "chat-stopped/wave_all")
    assert stopped["outcome"] == "aborted" and stopped["rollback"]["reason"] == "fast rollback: p99"
    # Once more: nothing left to mark (a record already rolled back is no longer completed).
    again = mark("chat-now")
    assert again["marked"] == [] and again["unchanged"] == [
        "chat-now/wave_canary", "chat-now/wave_rest"]  # fmt: skip
    # Status names the rollback a marked record keeps (its epoch is in the details).
    planted(store, "chat-later", waves=("wave_all",), epoch=4)
    later = {"mode": "fast", "fence_epoch": "5"}
    rollout_ops.mark_rolled_back(store, 5, "fast rollback: drill", later, "ci@ctl", "chat-later")
    row = rollout_ops.status(store, "chat-later")["rollouts"]["chat-later"]["wave_all"]
    assert row["outcome"] == "rolled_back"
    assert row["rolled_back_by"]["epoch"] == 5 and row["rolled_back_by"]["actor"] == "ci@ctl"
    assert "rolled back at epoch 5 by ci@ctl" in rollout_cli.render_status(
        rollout_ops.status(store, "chat-later")
    )
    with pytest.raises(FleetError, match="fence_epoch must be a whole number >= 1"):
        rollout_ops.mark_rolled_back(store, 0, "x", {}, "oncall@ctl-2")
    with pytest.raises(FleetError, match="rollout_id"):
        rollout_ops.mark_rolled_back(store, 5, "x", {}, "oncall@ctl-2", rollout_id="no/slash")


def test_a_record_that_keeps_changing_is_named_and_the_others_are_still_marked(
    etcd_url, store, monkeypatch
):
    completed(store, "chat-old", T0, epoch=1)
    planted(store, "chat-now", waves=("wave_all",), epoch=1)
    write = StoreRecords.write

    def one_record_keeps_changing(self, record, token):
        if self.record_key == "chat-now/wave_all":
            raise FleetError("the record changed while this action was worked out", {})
        return write(self, record, token)

    monkeypatch.setattr(StoreRecords, "write", one_record_keeps_changing)
    result = rollout_ops.mark_rolled_back(
        store, 2, "deep rollback: drill", {}, "ci@ctl", rollout_id="chat-now"
    )
    assert result["marked"] == ["chat-old/wave_all"]
    assert list(result["not_marked"]) == ["chat-now/wave_all"]
    assert record_of(store, "chat-now/wave_all")["outcome"] == "running"


def test_the_records_module_marks_in_check_mode_nothing_and_then_the_superseded(etcd_url, store):
    completed(store, "chat-old", T0, epoch=1)
    planted(store, "chat-next", waves=("wave_all",), epoch=2)
    args = dict(fence_epoch=2, reason="fast rollback: p99", details={"mode": "fast"})
    checked = run_module("rollout_records", etcd_url, store.prefix, check=True, **args)
    assert checked["changed"] is True and checked["marked"] == ["chat-old/wave_all"], checked
    assert record_of(store, "chat-old/wave_all")["outcome"] == "completed"
    done = run_module("rollout_records", etcd_url, store.prefix, **args)
    assert done["changed"] is True and done["marked"] == ["chat-old/wave_all"], done
    assert record_of(store, "chat-old/wave_all")["outcome"] == "rolled_back"
    assert record_of(store, "chat-next/wave_all")["outcome"] == "running"
    again = run_module("rollout_records", etcd_url, store.prefix, **args)
    assert again["changed"] is False and again["marked"] == [] == again["unchanged"], again
    args["fence_epoch"] = 0
    bad = run_module("rollout_records", etcd_url, store.prefix, **args)
    assert bad["failed"] is True and "fence_epoch must be a whole number >= 1" in bad["msg"]


def gate_params(store, tmp_path, **overrides):
    """canary_gate's parameters for wave_canary's stage 1 of chat-a, reading its record in the
    store; Prometheus is a closed port, so every gate holds (unreachable)."""
    params = {
        "prometheus_url": "http://127.0.0.1:9",
        "timeout": 1,
        "bearer_token": None,
        "validate_certs": True,
        "ca_path": None,
        "gates": [{"name": "success_rate", "query": "up", "comparison": ">=", "threshold": 1}],
        "window": "5m",
        "state_file": str(tmp_path / "gates.json"),
        "rollout_id": "chat-a:wave_canary",
        "stage": 0,
        "weight": 1,
        "hold": 60,
        "stage_nodes": ["zl-node-01"],
        "hold_started_at": None,
        "consecutive_failure_limit": 3,
        "failure_limit": 5,
        "max_holds": 60,
        "max_hold_extension": "2h",
        "reset_history": False,
        "interval": 10,
        "record_path": None,
        "record_key": "chat-a/wave_canary",
        "epoch": None,
        "owner_scope": None,
        "owner_lease": None,
        "store_timeout": 3.0,
        "endpoints": store.client.endpoints,
        "ca_file": None,
        "cert_file": None,
        "key_file": None,
        "user": None,
        "password_file": None,
        "prefix": store.prefix,
    }
    params.update(overrides)
    return params
