#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: canary_reconcile
short_description: Decide the canary's next instruction from the rollout record
description:
  - One reconcile step of C(playbooks/canary.yml), which repeats reconcile, act, confirm. It reads
    the record of the wave the run is at, once, from the rollout store (a file under
    O(record_dir) without one), takes what the last act saw (O(readbacks), O(split_reads),
    O(verdict), O(rollback_report)) and what this run did so far (O(run), the previous result's
    RV(run)), makes the record changes that follow in one write, and returns one instruction
    (RV(kind)).
  - V(write) the stage's weight and cohort with O(epoch) to RV(nodes), then read them back;
    V(measure) the split each node's router makes; V(hold) while the gates decide; V(rollback)
    every node of the rollout now; V(stop) with RV(halt); V(done), every wave is completed.
  - A wave is planned (or resumed) once a run; O(request), a person's decision, applies once, to
    the first wave still in progress. Before a V(write) it confirms, with O(owner_lease), that this
    runner still owns the rollout scope; a runner that lost it writes nothing.
  - The decisions at each point are those of C(module_utils/rollout/rollout_steps.py), strung
    together in C(module_utils/rollout/reconcile.py). On the controller the action plugin of the
    same name runs it in the controller's own process.
version_added: 0.2.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  rollout_id:
    description: The rollout; each wave's record is V(<rollout_id>:<wave>).
    type: str
    required: true
  waves:
    description: The waves in order, each an inventory group.
    type: list
    elements: str
    required: true
  inventory_groups:
    description: The inventory's groups (C(groups)), for each wave's nodes.
    type: dict
    required: true
  play_hosts:
    description: The play's hosts (C(ansible_play_hosts_all)); a wave's nodes are its group's
      hosts among them.
    type: list
    elements: str
    required: true
  schedule:
    description: The schedule of every wave not in O(wave_schedules) (null is the default
      1% -> 5% -> 20% -> 100%).
    type: list
    elements: dict
  wave_schedules:
    description: A schedule per wave name, where it differs.
    type: dict
    default: {}
  gates:
    description: The gate definitions each record keeps.
    type: list
    elements: dict
  restart:
    description: Start each wave over with the given schedule (once a run).
    type: bool
    default: false
  epoch:
    description: The fleet's fence epoch this run took; every weight write carries it.
    type: int
  take_epoch:
    description: Carry on with a rollout that took an older epoch, on purpose.
    type: bool
    default: false
  progress_deadline:
    description: The progress deadline (seconds, a duration, or V(auto)).
    type: raw
    default: auto
  progress_deadline_abort:
    description: Abort a rollout past its progress deadline.
    type: bool
    default: false
  gate_interval:
    description: Seconds between two gate evaluations (for the V(auto) deadline).
    type: int
    default: 60
  pause_after_weight:
    description: Pause the wave after the stage of this weight, as planned (0 for none).
    type: float
    default: 0
  routes:
    description: The canary's routes.
    type: list
    elements: str
    required: true
  split:
    description:
      - How a stage's measured split is judged and waited for, C(min_connections) (0 measures
        nothing), C(sigmas), C(floor_pct), C(wait_s) and C(poll_s).
    type: dict
    required: true
  request:
    description: A person's decision for the first wave in progress.
    type: str
    choices: [run, pause, resume, promote, promote_full, abort]
    default: run
  fence:
    description: The result of M(zerolayer.fleet.rollout_fence) V(read) at the start. With a
      store and no RV(zerolayer.fleet.rollout_fence#module:fence) in it, an V(abort) rolls back
      without the records.
    type: dict
    default: {}
  record_dir:
    description: The controller's copies of the records (the records themselves without a store)
      and the gates' state, under V(<record_dir>/<rollout_id>/).
    type: path
    required: true
  owner_scope:
    description: The rollout scope this runner owns.
    type: str
  owner_lease:
    description: The lease M(zerolayer.fleet.rollout_owner) V(acquire) returned.
    type: int
  run:
    description: The previous result's RV(run); omitted for the first step of a run.
    type: dict
  readbacks:
    description: After a V(write), each node's M(zerolayer.fleet.route_info) C(routes).
    type: dict
    default: {}
  split_reads:
    description: After a V(measure), each node's M(zerolayer.fleet.route_info) C(routes).
    type: dict
    default: {}
  verdict:
    description: After a V(hold), the last M(zerolayer.fleet.canary_gate) result.
    type: dict
    default: {}
  rollback_report:
    description: After a V(rollback), the rollback's report.
    type: dict
    default: {}
  actor:
    description: Who the record's transitions name (default user@host).
    type: str
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying
      target.
    support: full
    details: Works out the record's changes and the instruction, but writes nothing.
  diff_mode:
    description: Not supported.
    support: none
extends_documentation_fragment:
  - zerolayer.fleet.store.optional
seealso:
  - module: zerolayer.fleet.rollout_state
  - module: zerolayer.fleet.canary_gate
"""

EXAMPLES = r"""
- name: Reconcile, the next instruction
  zerolayer.fleet.canary_reconcile:
    rollout_id: chat-2026-12
    waves: [wave_canary, wave_rest]
    inventory_groups: "{{ groups }}"
    play_hosts: "{{ ansible_play_hosts_all }}"
    routes: [chat]
    split: {min_connections: 100, sigmas: 4, floor_pct: 0.5, wait_s: 120, poll_s: 2}
    record_dir: /var/lib/zerolayer/canary
    run: "{{ next_step.run | default(omit) }}"
  register: next_step
  run_once: true
  delegate_to: localhost
"""

RETURN = r"""
kind:
  description: The instruction.
  returned: always
  type: str
  sample: write
wave:
  description: The wave it is for.
  returned: always
  type: str
nodes:
  description: The wave's nodes, for V(write), V(measure) and V(hold).
  returned: when kind is write, measure or hold
  type: list
  elements: str
stage:
  description: The stage (0-based).
  returned: when kind is write, measure or hold
  type: int
weight:
  description: The stage's weight in percent.
  returned: when kind is write, measure or hold
  type: float
weight_bp:
  description: The stage's weight in basis points.
  returned: when kind is write
  type: int
cohort:
  description: The stage's always_direct prefixes, or null where the schedule sets none.
  returned: when kind is write
  type: list
epoch:
  description: The epoch the write carries.
  returned: when kind is write
  type: int
readbacks:
  description: Each node's routes as read back after the write, for the split's measure.
  returned: when kind is measure
  type: dict
attempts:
  description: How many reads of the counters the split's wait allows.
  returned: when kind is measure
  type: int
hold_s:
  description: The stage's hold in seconds.
  returned: when kind is hold
  type: float
hold_started_at:
  description: When the stage's hold started (a resumed run keeps it).
  returned: when kind is hold
  type: str
rollback:
  description: Why and how the run rolls back, C(kind) (V(rolled_back) or V(aborted)) and
    C(reason).
  returned: always
  type: dict
halt:
  description: How the run stops, C(kind), C(failed), C(wave), C(message); empty otherwise.
  returned: always
  type: dict
copies:
  description: Records to copy to their wave's nodes first, each C(wave), C(nodes), C(record).
  returned: always
  type: list
  elements: dict
run:
  description: What this run has done, for the next step's O(run); C(waves) are the summaries
    of the waves this run completed.
  returned: always
  type: dict
record:
  description: The record of the wave reconciled, after its changes.
  returned: when a wave's record was read
  type: dict
summary:
  description: Its summary.
  returned: when a wave's record was read
  type: dict
waves:
  description: Each wave reconciled in this step, with its record, summary and changes.
  returned: always
  type: list
  elements: dict
events:
  description: The events the record writes made.
  returned: always
  type: list
  elements: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller.canary_reconcile import (
    ARGUMENT_SPEC,
    REQUIRED_TOGETHER,
    run,
)


def main():
    # On the controller the action plugin of the same name runs this in its own process.
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC,
        required_together=REQUIRED_TOGETHER,
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
