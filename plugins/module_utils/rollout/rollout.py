# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The canary rollout record: schedule, stage, per-node confirmations, verdicts.

Pure logic plus an atomic JSON codec, no Ansible. The controller keeps the record;
playbooks copy it to the nodes with the same codec (action `sync`), so every copy
reads the same way. Each change is a function that takes a record and returns a
new one plus whether anything changed; nothing is written before every input has
been checked.
"""

from __future__ import annotations

import copy
import getpass
import os
import socket

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    DURATION_ALLOWED,
    format_timestamp,
    parse_duration,
    parse_timestamp,
    seconds_between,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.record_codec import (
    RECORD_FORMAT,
    validate_rollout_id,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    bp_to_percent,
    check_cohorts,
    parse_cohort,
    parse_weight,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.gates import (
    VERDICTS,
    validate_gates,
)

FINISHED = ("completed", "rolled_back", "aborted")
STAGE_STATUSES = ("pending", "started", "holding", "completed")
ACTIONS = (
    "plan",
    "status",
    "stage_started",
    "weight_confirmed",
    "split_measured",
    "hold_started",
    "verdict",
    "stage_completed",
    "pause",
    "resume",
    "promote",
    "promote_full",
    "abort",
    "rolled_back",
    "completed",
    "sync",
)
DEFAULT_SCHEDULE = (
    {"weight": 1, "hold": "2h"},
    {"weight": 5, "hold": "4h"},
    {"weight": 20, "hold": "8h"},
    {"weight": 100, "hold": 0},
)
STAGE_KEYS = ("weight", "hold", "cohort")
KEEP_VERDICTS = 500


# ---------------------------------------------------------------- inputs


def _stage_weight(value, field):
    weight_bp = parse_weight(value, field)
    if weight_bp == 0:
        raise FleetError(
            "%s must be a percentage above 0 and at most 100 with at most two decimals "
            "(0 means no canary; rollback sets it; a first stage {cohort: [CIDRs], hold} runs "
            "at 0 for its clients only); got %r" % (field, value),
            {"field": field},
        )
    return weight_bp


def validate_schedule(stages, field="schedule"):
    """Normalised stages [{"weight", "weight_bp", "hold_s"}] or FleetError naming the field.

    Weights in (0, 100] with at most two decimals, strictly increasing, the last 100. The
    first stage may instead be a cohort stage, {cohort: [CIDRs], hold}: weight 0, where only
    the cohort's clients take the direct path (the route's always_direct). A schedule with a
    cohort stage gives every stage a "cohort" list ([] where it names none): each stage's
    write sets the routes' always_direct to it, so the next stage clears the cohort with the
    weight. A schedule without one has no "cohort" key and leaves always_direct alone.
    """
    if not isinstance(stages, (list, tuple)) or not stages:
        raise FleetError(
            "%s must be a non-empty list of stages, each {weight: percent, hold: duration}, "
            "the first may be {cohort: [CIDRs], hold: duration}" % field,
            {"field": field},
        )
    normalised = []
    for index, stage in enumerate(stages):
        where = "%s[%d]" % (field, index)
        if not isinstance(stage, dict):
            raise FleetError(
                "%s must be a dict with the keys weight and hold (or cohort and hold); got %r"
                % (where, stage),
                {"field": where},
            )
        unknown = sorted(set(stage) - set(STAGE_KEYS))
        if unknown:
            raise FleetError(
                "%s has unknown key(s) %s; allowed keys: %s"
                % (where, ", ".join(unknown), ", ".join(STAGE_KEYS)),
                {"field": where},
            )
        cohort = _stage_cohort(stage, index, where)
        if cohort is not None:
            weight_bp = 0
        elif "weight" not in stage:
            raise FleetError(
                "%s.weight is required (a percentage in (0, 100])" % where,
                {"field": where + ".weight"},
            )
        else:
            weight_bp = _stage_weight(stage["weight"], where + ".weight")
        if normalised and weight_bp <= normalised[-1]["weight_bp"]:
            raise FleetError(
                "%s.weight must be greater than the previous stage's %s "
                "(weights strictly increase); got %r"
                % (where, bp_to_percent(normalised[-1]["weight_bp"]), stage["weight"]),
                {"field": where + ".weight"},
            )
        hold_s = parse_duration(stage.get("hold", 0), where + ".hold")
        planned = {"weight": bp_to_percent(weight_bp), "weight_bp": weight_bp, "hold_s": hold_s}
        if cohort is not None:
            planned["cohort"] = cohort
        normalised.append(planned)
    if normalised[-1]["weight_bp"] != 10000:
        last = "%s[%d].weight" % (field, len(normalised) - 1)
        raise FleetError(
            "%s must be 100: the last stage sends every new connection to the engine; got %s"
            % (last, normalised[-1]["weight"]),
            {"field": last},
        )
    if "cohort" in normalised[0]:
        for planned in normalised[1:]:
            planned["cohort"] = []
    return normalised


def _stage_cohort(stage, index, where):
    """The cohort stage's CIDRs as normalised strings; None for a stage by weight."""
    if "cohort" not in stage:
        return None
    field = where + ".cohort"
    if index != 0:
        raise FleetError(
            "%s: only the first stage may be a cohort stage (it runs at weight 0, before the "
            "first percentage); allowed keys here: weight, hold" % field,
            {"field": field},
        )
    if "weight" in stage and parse_weight(stage["weight"], where + ".weight") != 0:
        raise FleetError(
            "%s.weight: a cohort stage runs at weight 0 (only its cohort takes the direct path); "
            "leave weight out or set it to 0; got %r" % (where, stage["weight"]),
            {"field": where + ".weight"},
        )
    networks = parse_cohort(stage["cohort"], field)
    if not networks:
        raise FleetError(
            "%s must name at least one client network (CIDR) for the stage to send direct; "
            "got []" % field,
            {"field": field},
        )
    try:
        check_cohorts(networks, [])
    except FleetError as error:
        raise FleetError("%s: %s" % (field, error.message), {"field": field}) from None
    return [str(network) for network in networks]


def default_actor():
    """user@host of whoever runs the change, for the record's who/when."""
    try:
        user = getpass.getuser()
    except Exception:
        user = "uid%d" % os.getuid()
    return "%s@%s" % (user, socket.gethostname())


# ---------------------------------------------------------------- record


def _stage_block(index):
    return {
        "index": index,
        "status": "pending",
        "started_at": None,
        "hold_started_at": None,
        "hold_extension_s": 0,
        "completed_at": None,
    }


def new_record(rollout_id, schedule, gates, now, actor):
    at = format_timestamp(now)
    return {
        "format": RECORD_FORMAT,
        "rollout_id": rollout_id,
        "outcome": "running",
        "paused": False,
        "pause_reason": None,
        "schedule": schedule,
        "gates": gates,
        "stage": _stage_block(0),
        "completed_stages": [],
        "nodes": {},
        # {stage index as text: {node: split_verdict result}}, what split_measured recorded.
        "splits": {},
        "verdicts": [],
        "transitions": [
            {"action": "plan", "at": at, "by": actor, "stage": 0, "outcome": "running"}
        ],
        "rollback": None,
        "previous": None,
        "created_at": at,
        "created_by": actor,
        "updated_at": at,
        "updated_by": actor,
    }


def _transition(record, action, now, actor, **detail):
    at = format_timestamp(now)
    entry = {
        "action": action,
        "at": at,
        "by": actor,
        "stage": record["stage"]["index"],
        "outcome": record["outcome"],
    }
    entry.update({key: value for key, value in detail.items() if value is not None})
    record["transitions"].append(entry)
    record["updated_at"] = at
    record["updated_by"] = actor


# A person's decisions that give the stage they leave running a fresh gate history (a new
# hold-extension budget, failure counts from zero, no latched decision), from whichever
# shell or controller they came.
PERSON_DECISIONS = ("resume", "promote", "promote_full")


def last_decision_at(record):
    """When a person last resumed or promoted the rollout (a timestamp), or None."""
    return next(
        (t["at"] for t in reversed(record["transitions"]) if t["action"] in PERSON_DECISIONS),
        None,
    )


def current_stage(record):
    return record["schedule"][record["stage"]["index"]]


def is_last_stage(record):
    return record["stage"]["index"] == len(record["schedule"]) - 1


def resume_point(record, now):
    """Where a run continues: stage index, weight and the hold still to go.

    A stage whose hold started keeps its hold start, so the remaining hold is the
    hold plus the recorded extension minus the time since then (never below 0).
    """
    if record["outcome"] in FINISHED:
        return None
    stage = record["stage"]
    index = stage["index"]
    status = stage["status"]
    if status == "completed" and index < len(record["schedule"]) - 1:
        index, status = index + 1, "pending"
    planned = record["schedule"][index]
    point = {
        "stage": index,
        "stage_number": index + 1,
        "stage_count": len(record["schedule"]),
        "weight": planned["weight"],
        "stage_status": status,
        "hold_s": planned["hold_s"],
        "hold_extension_s": 0,
        "hold_started_at": None,
        "hold_remaining_s": planned["hold_s"],
    }
    if index == stage["index"] and status == "holding":
        started = parse_timestamp(stage["hold_started_at"], "stage.hold_started_at")
        total = planned["hold_s"] + stage["hold_extension_s"]
        point["hold_extension_s"] = stage["hold_extension_s"]
        point["hold_started_at"] = stage["hold_started_at"]
        point["hold_remaining_s"] = round(max(0.0, total - seconds_between(started, now)), 3)
    elif status == "completed":
        point["hold_remaining_s"] = 0
    return point


def summary(record, now):
    """The fields a progress display needs."""
    if record is None:
        return None
    point = resume_point(record, now)
    last = record["verdicts"][-1] if record["verdicts"] else None
    planned = current_stage(record)
    return {
        "rollout_id": record["rollout_id"],
        "outcome": record["outcome"],
        "paused": record["paused"],
        "pause_reason": record["pause_reason"],
        "stage": record["stage"]["index"],
        "stage_number": record["stage"]["index"] + 1,
        "stage_count": len(record["schedule"]),
        "stage_status": record["stage"]["status"],
        "weight": planned["weight"],
        "hold_remaining_s": point["hold_remaining_s"] if point else 0,
        "last_verdict": last["verdict"] if last else None,
        "last_decision": last.get("decision") if last else None,
        "updated_at": record["updated_at"],
        "updated_by": record["updated_by"],
    }


def _schedule_key(schedule):
    return [(stage["weight_bp"], stage["hold_s"], stage.get("cohort")) for stage in schedule]


def _previous_summary(record):
    return {
        "rollout_id": record["rollout_id"],
        "outcome": record["outcome"],
        "stage": record["stage"]["index"],
        "updated_at": record["updated_at"],
    }


# The progress deadline (canary_progress_deadline): a wave with no recorded progress and
# no live owner for that long is stuck. "auto" is the longest hold of the schedule plus
# this many gate intervals: a runner that is alive writes at least once per hold.
PROGRESS_DEADLINE_AUTO = "auto"
PROGRESS_DEADLINE_INTERVALS = 3
PROGRESS_DEADLINE_FIELD = "canary_progress_deadline"


def planned_progress(schedule, setting, gate_interval_s, abort=False):
    """The progress deadline a plan keeps, judged against the schedule as normalised (None:
    the default schedule)."""
    normalised = validate_schedule(DEFAULT_SCHEDULE if schedule is None else schedule)
    return progress_deadline(normalised, setting, gate_interval_s, abort)


def progress_deadline(schedule, setting, gate_interval_s, abort=False):
    """{"deadline_s", "abort"} for a normalised schedule; refuses a deadline of 0 or less.

    setting is "auto" (or None) or a duration above 0 (7200, "2h", "90m").
    """
    if (
        isinstance(gate_interval_s, bool)
        or not isinstance(gate_interval_s, int)
        or (gate_interval_s < 1)
    ):
        raise FleetError(
            "canary_gate_interval must be whole seconds >= 1; got %r" % (gate_interval_s,),
            {"field": "canary_gate_interval"},
        )
    if not isinstance(abort, bool):
        raise FleetError(
            "canary_progress_deadline_abort must be true or false; got %r" % (abort,),
            {"field": "canary_progress_deadline_abort"},
        )
    if setting is None or setting == PROGRESS_DEADLINE_AUTO:
        longest = max(stage["hold_s"] for stage in schedule)
        seconds = longest + PROGRESS_DEADLINE_INTERVALS * gate_interval_s
    else:
        allowed = "%s, or %s, above 0" % (PROGRESS_DEADLINE_AUTO, DURATION_ALLOWED)
        try:
            seconds = parse_duration(setting, PROGRESS_DEADLINE_FIELD)
        except FleetError:
            seconds = None
        if not seconds:
            raise FleetError(
                "%s must be %s; got %r" % (PROGRESS_DEADLINE_FIELD, allowed, setting),
                {"field": PROGRESS_DEADLINE_FIELD},
            )
    return {"deadline_s": seconds, "abort": abort}


def progress_state(record, owned, now, fence_epoch=None):
    """Whether a wave is stuck: {"deadline_s", "abort", "last_progress_at", "idle_s", "stuck"}.

    Progress is any record write (updated_at). A wave is stuck when it is running (not
    paused, not finished, not fenced: a fleet fence above the epoch it took means a
    rollback already put its nodes at 0), no runner owns its rollout (owned: a live owner
    key names it), and nothing was recorded for longer than its deadline. A record planned
    before the deadline existed has none (deadline_s None) and is never stuck.
    """
    settings = record.get("progress_deadline") or {}
    deadline = settings.get("deadline_s")
    idle = seconds_between(parse_timestamp(record["updated_at"], "updated_at"), now)
    taken = record.get("fence_epoch")
    fenced = taken is not None and fence_epoch is not None and taken < fence_epoch
    running = record["outcome"] == "running" and not record.get("paused") and not fenced
    return {
        "deadline_s": deadline,
        "abort": bool(settings.get("abort")),
        "last_progress_at": record["updated_at"],
        "idle_s": round(idle, 3),
        "stuck": bool(running and not owned and deadline and idle > deadline),
    }


def _validate_epoch(epoch):
    if epoch is not None and (isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0):
        raise FleetError(
            "epoch must be a whole number >= 0 (the rollout store's fence epoch); got %r"
            % (epoch,),
            {"field": "epoch"},
        )
    return epoch


def _fenced_resume(record, epoch, take_epoch, now, actor):
    """A rollout resumed under a fence above the one it took: refused, or taken on purpose.

    Returns the record to resume (changed when the epoch was taken), or raises.
    """
    taken = record.get("fence_epoch")
    if epoch is None or (taken is not None and taken >= epoch):
        return record, False
    if taken is not None and not take_epoch:
        raise FleetError(
            "rollout %s took fence epoch %d, but the fleet's fence is now %d: it was rolled back "
            "or aborted since, and its nodes are fenced. Nothing was changed. Start anew "
            "(restart: true, or a new rollout_id), or take the new epoch on purpose "
            "(take_epoch: true) to resume from where it stopped."
            % (record["rollout_id"], taken, epoch),
            {"field": "epoch", "epoch": taken, "fence_epoch": epoch},
        )
    record = copy.deepcopy(record)
    record["fence_epoch"] = epoch
    _transition(record, "epoch_taken", now, actor, epoch=epoch, previous_epoch=taken)
    return record, True


def plan(
    existing,
    rollout_id,
    schedule,
    gates,
    restart,
    now,
    actor,
    epoch=None,
    take_epoch=False,
    progress=None,
):
    """Create or load the record; returns (record, changed, note).

    Everything is validated first. A finished rollout with the same id is returned
    unchanged (a re-run converges); one in progress resumes, and a different schedule
    for it is refused unless restart is true. epoch is the fleet's fence epoch now: a new
    record keeps it, and a rollout that took an older one is refused unless take_epoch.
    progress is a progress_deadline() result (None: the record keeps what it has); a
    rollout in progress takes a changed one without a transition (it is no progress).
    """
    validate_rollout_id(rollout_id)
    _validate_epoch(epoch)
    normalised = validate_schedule(DEFAULT_SCHEDULE if schedule is None else schedule)
    gate_data = [gate.as_dict() for gate in validate_gates(gates)] if gates is not None else None
    if existing is None:
        record = new_record(rollout_id, normalised, gate_data, now, actor)
        record["fence_epoch"] = epoch
        record["progress_deadline"] = progress
        return record, True, "created"
    same_id = existing["rollout_id"] == rollout_id
    finished = existing["outcome"] in FINISHED
    if restart or (finished and not same_id):
        record = new_record(rollout_id, normalised, gate_data, now, actor)
        record["fence_epoch"] = epoch
        record["progress_deadline"] = progress
        record["previous"] = _previous_summary(existing)
        return record, True, "restarted" if restart else "created"
    if not same_id:
        raise FleetError(
            "rollout %s is %s at stage %d of %d; finish or abort it first, or set restart: true "
            "to replace it with rollout %s"
            % (
                existing["rollout_id"],
                existing["outcome"],
                existing["stage"]["index"] + 1,
                len(existing["schedule"]),
                rollout_id,
            ),
            {"field": "rollout_id"},
        )
    if finished:
        return existing, False, existing["outcome"]
    if _schedule_key(existing["schedule"]) != _schedule_key(normalised):
        raise FleetError(
            "schedule differs from the one rollout %s is running (%s); "
            "keep the schedule to resume, "
            "or set restart: true to start over with the new one"
            % (
                rollout_id,
                ", ".join("%s%%/%ds" % (s["weight"], s["hold_s"]) for s in existing["schedule"]),
            ),
            {"field": "schedule"},
        )
    existing, changed = _fenced_resume(existing, epoch, take_epoch, now, actor)
    if progress is not None and progress != existing.get("progress_deadline"):
        existing = copy.deepcopy(existing)
        existing["progress_deadline"] = progress
        changed = True
    if gate_data is not None and gate_data != existing.get("gates"):
        record = copy.deepcopy(existing)
        record["gates"] = gate_data
        _transition(record, "gates_changed", now, actor)
        return record, True, "resumed"
    return existing, changed, "resumed"


def _require_active(record, action):
    if record["outcome"] in FINISHED:
        raise FleetError(
            "action %s refused: rollout %s is %s; start a new rollout with action=plan "
            "(a new rollout_id, or restart: true)"
            % (action, record["rollout_id"], record["outcome"]),
            {"field": "action"},
        )


def _stage_index(value, record, field="stage"):
    count = len(record["schedule"])
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < count:
        raise FleetError(
            "%s must be a stage index from 0 to %d (the schedule has %d stages); got %r"
            % (field, count - 1, count, value),
            {"field": field},
        )
    return value


def stage_started(record, stage, now, actor):
    _require_active(record, "stage_started")
    if record["outcome"] == "paused" or record.get("paused"):
        # A pause made elsewhere while this runner held must stop it before it writes.
        raise FleetError(
            "stage_started refused: rollout %s is paused (%s); nothing was written. Continue "
            "with action=resume" % (record["rollout_id"], record.get("pause_reason")),
            {"field": "action"},
        )
    index = _stage_index(stage, record)
    current = record["stage"]
    if index == current["index"] and current["status"] != "pending":
        if current["status"] == "completed":
            raise FleetError(
                "stage %d is already completed; start stage %d next" % (index, index + 1),
                {"field": "stage"},
            )
        return record, False
    if index != current["index"] and not (
        index == current["index"] + 1 and current["status"] == "completed"
    ):
        raise FleetError(
            "stage must be the current stage %d (status %s) or, once it is completed, "
            "stage %d; got %d "
            "(use action=promote or promote_full to skip ahead)"
            % (current["index"], current["status"], current["index"] + 1, index),
            {"field": "stage"},
        )
    record = copy.deepcopy(record)
    if index != record["stage"]["index"]:
        record["stage"] = _stage_block(index)
    record["stage"]["status"] = "started"
    record["stage"]["started_at"] = format_timestamp(now)
    _transition(record, "stage_started", now, actor, weight=current_stage(record)["weight"])
    return record, True


def _node_entry(name, value, field):
    if not isinstance(value, dict) or "generation" not in value or "weight" not in value:
        raise FleetError(
            "%s must be a dict with generation (whole number >= 0) and weight (percent); got %r"
            % (field, value),
            {"field": field},
        )
    generation = value["generation"]
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 0:
        raise FleetError(
            "%s.generation must be a whole number >= 0; got %r" % (field, generation),
            {"field": field + ".generation"},
        )
    weight_bp = parse_weight(value["weight"], field + ".weight")
    return {"generation": generation, "weight": bp_to_percent(weight_bp), "weight_bp": weight_bp}


def lagging_nodes(record):
    """Nodes whose confirmed weight is not the current stage's weight."""
    wanted = current_stage(record)["weight_bp"]
    return sorted(
        name
        for name, node in record["nodes"].items()
        if node["weight_bp"] != wanted or node["stage"] != record["stage"]["index"]
    )


def weight_confirmed(record, nodes, now, actor):
    _require_active(record, "weight_confirmed")
    if not isinstance(nodes, dict) or not nodes:
        raise FleetError(
            "nodes must be a non-empty dict: node name -> {generation, weight}; got %r" % (nodes,),
            {"field": "nodes"},
        )
    entries = {name: _node_entry(name, value, "nodes[%s]" % name) for name, value in nodes.items()}
    record = copy.deepcopy(record)
    changed = False
    for name, entry in sorted(entries.items()):
        entry["stage"] = record["stage"]["index"]
        known = record["nodes"].get(name, {})
        if {key: known.get(key) for key in entry} != entry:
            entry["confirmed_at"] = format_timestamp(now)
            entry["confirmed_by"] = actor
            record["nodes"][name] = entry
            changed = True
    if changed:
        _transition(record, "weight_confirmed", now, actor, nodes=sorted(entries))
    return record, changed


SPLIT_KEYS = ("ok", "measured_pct", "low_pct", "high_pct", "connections")
# Kept where the split gives them (zerolayer.fleet.stage_split does): the weight's hits, the
# cohorts' connections, and whether it was a cohort stage's.
SPLIT_OPTIONAL_KEYS = ("to_engine", "addresses", "opt_in", "opt_out", "cohort", "weight_pct")


def split_measured(record, splits, now, actor):
    """Keep each node's measured split of the current stage (a split_verdict result each).

    One transition names the nodes that are off (detail `off`), or every node when none is.
    """
    _require_active(record, "split_measured")
    if not isinstance(splits, dict) or not splits:
        raise FleetError(
            "splits must be a non-empty dict: node name -> split_verdict result (%s); got %r"
            % (", ".join(SPLIT_KEYS), splits),
            {"field": "splits"},
        )
    kept = {}
    for name, split in sorted(splits.items()):
        field = "splits[%s]" % name
        if name not in record["nodes"]:
            raise FleetError(
                "%s: node %s has no confirmed weight in this record (action=weight_confirmed "
                "first)" % (field, name),
                {"field": field},
            )
        if not isinstance(split, dict) or not isinstance(split.get("ok"), bool):
            raise FleetError(
                "%s must be a split_verdict result with ok (true or false); got %r"
                % (field, split),
                {"field": field},
            )
        kept[name] = {key: split.get(key) for key in SPLIT_KEYS}
        kept[name].update({key: split[key] for key in SPLIT_OPTIONAL_KEYS if key in split})
    record = copy.deepcopy(record)
    index = record["stage"]["index"]
    record.setdefault("splits", {})[str(index)] = kept
    off = sorted(name for name, split in kept.items() if not split["ok"])
    _transition(record, "split_measured", now, actor, nodes=off or sorted(kept), off=off)
    return record, True


def hold_started(record, now, actor):
    _require_active(record, "hold_started")
    status = record["stage"]["status"]
    if status == "holding":
        # Keep the first hold start: that is what makes a resumed run hold only the remainder.
        return record, False
    if status != "started":
        raise FleetError(
            "hold_started needs the current stage %d started (action=stage_started); "
            "its status is %s" % (record["stage"]["index"], status),
            {"field": "action"},
        )
    record = copy.deepcopy(record)
    record["stage"]["status"] = "holding"
    record["stage"]["hold_started_at"] = format_timestamp(now)
    _transition(record, "hold_started", now, actor)
    return record, True


def verdict(record, result, now, actor):
    """Append one gate evaluation (a canary_gate result or {verdict, decision, reason})."""
    _require_active(record, "verdict")
    if not isinstance(result, dict) or result.get("verdict") not in VERDICTS:
        raise FleetError(
            "verdict must be a dict whose verdict is one of %s (a canary_gate result works); got %r"
            % (
                ", ".join(VERDICTS),
                result if not isinstance(result, dict) else result.get("verdict"),
            ),
            {"field": "verdict"},
        )
    record = copy.deepcopy(record)
    entry = {
        "at": format_timestamp(now),
        "by": actor,
        "stage": record["stage"]["index"],
        "verdict": result["verdict"],
        "decision": result.get("decision"),
        "reason": result.get("reason"),
        "gates": {
            gate.get("name"): gate.get("verdict")
            for gate in result.get("gates") or []
            if isinstance(gate, dict)
        },
    }
    record["verdicts"].append(entry)
    del record["verdicts"][:-KEEP_VERDICTS]
    extension = result.get("hold_extension_s")
    if isinstance(extension, (int, float)) and not isinstance(extension, bool) and extension >= 0:
        record["stage"]["hold_extension_s"] = extension
    record["updated_at"] = entry["at"]
    record["updated_by"] = actor
    return record, True


def _complete_stage(record, now, actor, action):
    record["stage"]["status"] = "completed"
    record["stage"]["completed_at"] = format_timestamp(now)
    record["completed_stages"].append(
        {
            "stage": record["stage"]["index"],
            "weight": current_stage(record)["weight"],
            "started_at": record["stage"]["started_at"],
            "hold_started_at": record["stage"]["hold_started_at"],
            "completed_at": record["stage"]["completed_at"],
            "how": action,
        }
    )
    _transition(record, action, now, actor)


def stage_completed(record, now, actor):
    _require_active(record, "stage_completed")
    status = record["stage"]["status"]
    if status == "completed":
        return record, False
    if status == "pending":
        raise FleetError(
            "stage %d has not started (action=stage_started first)" % record["stage"]["index"],
            {"field": "action"},
        )
    record = copy.deepcopy(record)
    _complete_stage(record, now, actor, "stage_completed")
    return record, True


def _clear_pause(record):
    record["paused"] = False
    record["pause_reason"] = None
    record["outcome"] = "running"


def pause(record, reason, now, actor):
    _require_active(record, "pause")
    if record["paused"]:
        return record, False
    record = copy.deepcopy(record)
    record["paused"] = True
    record["pause_reason"] = reason
    record["outcome"] = "paused"
    _transition(record, "pause", now, actor, reason=reason)
    return record, True


def resume(record, reason, now, actor):
    _require_active(record, "resume")
    if not record["paused"]:
        return record, False
    record = copy.deepcopy(record)
    _clear_pause(record)
    _transition(record, "resume", now, actor, reason=reason)
    return record, True


def promote(record, reason, now, actor):
    """Skip the rest of the current stage's hold: the next run starts the next stage."""
    _require_active(record, "promote")
    record = copy.deepcopy(record)
    if record["stage"]["status"] == "completed":
        if is_last_stage(record):
            raise FleetError(
                "the last stage is completed; use action=completed", {"field": "action"}
            )
        record["stage"] = _stage_block(record["stage"]["index"] + 1)
        _clear_pause(record)
        _transition(record, "promote", now, actor, reason=reason)
        return record, True
    if record["stage"]["status"] == "pending":
        record["stage"]["started_at"] = format_timestamp(now)
    _clear_pause(record)
    _complete_stage(record, now, actor, "promote")
    if reason:
        record["transitions"][-1]["reason"] = reason
    return record, True


def promote_full(record, reason, now, actor):
    """Go to the last stage (100%) now."""
    _require_active(record, "promote_full")
    last = len(record["schedule"]) - 1
    if record["stage"]["index"] == last and not record["paused"]:
        return record, False
    record = copy.deepcopy(record)
    if record["stage"]["index"] != last:
        record["stage"] = _stage_block(last)
    _clear_pause(record)
    _transition(record, "promote_full", now, actor, reason=reason)
    return record, True


def finish(record, outcome, reason, details, now, actor):
    """abort (a person stops it), rolled_back (the fleet is back on the proxy), completed."""
    if outcome == "completed":
        if record["outcome"] == "completed":
            return record, False
        _require_active(record, "completed")
        if not is_last_stage(record) or record["stage"]["status"] == "pending":
            raise FleetError(
                "completed needs the last stage (%s%%) started; the rollout is at stage %d (%s)"
                % (
                    record["schedule"][-1]["weight"],
                    record["stage"]["index"],
                    record["stage"]["status"],
                ),
                {"field": "action"},
            )
    elif record["outcome"] == outcome or (
        outcome == "aborted" and record["outcome"] == "rolled_back"
    ):
        return record, False
    elif outcome == "rolled_back" and record["outcome"] == "aborted" and record["rollback"]:
        return record, False
    record = copy.deepcopy(record)
    record["paused"] = False
    record["pause_reason"] = None
    if outcome == "completed" and record["stage"]["status"] != "completed":
        _complete_stage(record, now, actor, "stage_completed")
    if outcome == "rolled_back":
        record["rollback"] = {
            "at": format_timestamp(now),
            "by": actor,
            "reason": reason,
            "details": details or {},
            "stage": record["stage"]["index"],
        }
    action = {"aborted": "abort"}.get(outcome, outcome)
    # A person's abort stays the outcome once its rollback is done; the rollback is still recorded.
    if not (outcome == "rolled_back" and record["outcome"] == "aborted"):
        record["outcome"] = outcome
    _transition(record, action, now, actor, reason=reason)
    return record, True


def apply(record, action, params, now, actor):
    """Run one action other than plan, status and sync; returns (record, changed)."""
    if record is None:
        raise FleetError("no rollout record yet; run action=plan first", {"field": "action"})
    rollout_id = params.get("rollout_id")
    if rollout_id is not None and rollout_id != record["rollout_id"]:
        raise FleetError(
            "rollout_id %r does not match the record's %r" % (rollout_id, record["rollout_id"]),
            {"field": "rollout_id"},
        )
    reason = params.get("reason")
    if action == "stage_started":
        return stage_started(record, params.get("stage"), now, actor)
    if action == "weight_confirmed":
        return weight_confirmed(record, params.get("nodes"), now, actor)
    if action == "split_measured":
        return split_measured(record, params.get("splits"), now, actor)
    if action == "hold_started":
        return hold_started(record, now, actor)
    if action == "verdict":
        return verdict(record, params.get("verdict"), now, actor)
    if action == "stage_completed":
        return stage_completed(record, now, actor)
    if action == "pause":
        return pause(record, reason, now, actor)
    if action == "resume":
        return resume(record, reason, now, actor)
    if action == "promote":
        return promote(record, reason, now, actor)
    if action == "promote_full":
        return promote_full(record, reason, now, actor)
    if action in ("abort", "rolled_back", "completed"):
        outcome = {"abort": "aborted"}.get(action, action)
        return finish(record, outcome, reason, params.get("details"), now, actor)
    raise FleetError(
        "action must be one of %s; got %r" % (", ".join(ACTIONS), action), {"field": "action"}
    )
