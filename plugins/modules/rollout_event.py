#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_event
short_description: Record a rollout event in the rollout store and tell the notification sinks
description:
  - The rollout store keeps every rollout's history as events. Each write of a wave's record
    (M(zerolayer.fleet.rollout_state), C(zerolayer rollout pause) and the other verbs) stores
    the events of its transitions in the same transaction. This module records the acts that
    are not record transitions, such as a fleet rollback with its measured time, an engine
    upgrade or a drill's result, and reads the history.
  - V(emit) stores one event and hands it to the fleet's one sender of notifications, which sends
    it to the sinks kept in the store after every event before it. The module does not wait for
    the sends, so a sink that is down or slow never holds up the act it tells of (its misses are
    in C(zerolayer notifications show)).
  - V(list) returns the events of O(rollout_id) (with the fleet-wide ones since it started), or of
    every rollout.
  - V(configure) replaces the notification sinks kept in the store with O(notifications), each a
    generic JSON webhook or a Slack-compatible incoming webhook, with the event types and the
    rollout ids (glob patterns) it hears of. The addresses and headers are secrets, never
    returned or shown in a diff.
version_added: 0.3.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  action:
    description: What to do.
    type: str
    choices: [emit, list, configure]
    default: emit
  type:
    description:
      - The event type, for V(emit). One of V(started), V(gates_changed), V(epoch_taken),
        V(stage_started), V(weight_confirmed), V(split_verified), V(split_off), V(hold_started),
        V(gate_verdicts_changed), V(hold_done), V(promoted), V(paused), V(resumed), V(aborted),
        V(rolled_back), V(completed), V(fleet_rolled_back), V(engine_upgraded),
        V(engine_swapped_back), V(drill_finished), V(notification_test).
    type: str
  rollout_id:
    description: The rollout the event belongs to; none for a fleet-wide act (a fleet rollback).
    type: str
  wave:
    description: The wave of the rollout.
    type: str
  stage:
    description: The stage, counted from 1.
    type: int
  weight:
    description: The weight in percent the event is about.
    type: float
  nodes:
    description: The nodes the event is about.
    type: list
    elements: str
    default: []
  reason:
    description: Why, in words.
    type: str
  actor:
    description: Who acted. Defaults to user@host.
    type: str
  detail:
    description: More fields of the event, such as V(mode) and V(seconds) of a rollback.
    type: dict
    default: {}
  notifications:
    description:
      - For V(configure), the sinks. Each has V(name), V(url) (C(https://); C(http://) only with
        V(allow_http=true) on that sink), V(format) (V(json) or V(slack)),
        V(events) (event types, or V([all])), V(rollouts) (glob patterns of rollout ids, default
        V(["*"])), V(headers), V(timeout_s) (default 3) and V(attempts) (default 3).
    type: list
    elements: dict
  best_effort:
    description:
      - For V(emit), a rollout store that fails in any way (not reached, an error answered, settings
        that cannot make a client) is a warning and RV(stored=false), not a failure. For reports
        after an act that must not fail on its own record (a rollback run while the store is
        down).
    type: bool
    default: false
extends_documentation_fragment:
  - zerolayer.fleet.store
attributes:
  check_mode:
    description: V(emit) and V(configure) work out what they would write and write nothing.
    support: full
  diff_mode:
    description: V(configure) shows the sinks before and after, with their secrets hidden.
    support: full
seealso:
  - module: zerolayer.fleet.rollout_state
"""

EXAMPLES = r"""
- name: Send rollout events to the on-call webhook and to Slack
  zerolayer.fleet.rollout_event:
    action: configure
    endpoints: "{{ rollout_store_endpoints }}"
    ca_file: /etc/zerolayer/pki/ca.pem
    user: controller
    password_file: /etc/zerolayer/pki/controller.password
    notifications:
      - name: oncall
        url: "{{ vault_oncall_webhook }}"
        events: [paused, aborted, rolled_back, fleet_rolled_back, split_off]
      - name: rollouts-channel
        url: "{{ vault_slack_webhook }}"
        format: slack
        rollouts: ["chat-*"]
  delegate_to: localhost
  run_once: true

- name: Record the rollback and its measured time
  zerolayer.fleet.rollout_event:
    type: fleet_rolled_back
    endpoints: "{{ rollout_store_endpoints }}"
    nodes: "{{ ansible_play_hosts }}"
    reason: "{{ rollback_reason }}"
    detail:
      mode: fast
      seconds: 1.7
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
event:
  description: The event V(emit) stored.
  returned: when O(action=emit)
  type: dict
  sample:
    type: fleet_rolled_back
    at: "2026-12-01T10:00:02Z"
    rollout_id: null
    nodes: [gpu-1, gpu-2]
    reason: p99 regression
    actor: oncall@ctl-1
    detail: {mode: fast, seconds: 1.7}
events:
  description: The events, oldest first.
  returned: when O(action=list)
  type: list
  elements: dict
stored:
  description: For V(emit), whether the event is in the store (false only with O(best_effort)).
  returned: when O(action=emit)
  type: bool
notifications:
  description:
    - For V(emit), the hand-off to the sender (V(sinks), V(sender) V(started), V(running) or
      V(none needed)); for V(configure), the sinks with their secrets hidden.
  returned: when O(action=emit) or O(action=configure)
  type: raw
  sample: {sinks: 2, sender: started, pid: 4242}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_failure,
    store_from_params,
    store_options,
)


def emit(params, check_mode):
    if params["rollout_id"] is not None:
        record_codec.validate_rollout_id(params["rollout_id"])
    entry = rollout_events.event(
        params["type"],
        params["rollout_id"],
        format_timestamp(utc_now()),
        params["actor"] or rollout.default_actor(),
        wave=params["wave"],
        stage=params["stage"],
        weight=params["weight"],
        nodes=params["nodes"],
        reason=params["reason"],
        **params["detail"],
    )
    rollout_events.validate_event_type(entry["type"])
    if check_mode:
        return {"changed": True, "event": entry, "stored": False}
    # Best effort: any failure of the store, reached or not (no leader, NOSPACE, a refused
    # login, an unreadable password file), is a warning after the act it records.
    try:
        store = store_from_params(params)
        rollout_events.emit(store, entry)
    except MODULE_FAILURES as exc:
        if not params["best_effort"]:
            raise
        warning = store_failure(exc)["store_error"]
        return {"changed": False, "event": entry, "stored": False, "_warning": warning}
    sent = notify.hand_off(store)
    return {"changed": True, "event": entry, "stored": True, "notifications": sent}


def configure(store, params, check_mode):
    wanted = notify.validate_sinks(params["notifications"] or [])
    current = notify.read_sinks(store)
    changed = current != wanted
    if changed and not check_mode:
        notify.write_sinks(store, wanted)
    return {
        "changed": changed,
        "notifications": notify.redacted(wanted),
        "_diff": {"before": notify.redacted(current), "after": notify.redacted(wanted)},
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", choices=["emit", "list", "configure"], default="emit"),
            type=dict(type="str"),
            rollout_id=dict(type="str"),
            wave=dict(type="str"),
            stage=dict(type="int"),
            weight=dict(type="float"),
            nodes=dict(type="list", elements="str", default=[]),
            reason=dict(type="str"),
            actor=dict(type="str"),
            detail=dict(type="dict", default={}),
            notifications=dict(type="list", elements="dict", no_log=True),
            best_effort=dict(type="bool", default=False),
            **store_options(),
        ),
        required_if=[("action", "emit", ["type"]), ("action", "configure", ["notifications"])],
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["action"] == "list":
            result = {
                "changed": False,
                "events": rollout_events.list_events(
                    store_from_params(params), params["rollout_id"]
                ),
            }
        elif params["action"] == "configure":
            result = configure(store_from_params(params), params, module.check_mode)
        else:
            result = emit(params, module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    warning = result.pop("_warning", None)
    if warning:
        module.warn("the event was not stored: %s" % warning)
    diff = result.pop("_diff", None)
    if module._diff and diff and result["changed"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
