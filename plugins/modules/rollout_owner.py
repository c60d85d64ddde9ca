#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_owner
short_description: One runner per rollout scope, on a lease in the rollout store
description:
  - V(acquire) takes the rollout scope (the hosts a canary rolls out, by their inventory pattern)
    for this runner on an etcd lease and starts a heartbeat that keeps the lease alive while the
    runner (the calling C(ansible-playbook) process) lives. A second runner is refused with the
    holder's identity (host, pid, rollout id, since) and the seconds its lease has left.
  - A runner that dies stops its heartbeat; its lease expires after O(ttl) seconds and the scope is
    free again. Until then V(status) shows the dead runner as the holder. A runner started on the
    same controller (a resume after a crash) sees that the holder's process is gone and waits for
    its lease to expire, at most O(ttl) seconds, instead of being refused.
  - V(release) gives the scope up at once (the lease is revoked, the heartbeat ends by itself).
  - V(status) reads the holder, if any.
  - V(confirm) checks that the runner of O(lease) still holds the scope and fails otherwise,
    naming who holds it now (or nobody). A runner whose heartbeat could not renew its lease
    for O(ttl) seconds (a partition, a stalled controller) has lost the scope, and another
    runner may have taken it; the canary confirms before each write that raises traffic.
version_added: 0.2.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  action:
    description: What to do.
    type: str
    choices: [acquire, release, status, confirm]
    default: status
  scope:
    description: The rollout scope, the inventory pattern of the hosts rolled out (C(canary_hosts)).
    type: str
    required: true
  rollout_id:
    description: The rollout this runner runs, shown to a second runner. Required to V(acquire).
    type: str
  hosts:
    description:
      - The hosts of the scope (for a play, C(ansible_play_hosts_all)). Kept with the holder;
        V(acquire) also refuses when a scope under another name is held with hosts among
        these, naming that holder and the hosts in both.
      - Left out, only the same scope name is checked.
    type: list
    elements: str
  ttl:
    description: Seconds the lease lives without a heartbeat; the heartbeat renews it every third.
    type: int
    default: 30
  lease:
    description: The lease V(acquire) returned, to V(release) or V(confirm).
    type: int
extends_documentation_fragment:
  - zerolayer.fleet.store
attributes:
  check_mode:
    description:
      - In check mode V(acquire) and V(release) only read the holder; V(confirm) reads and
        fails as it does outside check mode.
    support: full
  diff_mode:
    description: Not supported.
    support: none
"""

EXAMPLES = r"""
- name: Own the rollout of the GPU nodes
  zerolayer.fleet.rollout_owner:
    action: acquire
    scope: gpu_nodes
    rollout_id: vllm-0.9
    endpoints: ["https://10.0.0.5:2379"]
    ca_file: /etc/zerolayer/pki/ca.pem
    cert_file: /etc/zerolayer/pki/controller.pem
    key_file: /etc/zerolayer/pki/controller-key.pem
  register: owner
  delegate_to: localhost
  run_once: true

- name: Write no weight unless this runner still holds the scope
  zerolayer.fleet.rollout_owner:
    action: confirm
    scope: gpu_nodes
    lease: "{{ owner.owner.lease }}"
    endpoints: ["https://10.0.0.5:2379"]
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
owner:
  description: The holder of the scope (this runner after V(acquire)), or null when free.
  returned: always
  type: dict
  sample:
    host: ctl-1
    pid: 4242
    rollout_id: vllm-0.9
    since: "2026-12-01T10:00:00Z"
    lease: 7587899277992058635
    ttl_s: 30
heartbeat_pid:
  description: The process keeping the lease alive.
  returned: after V(acquire)
  type: int
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import heartbeat
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    runner_identity,
    store_from_params,
    store_options,
    validate_scope,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            action=dict(
                type="str", choices=["acquire", "release", "status", "confirm"], default="status"
            ),
            scope=dict(type="str", required=True),
            rollout_id=dict(type="str"),
            hosts=dict(type="list", elements="str"),
            ttl=dict(type="int", default=30),
            lease=dict(type="int"),
            **store_options(),
        ),
        required_if=[
            ("action", "acquire", ["rollout_id"]),
            ("action", "release", ["lease"]),
            ("action", "confirm", ["lease"]),
        ],
        supports_check_mode=True,
    )
    params = module.params
    try:
        scope = validate_scope(params["scope"])
        store = store_from_params(params)
        if params["action"] == "confirm":
            module.exit_json(changed=False, owner=store.confirm_owner(scope, params["lease"]))
        if params["action"] == "status" or module.check_mode:
            module.exit_json(changed=False, owner=store.owner(scope))
        if params["action"] == "release":
            store.release(scope, params["lease"])
            module.exit_json(changed=True, owner=store.owner(scope))
        runner = heartbeat.runner_process()
        holder = store.acquire(
            scope,
            runner_identity(params["rollout_id"], *runner),
            params["ttl"],
            alive=heartbeat.alive,
            hosts=params["hosts"],
        )
        pid = heartbeat.start_detached(store.client, holder["lease"], runner, params["ttl"])
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(changed=True, owner=holder, heartbeat_pid=pid)


if __name__ == "__main__":
    main()
