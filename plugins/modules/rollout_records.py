#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_records
short_description: Mark in the rollout store every rollout a rollback's fence superseded
description:
  - The rollout store is the one list of rollout records (one key per wave,
    C(rollouts/<rollout_id>/<wave>)). A fast or deep rollback raises the fleet's fence, and every
    node's fence watcher then takes its node back to the proxy, whichever rollout put it on the
    direct path. V(mark_rolled_back) marks rolled back, in the store, the records whose
    weights were written at an epoch older than O(fence_epoch), whichever controller started
    the rollout. That is every completed one, and every one of O(rollout_id) whatever its
    state (a wave a person aborted keeps its outcome and gains the rollback's facts). A running or
    paused record of another rollout is left as it is. It reads fenced, its runner stops,
    and it may be resumed on purpose under the new epoch. A record already rolled back is
    left as it is.
  - Each record is a compare-and-swap on the revision read; one that another actor changes in
    between is read again. A record that still cannot be written is named in RV(not_marked) and
    does not stop the others; the module fails only when the store cannot be read at all.
  - The controller's files are copies for its reports. Where O(record_dir) holds a copy of a
    marked record, it is rewritten with the store's.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  action:
    description: What to do.
    type: str
    choices: [mark_rolled_back]
    default: mark_rolled_back
  fence_epoch:
    description:
      - The epoch the rollback raised the fleet's fence to (M(zerolayer.fleet.rollout_fence)).
    type: int
    required: true
  reason:
    description: Why the fleet was rolled back, kept in each record.
    type: str
    required: true
  details:
    description: Facts of the rollback kept in each record, such as its mode and measured time.
    type: dict
    default: {}
  rollout_id:
    description:
      - The rollout the rollback was run for; its records are marked whatever their state.
    type: str
  actor:
    description: Who rolled back. Defaults to user@host.
    type: str
  record_dir:
    description:
      - The controller's copies of the records (C(<record_dir>/<rollout_id>/<wave>.json)); a copy
        that exists is rewritten after its record is marked. No copy is created.
    type: path
extends_documentation_fragment:
  - zerolayer.fleet.store
attributes:
  check_mode:
    description: Names the records it would mark and writes nothing.
    support: full
  diff_mode:
    description: No diff is shown; RV(marked) names what changed.
    support: none
seealso:
  - module: zerolayer.fleet.rollout_fence
  - module: zerolayer.fleet.rollout_state
"""

EXAMPLES = r"""
- name: Mark every rollout the fence superseded rolled back
  zerolayer.fleet.rollout_records:
    action: mark_rolled_back
    fence_epoch: "{{ _rollback_epoch | int }}"
    rollout_id: "{{ canary_rollout_id }}"
    reason: "fast rollback: p99 regression"
    details:
      mode: fast
      wall_time_s: 1.1
    record_dir: "{{ canary_record_dir }}"
    endpoints: "{{ rollout_store_endpoints }}"
    ca_file: /etc/zerolayer/pki/ca.pem
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
marked:
  description:
    - The records (C(<rollout_id>/<wave>)) now marked rolled back (in check mode, those that
      would be).
  returned: always
  type: list
  elements: str
  sample: [chat-v2/gpu_nodes]
unchanged:
  description:
    - The superseded records that already said so (rolled back, or aborted with the rollback).
  returned: always
  type: list
  elements: str
not_marked:
  description: The superseded records that could not be written, with why.
  returned: always
  type: dict
  sample: {chat-v1/gpu_nodes: "the record ... changed while this action was worked out"}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_ops,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
    store_options,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", choices=["mark_rolled_back"], default="mark_rolled_back"),
            fence_epoch=dict(type="int", required=True),
            reason=dict(type="str", required=True),
            details=dict(type="dict", default={}),
            rollout_id=dict(type="str"),
            actor=dict(type="str"),
            record_dir=dict(type="path"),
            **store_options(),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        result = rollout_ops.mark_rolled_back(
            store_from_params(params),
            params["fence_epoch"],
            params["reason"],
            params["details"],
            params["actor"] or rollout.default_actor(),
            rollout_id=params["rollout_id"],
            mirror_dir=params["record_dir"],
            check=module.check_mode,
        )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(changed=bool(result["marked"]), **result)


if __name__ == "__main__":
    main()
