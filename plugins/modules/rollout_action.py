#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_action
short_description: A person's action on a rollout, written to the rollout store
description:
  - The same actions as C(zerolayer rollout), for playbooks and AWX job templates
    (C(playbooks/rollout.yml)). Every action checks everything before it writes, and every
    record write is a compare-and-swap, so a bad argument changes nothing.
  - V(status) and V(history) only read. V(pause), V(resume), V(promote) and V(promote_full)
    change the rollout's records; a running canary honours them at its next gate evaluation.
  - V(abort) raises the fleet's fence epoch first (no node can be raised after it) and marks
    every wave aborted; RV(fence) carries the epoch to push to the nodes with the fast rollback.
  - An unknown O(rollout_id) or O(wave) fails listing the known ones; an action the rollout's
    state forbids (promote of a finished rollout, resume of one a rollback fenced) fails saying
    why. RV(outcome) tells the two apart.
version_added: 0.2.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  action:
    description: What to do.
    type: str
    required: true
    choices: [status, pause, resume, promote, promote_full, abort, history]
  rollout_id:
    description: The rollout. Required by every action but V(status), which then shows them all.
    type: str
  wave:
    description: Only this wave (V(pause), V(resume), V(promote)); default every wave concerned.
    type: str
  reason:
    description: Why, kept with the transition and shown to the runner it stops.
    type: str
    default: requested with playbooks/rollout.yml
  actor:
    description: Who acts; defaults to user@host of the controller.
    type: str
extends_documentation_fragment:
  - zerolayer.fleet.store
attributes:
  check_mode:
    description: Not supported; an action is one write the runner acts on at once.
    support: none
  diff_mode:
    description: Not supported.
    support: none
"""

EXAMPLES = r"""
- name: Pause the rollout, the runner stops at its next gate evaluation
  zerolayer.fleet.rollout_action:
    action: pause
    rollout_id: vllm-0.9
    reason: p99 latency page
    endpoints: ["https://10.0.0.5:2379"]
    ca_file: /etc/zerolayer/pki/ca.pem
    user: zerolayer-controller
    password_file: /etc/zerolayer/pki/controller.password
  delegate_to: localhost
"""

RETURN = r"""
result:
  description: What the action returned (status, the waves changed, the raised fence, history).
  returned: success
  type: dict
fence:
  description: The fence V(abort) raised.
  returned: when O(action=abort)
  type: dict
outcome:
  description: Why it failed, V(bad_input), V(refused) or V(unreachable).
  returned: failure
  type: str
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    FleetError,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_ops,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import StoreUnavailable
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
    store_options,
)


def run(store, params):
    action, rollout_id, reason = params["action"], params["rollout_id"], params["reason"]
    actor = params["actor"] or rollout.default_actor()
    if action == "status":
        return False, rollout_ops.status(store, rollout_id)
    if rollout_id is None:
        raise FleetError(
            "rollout_id is required by action %s" % action,
            {"field": "rollout_id", "outcome": "bad_input"},
        )
    if action == "history":
        return False, {"history": rollout_ops.history(store, rollout_id)}
    if action == "abort":
        return True, rollout_ops.abort(store, rollout_id, reason, actor)
    if action in ("promote", "promote_full"):
        waves = rollout_ops.promote(
            store, rollout_id, reason, actor, full=action == "promote_full", wave=params["wave"]
        )
    else:
        waves = getattr(rollout_ops, action)(store, rollout_id, reason, actor, wave=params["wave"])
    return any(wave["changed"] for wave in waves.values()), {"waves": waves}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(type="str", required=True, choices=list(rollout_ops.ACTIONS)),
            rollout_id=dict(type="str"),
            wave=dict(type="str"),
            reason=dict(type="str", default="requested with playbooks/rollout.yml"),
            actor=dict(type="str"),
            **store_options(),
        ),
        supports_check_mode=False,
    )
    try:
        changed, result = run(store_from_params(module.params), module.params)
    except StoreUnavailable as exc:
        module.fail_json(outcome="unreachable", **exc.fail_json_kwargs())
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    output = {"changed": changed, "result": result}
    if "fence" in result:
        output["fence"] = result["fence"]
    module.exit_json(**output)


if __name__ == "__main__":
    main()
