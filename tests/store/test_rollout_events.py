"""Rollout events in a real etcd: stored with the record in one transaction, listed in the
store's order, and sent to a local webhook receiver by every actor (the record's writer, the
operator's command, the rollout_event module) after its act."""

import datetime
import json
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events as ev

from .adhoc import run_module

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SENT_WITHIN_S = 30


def sender_done(store, receiver=None, count=0):
    """Waits until the fleet's sender has ended (and receiver got count bodies); bounded."""
    deadline = time.monotonic() + SENT_WITHIN_S
    while time.monotonic() < deadline:
        got = len(receiver.received) if receiver else 0
        if store.client.get(notify.sender_key(store)) is None and got >= count:
            return
        time.sleep(0.1)
    pytest.fail("the sender did not finish within %d s" % SENT_WITHIN_S)


SCHEDULE = [{"weight": 1, "hold": 60}, {"weight": 100}]
T0 = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=10)


def later(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def write(records, action, seconds, **params):
    record, token = records.read()
    if action == "plan":
        after, _c, _n = rollout.plan(record, "chat-a:canary", SCHEDULE, None, False, later(seconds),
                                     "runner@ctl")  # fmt: skip
    else:
        after, _c = rollout.apply(record, action, params, later(seconds), "runner@ctl")
    return records.write(after, token)


def test_a_record_write_stores_its_events_in_the_same_transaction(store):
    records = StoreRecords(store, "chat-a/canary")
    assert [e["type"] for e in write(records, "plan", 0)] == ["started"]
    write(records, "stage_started", 1, stage=0)
    write(records, "hold_started", 2)
    written = write(records, "pause", 3, reason="look at p99")
    assert [e["type"] for e in written] == ["paused"]
    listed = ev.list_events(store, "chat-a")
    assert [e["type"] for e in listed] == ["started", "stage_started", "hold_started", "paused"]
    assert listed[-1]["reason"] == "look at p99" and listed[-1]["wave"] == "canary"
    assert listed[-1]["stage"] == 1 and listed[-1]["weight"] == 1


def test_a_write_that_loses_the_swap_stores_no_event(store):
    records = StoreRecords(store, "chat-a/canary")
    write(records, "plan", 0)
    record, token = records.read()
    # Another actor changes the record between this read and this write.
    other = StoreRecords(store, "chat-a/canary")
    write(other, "stage_started", 1, stage=0)
    paused, _changed = rollout.apply(record, "pause", {"reason": "late"}, later(2), "me")
    with pytest.raises(FleetError, match="changed while"):
        records.write(paused, token)
    assert [e["type"] for e in ev.list_events(store, "chat-a")] == ["started", "stage_started"]


def test_fleet_events_are_listed_with_a_rollout_after_its_start(store):
    ev.emit(store, ev.event("fleet_rolled_back", None, "2026-01-01T00:00:00Z", "me", mode="fast"))
    write(StoreRecords(store, "chat-a/canary"), "plan", 0)
    ev.emit(store, ev.event("fleet_rolled_back", None, "2026-01-01T00:00:01Z", "me", mode="deep"))
    listed = ev.list_events(store, "chat-a")
    assert [(e["type"], e["detail"].get("mode")) for e in listed] == [
        ("started", None),
        ("fleet_rolled_back", "deep"),
    ]


def cli(etcd_url, store, *argv):
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "scripts", "zerolayer"), "--endpoints", etcd_url,
         "--prefix", store.prefix, "-o", "json", *argv],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    return proc.returncode, proc.stdout, proc.stderr


def test_the_operator_command_tells_the_sinks_after_its_act(
    etcd_url, store, webhook_receiver, tmp_path
):
    records = StoreRecords(store, "chat-a/canary")
    for action, seconds, params in (("plan", 0, {}), ("stage_started", 1, {"stage": 0})):
        write(records, action, seconds, **params)
    sinks = tmp_path / "sinks.yml"
    sinks.write_text(
        "- name: oncall\n  url: %s\n  allow_http: true\n  events: [paused, resumed, aborted]\n"
        "- name: chat\n  url: %s\n  allow_http: true\n  format: slack\n  rollouts: ['embed-*']\n"
        % (webhook_receiver.url("/oncall"), webhook_receiver.url("/chat"))
    )
    status, out, err = cli(etcd_url, store, "notifications", "set", str(sinks))
    assert status == 0, err
    assert "127.0.0.1" not in out, "the command never shows a sink's address"
    status, out, err = cli(etcd_url, store, "rollout", "pause", "chat-a", "--reason", "p99 page")
    assert status == 0, err
    assert json.loads(out)["notifications"]["sender"] in ("started", "running"), out
    status, out, err = cli(etcd_url, store, "rollout", "abort", "chat-a", "--reason", "bad build")
    assert status == 0, err
    sender_done(store, webhook_receiver, 2)
    received = webhook_receiver.bodies("/oncall")
    assert [(b["type"], b["rollout_id"], b["wave"], b["reason"]) for b in received] == [
        ("paused", "chat-a", "canary", "p99 page"),
        ("aborted", "chat-a", "canary", "bad build"),
    ]
    assert received[0]["actor"] and received[0]["stage"] == 1
    assert webhook_receiver.bodies("/chat") == [], "chat hears only embed-* rollouts"
    status, out, _err = cli(etcd_url, store, "rollout", "events", "chat-a")
    assert [e["type"] for e in json.loads(out)["events"]] == [
        "started",
        "stage_started",
        "paused",
        "aborted",
    ]


def test_a_bad_sink_file_changes_nothing(etcd_url, store, tmp_path):
    notify.write_sinks(store, [{"name": "keep", "url": "http://127.0.0.1:9/", "allow_http": True}])
    bad = tmp_path / "bad.yml"
    bad.write_text("- name: x\n  url: https://127.0.0.1:9/\n  format: teams\n")
    status, _out, err = cli(etcd_url, store, "notifications", "set", str(bad))
    assert status != 0 and "format must be one of json, slack" in err, err
    assert [s["name"] for s in notify.read_sinks(store)] == ["keep"]


def rollout_event(etcd_url, prefix, **args):
    return run_module("rollout_event", etcd_url, prefix, **args)


def test_the_module_configures_emits_and_lists(etcd_url, store, webhook_receiver):
    sinks = [
        {
            "name": "oncall",
            "url": webhook_receiver.url(),
            "allow_http": True,
            "headers": {"Authorization": "Bearer s3"},
        }
    ]
    checked = rollout_event(
        etcd_url, store.prefix, check=True, action="configure", notifications=sinks
    )
    assert checked["changed"] is True and notify.read_sinks(store) == []
    done = rollout_event(etcd_url, store.prefix, diff=True, action="configure", notifications=sinks)
    assert done["changed"] is True
    assert "s3" not in json.dumps(done) and webhook_receiver.url() not in json.dumps(done)
    again = rollout_event(etcd_url, store.prefix, action="configure", notifications=sinks)
    assert again["changed"] is False
    emitted = rollout_event(
        etcd_url, store.prefix, type="fleet_rolled_back", nodes=["n2", "n1"], reason="drill",
        detail={"mode": "fast", "seconds": 1.25},
    )  # fmt: skip
    assert emitted["notifications"]["sender"] == "started", emitted
    sender_done(store, webhook_receiver, 1)
    (body,) = webhook_receiver.bodies()
    assert body["type"] == "fleet_rolled_back" and body["nodes"] == ["n1", "n2"]
    assert body["detail"] == {"mode": "fast", "seconds": 1.25}
    listed = rollout_event(etcd_url, store.prefix, action="list")
    assert [e["type"] for e in listed["events"]] == ["fleet_rolled_back"]


def test_the_module_refuses_an_unknown_event_type(etcd_url, store):
    failed = rollout_event(etcd_url, store.prefix, type="exploded")
    assert failed.get("failed") and "fleet_rolled_back" in failed["msg"], failed
    assert ev.list_events(store) == []


def test_the_gate_evaluator_tells_of_a_verdict_change_once(store, webhook_receiver):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import hold_evaluation

    notify.write_sinks(
        store, [{"name": "oncall", "url": webhook_receiver.url(), "allow_http": True}]
    )
    params = {"record_key": "chat-a/canary", "stage": 1, "weight": 5.0}
    now = datetime.datetime.now(datetime.timezone.utc)
    holding = {"recent": [{"gates": {"success_rate": "no_data"}}]}
    same = {"gates": [{"name": "success_rate", "verdict": "no_data"}], "verdict": "hold",
            "decision": "continue", "reason": "no data yet"}  # fmt: skip
    assert hold_evaluation.tell_verdict_change(store, params, holding, same, now) is None
    passed = dict(same, gates=[{"name": "success_rate", "verdict": "pass"}], verdict="pass")
    told = hold_evaluation.tell_verdict_change(store, params, holding, passed, now)
    assert told["stored"] is True and told["notifications"]["sender"] == "started", told
    sender_done(store, webhook_receiver, 1)
    (body,) = webhook_receiver.bodies()
    assert (body["type"], body["stage"], body["weight"]) == ("gate_verdicts_changed", 2, 5.0)
    assert body["detail"]["previous"] == {"success_rate": "no_data"}
    assert [e["type"] for e in ev.list_events(store, "chat-a")] == ["gate_verdicts_changed"]


def test_one_sender_tells_every_sink_in_order_and_a_bad_sink_delays_no_act(store, webhook_receiver):
    webhook_receiver.behaviour["/slow"] = {"delay_s": 1.0}
    notify.write_sinks(store, [
        {"name": "fine", "url": webhook_receiver.url("/fine"), "allow_http": True},
        {"name": "slow", "url": webhook_receiver.url("/slow"), "allow_http": True,
         "timeout_s": 0.3, "attempts": 2},
        {"name": "down", "url": "http://127.0.0.1:9/", "allow_http": True, "attempts": 2,
         "timeout_s": 0.5},
    ])  # fmt: skip
    records = StoreRecords(store, "chat-a/canary")
    acts = [("plan", {}), ("stage_started", {"stage": 0}), ("hold_started", {}),
            ("pause", {"reason": "p"}), ("resume", {"reason": "r"}),
            ("abort", {"reason": "a"})]  # fmt: skip
    took = []
    for seconds, (action, params) in enumerate(acts):
        started = time.monotonic()
        write(records, action, seconds, **params)
        notify.hand_off(store)
        took.append(time.monotonic() - started)
    # Each act: its write and a hand-off (one lease, at most a fork), whatever the sinks do.
    assert max(took) < 1.0, took
    sender_done(store, webhook_receiver, len(acts))
    kinds = ["started", "stage_started", "hold_started", "paused", "resumed", "aborted"]
    assert [b["type"] for b in webhook_receiver.bodies("/fine")] == kinds
    states = {state["name"]: state["cursor"] for state in notify.sink_states(store)}
    assert (states["fine"]["delivered"], states["fine"]["failed"]) == (6, 0)
    assert (states["down"]["delivered"], states["down"]["failed"]) == (0, 6)
    assert "refused" in states["down"]["last_failure"]["error"].lower()
    assert states["slow"]["failed"] == 6 and "timed out" in states["slow"]["last_failure"]["error"]
    assert "127.0.0.1" not in json.dumps(notify.sink_states(store))


def test_a_new_sink_hears_only_what_comes_after_it(store, webhook_receiver):
    records = StoreRecords(store, "chat-a/canary")
    write(records, "plan", 0)
    notify.write_sinks(store, [{"name": "late", "url": webhook_receiver.url(), "allow_http": True}])
    write(records, "stage_started", 1, stage=0)
    notify.hand_off(store)
    sender_done(store, webhook_receiver, 1)
    assert [b["type"] for b in webhook_receiver.bodies()] == ["stage_started"]
