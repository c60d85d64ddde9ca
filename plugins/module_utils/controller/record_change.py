# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""One change of a rollout record, as the rollout_state module makes it.

plan, status, a person's or the canary's own action, or sync (a node's copy of the record).
Outside check mode the record is written once, where it lives (the store or a file), and the
events the write makes are handed to the notification sinks: the reports' layer, so this sits
on the controller's.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import utc_now
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_records,
)

# The options a plan takes, in rollout_state's argument spec and canary_reconcile's.
PLAN_OPTIONS = dict(
    schedule=dict(type="list", elements="dict"),
    gates=dict(type="list", elements="dict"),
    restart=dict(type="bool", default=False),
    epoch=dict(type="int"),
    take_epoch=dict(type="bool", default=False),
    progress_deadline=dict(type="raw", default=rollout.PROGRESS_DEADLINE_AUTO),
    progress_deadline_abort=dict(type="bool", default=False),
    gate_interval=dict(type="int", default=60),
)


def _progress(params):
    """The plan's progress deadline, from the normalised schedule it is judged against."""
    return rollout.planned_progress(
        params["schedule"],
        params.get("progress_deadline", rollout.PROGRESS_DEADLINE_AUTO),
        params.get("gate_interval", 60),
        params.get("progress_deadline_abort", False),
    )


def run(params, check_mode):
    """Work out the new record, write it outside check mode; the module's result, with its
    diff under _diff."""
    now = utc_now()
    actor = params["actor"] or rollout.default_actor()
    action = params["action"]
    path = params["path"]
    note = None
    records = None
    if action == "sync":
        # A node's copy: always the file at path, whatever the controller's records are in.
        after = record_codec.decode_record(params["record"], "record")
        before = record_codec.read_json_file(path)
        changed = before != after
    else:
        records = rollout_records.records_from_params(params)
        before, token = records.read()
        if action == "plan":
            after, changed, note = rollout.plan(
                before,
                params["rollout_id"],
                params["schedule"],
                params["gates"],
                params["restart"],
                now,
                actor,
                epoch=params.get("epoch"),
                take_epoch=params.get("take_epoch", False),
                progress=_progress(params),
            )
        elif action == "status":
            after, changed = before, False
        else:
            after, changed = rollout.apply(before, action, params, now, actor)
    events = []
    if changed and not check_mode:
        if records is None:
            record_codec.write_record(path, after)
        else:
            events = records.write(after, token)
    result = {
        "changed": changed,
        "record": after,
        "summary": rollout.summary(after, now),
        "resume": rollout.resume_point(after, now) if after else None,
        "lagging_nodes": rollout.lagging_nodes(after) if after else [],
        "_diff": {"before": before or {}, "after": after or {}},
    }
    if note is not None:
        result["note"] = note
    result["events"] = events
    if events:
        result["notifications"] = notify.hand_off(records.store)
    return result
