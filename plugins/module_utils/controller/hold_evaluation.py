# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""One evaluation of a stage's gates during its hold, as the canary_gate module runs it.

In order: validate every input (nothing is read before it all holds); stop at once, with no
gate evaluated and the history untouched, when the record or the fence stops the hold or
the store cannot be read (rollout_guard); take the stage's history (a person's resume or
promote in the record starts it afresh); query Prometheus and judge each gate (gates);
record the evaluation and decide (gates.record_evaluation); write the history; tell a change
of verdicts as an event, handed to the notification sinks. It imports the telemetry (the
queries) and the reports (the sinks), so it sits on the controller's layer.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_duration,
    parse_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.record_codec import (
    read_json_file,
    write_json_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout_guard
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.gates import (
    Limits,
    evaluate_gates,
    history_for_stage,
    new_history,
    placeholder_values,
    record_evaluation,
    stage_nodes_pattern,
    validate_gates,
    validate_window,
    whole_number,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout import (
    default_actor,
    last_decision_at,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    FileRecords,
    StoreRecords,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry.prometheus_api import (
    PrometheusClient,
)

COUNTERS = (
    "evaluations",
    "consecutive_failures",
    "failures",
    "holds",
    "hold_extension_s",
    "latched",
)


def _counters(history):
    return {key: history.get(key) for key in COUNTERS}


def _stopped(params, stop, now):
    """The result when the record or the fence stops the hold, or the store cannot be read:
    no gate is evaluated and the history is not touched (time nobody watched is no hold)."""
    decision, reason = stop
    return {
        "changed": False,
        "verdict": "hold",
        "reason": reason,
        "decision": "continue" if decision == "store_unreachable" else decision,
        "decision_reason": reason,
        "store_reachable": decision != "store_unreachable",
        "gates": [],
        "rollout_id": params["rollout_id"],
        "stage": params["stage"],
        "weight": params["weight"],
        "evaluated_at": format_timestamp(now),
        "history_reset": False,
        "state_file": params["state_file"],
        "_diff": {"before": {}, "after": {}},
    }


def run(params, check_mode):
    """Validate everything, evaluate once, decide; the module's result, with its diff under
    _diff."""
    gates = validate_gates(params["gates"])
    whole_number(params["timeout"], "timeout", 1)
    whole_number(params["stage"], "stage", 0)
    window = validate_window(params["window"])
    stage_nodes_pattern(params["stage_nodes"])
    hold_s = parse_duration(params["hold"], "hold")
    limits = Limits(
        params["consecutive_failure_limit"],
        params["failure_limit"],
        params["max_holds"],
        parse_duration(params["max_hold_extension"], "max_hold_extension"),
    )
    hold_started_at = None
    if params["hold_started_at"] not in (None, ""):
        hold_started_at = parse_timestamp(params["hold_started_at"], "hold_started_at")
    client = PrometheusClient(
        params["prometheus_url"],
        timeout=params["timeout"],
        bearer_token=params["bearer_token"],
        validate_certs=params["validate_certs"],
        ca_path=params["ca_path"],
    )
    now = utc_now()
    store, records = None, None
    if params.get("endpoints"):
        # Its own timeout is Prometheus'; the store waits store_timeout (or the 3 s default).
        store = store_from_params(dict(params, timeout=None))
        if params.get("record_key"):
            records = StoreRecords(store, params["record_key"])
    elif params.get("record_path"):
        records = FileRecords(params["record_path"])
    owner = (params.get("owner_scope"), params.get("owner_lease"))
    stop, record = rollout_guard.standing_and_record(
        records, store, params.get("epoch"), params["stage"], owner
    )
    if stop is not None:
        return _stopped(params, stop, now)

    stored = read_json_file(params["state_file"])
    # A resume or promote recorded since the history began gives it a fresh start.
    decided_at = last_decision_at(record) if record else None
    if params["reset_history"]:
        history = new_history(params["rollout_id"], params["stage"], decided_at)
        replaced = stored is not None
    else:
        history, replaced = history_for_stage(
            stored, params["rollout_id"], params["stage"], decided_at
        )

    evaluation = evaluate_gates(
        gates,
        client.query,
        placeholder_values(hold_started_at, now, window, params["stage_nodes"]),
    )
    gate_verdicts = {result["name"]: result["verdict"] for result in evaluation["gates"]}
    updated, outcome = record_evaluation(
        history,
        evaluation["verdict"],
        now,
        hold_s,
        hold_started_at,
        limits,
        gate_verdicts,
        watch_interval_s=params.get("interval"),
    )
    if not check_mode:
        write_json_atomic(params["state_file"], updated)

    result = {
        "changed": True,
        "reason": evaluation["reason"],
        "gates": evaluation["gates"],
        "rollout_id": params["rollout_id"],
        "stage": params["stage"],
        "weight": params["weight"],
        "evaluated_at": format_timestamp(now),
        "history_reset": replaced,
        "state_file": params["state_file"],
    }
    result.update(outcome)
    result["_diff"] = {"before": _counters(history), "after": _counters(updated)}
    if store is not None and params.get("record_key") and not check_mode:
        result["event"] = tell_verdict_change(store, params, history, result, now)
    return result


def tell_verdict_change(store, params, history, result, now):
    """A change of gate verdicts since the stage's previous evaluation, as an event.

    Reported, never fatal: the hold's own decision does not wait on the history or its sinks.
    """
    recent = history.get("recent") or []
    previous = recent[-1].get("gates") if recent else None
    current = {gate["name"]: gate["verdict"] for gate in result["gates"]}
    change = rollout_events.verdicts_changed(
        params["record_key"],
        params["stage"] + 1,
        params["weight"],
        previous,
        dict(result, gates=current),
        format_timestamp(now),
        default_actor(),
    )
    if change is None:
        return None
    try:
        rollout_events.emit(store, change)
    except StoreUnavailable as exc:
        return dict(change, stored=False, error=exc.message)
    return dict(change, stored=True, notifications=notify.hand_off(store))
