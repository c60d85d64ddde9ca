# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""What a wave of the canary does next, at each point where a run decides.

The canary decides at six points of a wave: when it reads the wave's record, when a person
asked for something (canary_action), when the nodes read back the stage's weight, when their
measured split is in, when a hold ends with the gates' decision, and when a stage ends. At
each, a plain function of what the run knows there gives a step:

  changes        the record's changes, in order, made in one compare-and-swap;
  halt           {} to carry on, else how the run stops: kind, failed, wave, message;
  rollback       {} or {kind, reason}: roll every node back now (the rollback then halts).

A person's resume or promote needs nothing more: once in the record, it gives the stage's
gates a fresh history (canary_gate reads the record).

reconcile.py strings the steps together into canary_reconcile's one instruction, and the
changes of every step a reconcile takes go to the wave's record in one write. The playbooks
carry the instruction out and decide nothing themselves.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    traffic_split,
)

REQUESTS = ("run", "pause", "resume", "promote", "promote_full", "abort")
# The wave's outcomes at which a run changes nothing more.
STOPPED_OUTCOMES = ("paused", "rolled_back", "aborted")
# canary_gate's decisions made because someone else acted during the hold: a pause, a
# fence raised by a rollback, the record finished or moved on by another actor, the
# runner's lease on the scope lost (another runner may hold it now).
# Nothing more is written.
ACTED_ELSEWHERE = ("paused", "stopped", "fenced", "moved", "owner_lost")
# How a stage's measured split is judged (canary_split_*), and the wait, for the message.
SPLIT_SETTINGS = ("min_connections", "sigmas", "floor_pct", "wait_s")
# canary_gate's decisions at the end of a hold that this run records.
HOLD_ENDINGS = ("complete", "pause", "rollback")


def step(changes=(), halt=None, rollback=None):
    return {
        "changes": [dict(change) for change in changes],
        "halt": halt or {},
        "rollback": rollback or {},
    }


def halt(kind, failed, wave, message):
    return {"kind": kind, "failed": failed, "wave": wave, "message": " ".join(message.split())}


def _weight_text(weight):
    return "%g%%" % float(weight)


def at_wave(summary, wave_id, wave):
    """The wave's record as read before its stages: a paused, rolled back or aborted wave
    stops the run before anything is written."""
    outcome = summary.get("outcome")
    if outcome not in STOPPED_OUTCOMES:
        return step()
    reason = (
        (": " + summary["pause_reason"])
        if summary.get("paused") and summary.get("pause_reason")
        else ""
    )
    next_move = (
        "Continue with -e canary_action=resume (or promote, promote_full, abort)."
        if outcome == "paused"
        else "Start a new rollout with another canary_rollout_id (or -e canary_restart=true)."
    )
    message = "Rollout %s is %s at stage %s/%s (%s)%s. Nothing was changed. %s" % (
        wave_id,
        outcome,
        summary.get("stage_number"),
        summary.get("stage_count"),
        _weight_text(summary.get("weight", 0)),
        reason,
        next_move,
    )
    return step(halt=halt(outcome, True, wave, message))


def on_request(request, wave_id, wave):
    """A person's decision (canary_action), applied to the first wave still in progress."""
    if request not in REQUESTS:
        raise FleetError(
            "canary_action must be one of %s; got %r" % (", ".join(REQUESTS), request),
            {"field": "canary_action"},
        )
    if request == "run":
        return step()
    if request == "pause":
        return step(
            [{"action": "pause", "reason": "paused by request (canary_action=pause)"}],
            halt=halt(
                "paused",
                False,
                wave,
                "Rollout %s paused on request; weights stay as they are. Continue with "
                "-e canary_action=resume." % wave_id,
            ),
        )
    reason = "by request (canary_action=%s)" % request
    if request == "abort":
        return step(
            [{"action": "abort", "reason": reason}],
            rollback={"kind": "aborted", "reason": "aborted by request (canary_action=abort)"},
        )
    # resume, promote, promote_full: recorded, the stage's gates start a fresh history.
    return step([{"action": request, "reason": reason}])


def routes_read(read, routes):
    """The stage's routes among one node's route_info read, in the order read."""
    return [route for route in read or [] if route.get("name") in routes]


def _node_lagging(found, routes, weight_bp, cohort):
    """A node's read-back misses the stage: a route missing, at another weight, or (where the
    stage sets a cohort) holding another always_direct."""
    return (
        len(found) != len(routes)
        or any(route.get("weight_bp") != weight_bp for route in found)
        or (cohort is not None and any(route.get("always_direct") != cohort for route in found))
    )


def readback_lags(read, routes, weight_bp, cohort):
    """Whether one node's route_info read (read: its routes) misses the stage: the read-back
    retries while it does, and the confirmed point judges each node by the same rule."""
    return _node_lagging(routes_read(read, routes), routes, weight_bp, cohort)


def _stage_words(record):
    planned = rollout.current_stage(record)
    return planned, "stage %d" % (record["stage"]["index"] + 1)


def at_confirmed(record, reads, routes, wave):
    """The wave's nodes read back their routes (reads: {node: route_info routes}): each
    node's first route is recorded; any node that misses the stage's weight or cohort, or
    that an earlier run confirmed at another stage and this one did not read, stops the run
    before the hold (a person looks: re-run, or roll back)."""
    planned, where = _stage_words(record)
    weight_bp, cohort = planned["weight_bp"], planned.get("cohort")
    confirmations, lagging, weights = {}, set(), {}
    for node, read in sorted((reads or {}).items()):
        found = routes_read(read, routes)
        weights[node] = {route["name"]: route.get("weight") for route in found}
        if found:
            confirmations[node] = {
                "generation": found[0]["generation"],
                "weight": found[0]["weight"],
            }
        if _node_lagging(found, routes, weight_bp, cohort):
            lagging.add(node)
    # Left out of this run (--limit, gone from the wave) at another stage or weight.
    lagging.update(node for node in rollout.lagging_nodes(record) if node not in reads)
    changes = [{"action": "weight_confirmed", "nodes": confirmations}] if confirmations else []
    if not lagging:
        return step(changes)
    wanted = _weight_text(planned["weight"])
    if cohort:
        wanted += " with always_direct %s" % ", ".join(cohort)
    read_back = "; ".join(
        "%s %s" % (node, weights.get(node, "not read by this run")) for node in sorted(lagging)
    )
    return step(
        changes,
        halt=halt(
            "lagging",
            True,
            wave,
            "Nodes lagging at %s of wave %s: every route must read back %s; read back: %s. "
            "The stage did not start its hold; re-run to try again, or roll back."
            % (where, wave, wanted, read_back),
        ),
    )


def at_measured(record, readbacks, reads, routes, split, wave):
    """The router's counters read again once traffic flowed (reads), against the read-back
    (readbacks), on each node: the measured split of each is recorded; any node off the
    stage's weight, or with too few new connections, stops the run before the hold.
    split: min_connections, sigmas, floor_pct and wait_s (canary_split_*)."""
    missing = [key for key in SPLIT_SETTINGS if key not in (split or {})]
    if missing:
        raise FleetError(
            "split must give %s; missing %s" % (", ".join(SPLIT_SETTINGS), ", ".join(missing)),
            {"field": "split"},
        )
    planned, where = _stage_words(record)
    cohort = planned.get("cohort")
    splits = {
        node: traffic_split.stage_split(
            routes_read(readbacks.get(node), routes),
            routes_read(read, routes),
            planned["weight"],
            cohort_stage=bool(cohort),
            min_connections=split["min_connections"],
            sigmas=split["sigmas"],
            floor_pct=split["floor_pct"],
        )
        for node, read in sorted((reads or {}).items())
    }
    changes = [{"action": "split_measured", "splits": splits}] if splits else []
    off = [node for node, measured in sorted(splits.items()) if not measured["ok"]]
    if not off:
        return step(changes)
    stage_text = "weight %s" % _weight_text(planned["weight"])
    if cohort:
        stage_text += ", cohort %s" % ", ".join(cohort)
    return step(
        changes,
        halt=halt(
            "split_off",
            True,
            wave,
            "Measured split not confirmed at %s of wave %s (%s, within %s s): %s. The hold did "
            "not start; re-run to measure again, or roll back."
            % (
                where,
                wave,
                stage_text,
                split["wait_s"],
                "; ".join("%s: %s" % (node, splits[node]["detail"]) for node in off),
            ),
        ),
    )


def at_hold_end(verdict, wave_id, wave, stage, weight):
    """The gates' last decision of a hold (a canary_gate result). stage: 0-based."""
    decision = (verdict or {}).get("decision")
    reason = (verdict or {}).get("decision_reason") or (verdict or {}).get("reason") or ""
    where = "stage %d (%s)" % (stage + 1, _weight_text(weight))
    if decision in ACTED_ELSEWHERE:
        # Paused by a person: not a failure of this run. Fenced or finished elsewhere: it is.
        next_move = {
            "paused": " Continue with -e canary_action=resume.",
            "fenced": " Its nodes are fenced: start a new rollout, or -e canary_take_epoch=true"
            " to carry on on purpose.",
            "owner_lost": " See who runs it now (zerolayer rollout status) before resuming.",
        }.get(decision, "")
        return step(
            halt=halt(
                decision,
                decision not in ("paused", "moved"),
                wave,
                "Rollout %s stopped at %s without writing anything more: %s.%s"
                % (wave_id, where, reason, next_move),
            )
        )
    if decision not in HOLD_ENDINGS:
        raise FleetError(
            "verdict.decision must be one of %s; got %r"
            % (", ".join(HOLD_ENDINGS + ACTED_ELSEWHERE), decision),
            {"field": "verdict"},
        )
    verdict_change = {"action": "verdict", "verdict": verdict}
    if decision == "complete":
        return step([verdict_change, {"action": "stage_completed"}])
    if decision == "pause":
        return step(
            [verdict_change, {"action": "pause", "reason": reason}],
            halt=halt(
                "paused",
                True,
                wave,
                "Rollout %s paused at %s: %s (%s). The weight stays; nothing was rolled back."
                " Continue with -e canary_action=resume once the gates can see again, or"
                " promote, or abort." % (wave_id, where, reason, verdict.get("reason") or ""),
            ),
        )
    return step(
        [verdict_change],
        rollback={
            "kind": "rolled_back",
            "reason": "gates failed at %s of wave %s: %s; %s"
            % (where, wave, reason, verdict.get("reason") or ""),
        },
    )


def at_stage_end(hold_s, weight, pause_after_weight, wave_id, wave):
    """A stage whose hold is over (or that had none): a stage without a hold closes here,
    and the stage named by canary_pause_after_weight pauses the wave as planned."""
    changes = [] if float(hold_s) > 0 else [{"action": "stage_completed"}]
    if float(pause_after_weight) > 0 and float(weight) == float(pause_after_weight):
        changes.append(
            {
                "action": "pause",
                "reason": "paused after the %s stage as planned (canary_pause_after_weight)"
                % _weight_text(weight),
            }
        )
        return step(
            changes,
            halt=halt(
                "paused",
                False,
                wave,
                "Rollout %s paused after the %s stage as planned (canary_pause_after_weight);"
                " weights stay as they are. Continue with -e canary_action=resume, or roll back."
                % (wave_id, _weight_text(weight)),
            ),
        )
    return step(changes)
