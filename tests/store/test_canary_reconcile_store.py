"""The canary's reconcile step against a real etcd: the record read once and written by
compare-and-swap, a runner that lost its lease writes nothing, and after a rollback every
wave's record (as the store has it) goes to its nodes' copies."""

import json

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import canary_reconcile
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    OwnerLost,
    runner_identity,
)

from .planted_records import record_of


def store_params(tmp_path, etcd_url, store, **overrides):
    """The module's arguments, its defaults filled in as AnsibleModule would: one wave of one
    node, records in the store under this test's prefix."""
    found = {key: spec.get("default") for key, spec in canary_reconcile.ARGUMENT_SPEC.items()}
    found.update(
        endpoints=[etcd_url],
        prefix=store.prefix,
        store_timeout=3,
        rollout_id="r1",
        waves=["wave_a"],
        inventory_groups={"wave_a": ["n1"]},
        play_hosts=["n1"],
        schedule=[{"weight": 5, "hold": "10m"}, {"weight": 100, "hold": 0}],
        routes=["chat"],
        split={"min_connections": 0, "sigmas": 4, "floor_pct": 0.5, "wait_s": 10, "poll_s": 2},
        record_dir=str(tmp_path),
        fence={"fence": {"epoch": 0}},
        actor="tester@ctl",
    )
    found.update(overrides)
    return found


def route(weight_bp):
    return {"name": "chat", "weight_bp": weight_bp, "weight": weight_bp / 100.0, "generation": 1}


def verdict(decision, verdict_value, reason):
    return {"decision": decision, "verdict": verdict_value, "reason": reason, "gates": []}


def test_records_live_in_the_store_with_a_copy_on_the_controller(tmp_path, etcd_url, store):
    first = canary_reconcile.run(store_params(tmp_path, etcd_url, store), False)
    assert first["kind"] == "write"
    stored = record_of(store, "r1/wave_a")
    assert stored["stage"]["status"] == "started"
    assert json.loads((tmp_path / "r1" / "wave_a.json").read_text()) == stored
    assert first["events"], "the write's events go with it"


def test_a_runner_that_lost_the_scope_writes_neither_record_nor_weight(tmp_path, etcd_url, store):
    owner = store.acquire("gpu_nodes", runner_identity("r1"), 30)
    given = store_params(
        tmp_path,
        etcd_url,
        store,
        owner_scope="gpu_nodes",
        owner_lease=owner["lease"],
        schedule=[{"weight": 5, "hold": 0}, {"weight": 100, "hold": 0}],
    )
    first = canary_reconcile.run(given, False)
    assert first["kind"] == "write"
    before = record_of(store, "r1/wave_a")
    store.release("gpu_nodes", owner["lease"])
    # Stage 1 confirmed, no hold: the next step writes stage 2, which needs the scope.
    with pytest.raises(OwnerLost, match="no longer owns scope gpu_nodes"):
        canary_reconcile.run(dict(given, run=first["run"], readbacks={"n1": [route(500)]}), False)
    assert record_of(store, "r1/wave_a") == before


def test_after_a_rollback_each_wave_copy_is_the_store_record(tmp_path, etcd_url, store):
    given = store_params(tmp_path, etcd_url, store)
    first = canary_reconcile.run(given, False)
    hold = canary_reconcile.run(
        dict(given, run=first["run"], readbacks={"n1": [route(500)]}), False
    )
    rollback = canary_reconcile.run(
        dict(given, run=hold["run"], verdict=verdict("rollback", "fail", "errors")), False
    )
    assert rollback["kind"] == "rollback"
    report = {"nodes_confirmed": 3, "nodes_total": 3, "store_updated": True}
    stop = canary_reconcile.run(dict(given, run=rollback["run"], rollback_report=report), False)
    assert [(c["wave"], c["nodes"]) for c in stop["copies"]] == [("wave_a", ["n1"])]
    assert stop["copies"][0]["record"] == record_of(store, "r1/wave_a")
    # Store not updated by the rollback: its records are left as they were, no copies.
    unmarked = canary_reconcile.run(
        dict(given, run=rollback["run"], rollback_report=dict(report, store_updated=False)), False
    )
    assert unmarked["copies"] == [] and unmarked["halt"]["kind"] == "rolled_back"
