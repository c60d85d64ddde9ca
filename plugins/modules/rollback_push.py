#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollback_push
short_description: Push a rollback to many nodes from several controller processes at once
description:
  - Runs on the controller. Splits the nodes a rollback must push to (those whose fence watcher
    did not confirm) into shards and runs O(playbook) once per shard, each in an
    C(ansible-playbook) process of its own and all at the same time, then returns what each node
    confirmed. One C(ansible-playbook) handles every node of a play in one main process; several
    shards use several of the controller's CPUs.
  - With no more than O(shard_nodes) nodes, or one process allowed, it shards nothing and returns
    RV(sharded=false), and the calling playbook pushes to them itself.
  - A shard that fails or does not finish within O(timeout_s) is ended with its process group; its
    nodes are returned unconfirmed, with why.
  - The shards get the inventory sources and O(push_vars) as extra vars; other extra vars of the
    calling run are not passed on.
version_added: 0.3.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  nodes:
    description: The nodes to push to, by inventory name.
    type: list
    elements: str
    required: true
  mode:
    description: The rollback's mode; the shard runs that mode's push.
    type: str
    choices: [fast, deep]
    required: true
  shard_nodes:
    description: The fewest nodes a shard gets; no more nodes than this are not sharded.
    type: int
    default: 50
  processes:
    description: At most this many shard processes; V(0) is one per CPU of the controller.
    type: int
    default: 0
  timeout_s:
    description: How long the shards may take together, in seconds.
    type: float
    default: 120
  inventory:
    description: The inventory sources the shards read (C(ansible_inventory_sources)).
    type: list
    elements: str
    required: true
  playbook:
    description: The push playbook each shard runs (playbooks/rollback_push.yml).
    type: path
    required: true
  python:
    description: The Python that runs C(ansible-playbook) (C(ansible_playbook_python)).
    type: path
    required: true
  config_file:
    description: The Ansible configuration file the shards use (C(ansible_config_file)).
    type: path
  push_vars:
    description: Extra vars for every shard (the fence epoch, the deep push's settings).
    type: dict
    default: {}
notes:
  - Check mode starts no shard and returns the plan.
"""

EXAMPLES = r"""
- name: Push to many lagging nodes from several controller processes at once
  zerolayer.fleet.rollback_push:
    nodes: "{{ lagging }}"
    mode: fast
    inventory: "{{ ansible_inventory_sources }}"
    playbook: "{{ playbook_dir }}/rollback_push.yml"
    python: "{{ ansible_playbook_python }}"
    config_file: "{{ ansible_config_file }}"
    push_vars:
      _rollback_epoch: 42
  register: pushed
"""

RETURN = r"""
sharded:
  description: Whether the nodes were pushed by shards; false when the caller pushes to them.
  returned: always
  type: bool
nodes:
  description: Each sharded node's confirmation, as the push noted it.
  returned: always
  type: dict
shards:
  description: Per shard, its node count, exit status and seconds.
  returned: always
  type: list
  elements: dict
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.push_shards import plan, run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            nodes=dict(type="list", elements="str", required=True),
            mode=dict(type="str", choices=["fast", "deep"], required=True),
            shard_nodes=dict(type="int", default=50),
            processes=dict(type="int", default=0),
            timeout_s=dict(type="float", default=120.0),
            inventory=dict(type="list", elements="str", required=True),
            playbook=dict(type="path", required=True),
            python=dict(type="path", required=True),
            config_file=dict(type="path"),
            push_vars=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["processes"] < 0:
        module.fail_json(
            msg="processes must be 0 (one per CPU) or more; got %d" % params["processes"],
            field="processes",
        )
    if params["timeout_s"] <= 0:
        module.fail_json(
            msg="timeout_s must be above 0; got %r" % params["timeout_s"], field="timeout_s"
        )
    processes = params["processes"] or os.cpu_count() or 1
    env = dict(os.environ)
    if params["config_file"]:
        env["ANSIBLE_CONFIG"] = params["config_file"]
    try:
        shards = plan(params["nodes"], params["shard_nodes"], processes)
        planned = [{"shard": index, "nodes": len(nodes)} for index, nodes in enumerate(shards)]
        if not shards or module.check_mode:
            module.exit_json(changed=False, sharded=False, nodes={}, shards=planned)
        confirmations, summaries = run(
            shards,
            [params["python"], "-m", "ansible.cli.playbook"],
            params["inventory"],
            params["playbook"],
            params["push_vars"],
            params["mode"],
            params["timeout_s"],
            env=env,
        )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(changed=True, sharded=True, nodes=confirmations, shards=summaries)


if __name__ == "__main__":
    main()
