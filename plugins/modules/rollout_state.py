#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_state
short_description: Keep the canary rollout record (schedule, stage, confirmations, verdicts)
description:
  - Creates, reads and advances the record of one canary rollout, a JSON file at O(path) that is
    replaced atomically on every change. The controller keeps the record; playbooks copy it to
    the nodes with O(action=sync), which writes the same format.
  - The record holds the rollout id, the schedule (stages of weight and hold), the current stage
    and its status (V(pending), V(started), V(holding), V(completed)), the hold start, each node's
    confirmed route generation and weight, the gate verdicts, the pause flag, and the outcome
    (V(running), V(paused), V(completed), V(rolled_back), V(aborted)). Every transition records
    who (user@host, or O(actor)) and when (UTC).
  - O(action=plan) validates the schedule and gate definitions and creates the record or loads
    it. An interrupted run resumes (RV(resume) gives the stage and the hold still to go); a
    finished rollout is returned unchanged so a re-run changes nothing; a different schedule for
    a rollout in progress is refused unless O(restart=true).
  - Every action is idempotent where that makes sense (a second O(action=pause) changes
    nothing); O(action=verdict) always appends.
  - Invalid input fails naming the field and the allowed values, before anything is written.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  path:
    description:
      - The record file, when no rollout store is given (O(endpoints) empty), and always for
        O(action=sync) (a node's copy).
    type: path
  record_key:
    description:
      - With a rollout store, the record's key under C(<prefix>rollouts/), V(<rollout_id>/<wave>).
        Every write is a compare-and-swap on the revision read; a record another actor changed
        in between is not overwritten, the action fails naming who changed it.
    type: str
  timeout:
    description: Seconds to wait for the rollout store.
    type: float
    default: 3.0
  action:
    description:
      - V(plan) creates or loads the record; V(status) reads it and changes nothing.
      - V(stage_started) starts O(stage); V(weight_confirmed) records O(nodes)' read-back
        generation and weight; V(split_measured) keeps each node's measured split of the stage
        (O(splits)); V(hold_started) starts the stage's hold (kept if already set, so
        a resumed run holds only the remainder); V(verdict) appends a gate evaluation;
        V(stage_completed) closes the current stage.
      - V(pause) and V(resume) set and clear the pause flag; V(promote) ends the current stage's
        hold now; V(promote_full) jumps to the last stage (100%).
      - V(abort) (a person stops the rollout), V(rolled_back) (the fleet is back on the proxy
        path; O(details) may carry the measured wall time) and V(completed) finish it.
      - V(sync) writes O(record), a record read elsewhere (the controller's), to O(path).
    type: str
    required: true
    choices: [plan, status, stage_started, weight_confirmed, split_measured, hold_started, verdict,
              stage_completed, pause, resume, promote, promote_full, abort, rolled_back,
              completed, sync]
  rollout_id:
    description:
      - Identifier of the rollout, 1-128 characters of letters, digits, C(.), C(_), C(:) or C(-).
      - Required by O(action=plan); with other actions it must match the record's.
    type: str
  schedule:
    description:
      - Stages for O(action=plan), each with C(weight) (percent, above 0 and at most 100, at most
        two decimals, strictly increasing, the last 100) and C(hold) (whole seconds or a string
        such as V(2h), V(30m), V(90s), V(1h30m)).
      - Defaults to 1% for 2h, 5% for 4h, 20% for 8h, then 100%.
    type: list
    elements: dict
  gates:
    description:
      - Gate definitions to validate and keep in the record with O(action=plan), as
        M(zerolayer.fleet.canary_gate) takes them.
    type: list
    elements: dict
  restart:
    description: With O(action=plan), replace the existing record with a new one.
    type: bool
    default: false
  epoch:
    description:
      - With O(action=plan), the fleet's fence epoch now (M(zerolayer.fleet.rollout_fence)). A new
        record keeps it as the epoch its weight writes carry.
      - A rollout in progress that took an older epoch was rolled back or aborted since; resuming
        it is refused, naming both epochs, unless O(take_epoch) is set.
    type: int
  take_epoch:
    description: With O(action=plan), resume a fenced rollout on purpose under the new O(epoch).
    type: bool
    default: false
  progress_deadline:
    description:
      - With O(action=plan), how long a running wave may go without a record write while no
        runner owns it before it counts as stuck (shown by C(zerolayer rollout status),
        exported by the store's exporter, alerted on, announced as an event).
      - V(auto) is the schedule's longest hold plus three O(gate_interval)s; otherwise whole
        seconds above 0 or a string such as V(2h), V(90m).
      - Kept in the record, so every reader judges the wave by the same deadline.
    type: raw
    default: auto
  progress_deadline_abort:
    description:
      - With O(action=plan), whether a wave found stuck is aborted by the store's exporter
        (a fast rollback of its nodes under a new fence epoch) instead of only announced.
    type: bool
    default: false
  gate_interval:
    description:
      - With O(action=plan), the seconds between gate evaluations, for
        O(progress_deadline=auto).
    type: int
    default: 60
  stage:
    description: Stage index for O(action=stage_started), from 0.
    type: int
  nodes:
    description:
      - For O(action=weight_confirmed), node name to C(generation) (the route generation read
        back) and C(weight) (the weight read back, percent).
    type: dict
  splits:
    description:
      - For O(action=split_measured), node name to its measured split, a
        P(zerolayer.fleet.split_verdict#filter) result (C(ok), C(measured_pct), C(low_pct),
        C(high_pct), C(connections)). Every node must have a confirmed weight in the record.
      - The transition names the nodes that are off; its event is V(split_off) when one is,
        V(split_verified) otherwise.
    type: dict
  verdict:
    description:
      - For O(action=verdict), a registered M(zerolayer.fleet.canary_gate) result, or a dict
        with C(verdict) (V(pass), V(fail) or V(hold)) and optionally C(decision), C(reason),
        C(hold_extension_s) and C(gates).
    type: dict
  reason:
    description: Why, kept with the transition (pause, resume, promote, abort, rolled_back).
    type: str
  details:
    description: Facts kept with O(action=rolled_back), for example the measured wall time.
    type: dict
  record:
    description: For O(action=sync), the record to write (the controller's RV(record)).
    type: dict
  actor:
    description: Who makes the change, recorded with each transition. Defaults to user@host.
    type: str
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying
      target.
    support: full
    details: Works out the new record and reports it, but writes nothing.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in
      check_mode), when in diff mode.
    support: full
    details: The record before and after, when it changes.
extends_documentation_fragment:
  - zerolayer.fleet.store.optional
seealso:
  - module: zerolayer.fleet.canary_gate
"""

EXAMPLES = r"""
- name: Plan the rollout, or resume it where an interrupted run stopped
  zerolayer.fleet.rollout_state:
    path: /var/lib/zerolayer/canary/chat.json
    action: plan
    rollout_id: chat-2025-03-01
    schedule:
      - {weight: 1, hold: 2h}
      - {weight: 5, hold: 4h}
      - {weight: 20, hold: 8h}
      - {weight: 100, hold: 0}
    gates: "{{ canary_gates }}"
  delegate_to: localhost
  run_once: true
  register: plan

- name: Record the weight each node read back
  zerolayer.fleet.rollout_state:
    path: /var/lib/zerolayer/canary/chat.json
    action: weight_confirmed
    nodes:
      gpu-node-1: {generation: 7, weight: 5}
      gpu-node-2: {generation: 4, weight: 5}
  delegate_to: localhost
  run_once: true

- name: Record a gate evaluation
  zerolayer.fleet.rollout_state:
    path: /var/lib/zerolayer/canary/chat.json
    action: verdict
    verdict: "{{ gate }}"
  delegate_to: localhost
  run_once: true

- name: Copy the record to the nodes
  zerolayer.fleet.rollout_state:
    path: /var/lib/zerolayer/rollout.json
    action: sync
    record: "{{ plan.record }}"

- name: Stop the rollout by hand
  zerolayer.fleet.rollout_state:
    path: /var/lib/zerolayer/canary/chat.json
    action: abort
    reason: error budget burn on the chat service
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
record:
  description: The record after the action (null for O(action=status) when there is none).
  returned: always
  type: dict
summary:
  description: The fields a progress display needs.
  returned: always
  type: dict
  contains:
    rollout_id:
      description: Rollout identifier.
      type: str
    outcome:
      description: V(running), V(paused), V(completed), V(rolled_back) or V(aborted).
      type: str
    stage:
      description: Current stage index.
      type: int
    stage_number:
      description: Current stage, counted from 1.
      type: int
    stage_count:
      description: Number of stages.
      type: int
    stage_status:
      description: V(pending), V(started), V(holding) or V(completed).
      type: str
    weight:
      description: The current stage's weight in percent.
      type: float
    hold_remaining_s:
      description: Seconds of hold still to go.
      type: float
    last_verdict:
      description: The latest gate verdict.
      type: str
  sample:
    rollout_id: chat-2025-03-01
    outcome: running
    stage: 1
    stage_number: 2
    stage_count: 4
    stage_status: holding
    weight: 5
    hold_remaining_s: 5400
    last_verdict: pass
resume:
  description:
    - Where the rollout continues (O(action=plan) and O(action=status)); null once it finished.
  returned: always
  type: dict
  contains:
    stage:
      description: Stage index to run.
      type: int
    weight:
      description: Its weight in percent.
      type: float
    stage_status:
      description: Its status; V(holding) means the weight is set and the hold runs.
      type: str
    hold_s:
      description: Its full hold in seconds.
      type: int
    hold_remaining_s:
      description: Hold still to go, the recorded extension included.
      type: float
    hold_started_at:
      description: When its hold started, or null.
      type: str
  sample: {stage: 1, weight: 5, stage_status: holding, hold_s: 14400, hold_remaining_s: 5400}
note:
  description: For O(action=plan), V(created), V(restarted), V(resumed) or the finished outcome.
  returned: when O(action=plan)
  type: str
  sample: resumed
lagging_nodes:
  description: Nodes whose confirmed weight is not the current stage's weight.
  returned: always
  type: list
  elements: str
events:
  description:
    - The events this write stored in the rollout store with the record, in the same
      transaction (type, at, rollout_id, wave, stage, weight, nodes, reason, actor, detail).
      Empty without a store, or when nothing changed.
  returned: always
  type: list
  elements: dict
  sample: [{type: paused, rollout_id: chat-2025-03-01, wave: canary, stage: 2, weight: 5}]
notifications:
  description:
    - The events go to the notification sinks kept in the store (M(zerolayer.fleet.rollout_event)
      O(action=configure)) through the fleet's one sender, started or found running here; the
      write does not wait for the sends. V(sinks), V(sender) (V(started), V(running), V(none
      needed) or V(not started) with V(error)).
  returned: when events were written
  type: dict
  sample: {sinks: 2, sender: started, pid: 4242}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import record_change
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_options,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            path=dict(type="path"),
            record_key=dict(type="str", no_log=False),
            timeout=dict(type="float", default=3.0),
            **store_options(required=False),
            action=dict(type="str", required=True, choices=list(rollout.ACTIONS)),
            rollout_id=dict(type="str"),
            **record_change.PLAN_OPTIONS,
            stage=dict(type="int"),
            nodes=dict(type="dict"),
            splits=dict(type="dict"),
            verdict=dict(type="dict"),
            reason=dict(type="str"),
            details=dict(type="dict"),
            record=dict(type="dict"),
            actor=dict(type="str"),
        ),
        required_if=[
            ("action", "plan", ["rollout_id"]),
            ("action", "stage_started", ["stage"]),
            ("action", "weight_confirmed", ["nodes"]),
            ("action", "split_measured", ["splits"]),
            ("action", "verdict", ["verdict"]),
            ("action", "sync", ["record", "path"]),
        ],
        supports_check_mode=True,
    )
    try:
        result = record_change.run(module.params, module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    diff = result.pop("_diff")
    if module._diff and result["changed"]:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
