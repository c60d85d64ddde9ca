# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Each node's confirmation in a rollback report, and how its direct connections left, as
filters (thin shells over module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollback_confirmation import (
    direct_drains,
    node_confirmations,
)

DOCUMENTATION = r"""
name: rollback_confirmations
short_description: Each node's line in a rollback report, from acknowledgements and pushes
version_added: 0.2.0
description:
  - For every node of I(_input), in order, the entry the rollback report lists. A node in
    I(acked) is confirmed by its fence watcher (the entry is built from its acknowledgement);
    any other takes its entry from I(pushed), else from I(push_results); a node in none of them
    did not answer.
positional: _input, acked, pushed, mode, push_results
options:
  _input:
    description: The rollback's target nodes (inventory names).
    type: list
    elements: str
    required: true
  acked:
    description: The acknowledgements counted (C(acked) of M(zerolayer.fleet.rollout_fence)).
    type: dict
    required: true
  pushed:
    description: The entry a sharded push handed back for each node (null or absent where none).
    type: dict
    required: true
  mode:
    description: The rollback's mode.
    type: str
    choices: [fast, deep]
    required: true
  push_results:
    description:
      - What this process's push left on each node it pushed. Fast, the registered result of the
        raw call (C(zerolayer-routectl rollback) prints one JSON line; the node is confirmed when
        it exited 0 and says C(rolled_back)); deep, the entry C(deep_push.yml) noted.
    type: dict
    default: {}
"""

EXAMPLES = r"""
- name: Gather each node's confirmation
  ansible.builtin.set_fact:
    nodes: "{{ targets | zerolayer.fleet.rollback_confirmations(acked, {}, 'fast', raw) }}"
"""

RETURN = r"""
_value:
  description:
    - One dict per node with C(node), C(reached), C(confirmed), C(confirmed_by) (watcher or
      push) and C(error); fast entries add C(routes), deep ones C(router_removed),
      C(proxy_running) and C(paths).
  type: list
  elements: dict
"""


def rollback_confirmations(targets, acked, pushed, mode, push_results=None):
    try:
        return node_confirmations(targets, acked, pushed, mode, push_results)
    except FleetError as error:
        raise AnsibleFilterError("rollback_confirmations: %s" % error.message) from None


class FilterModule:
    def filters(self):
        # direct_drains is documented with the module_utils function it calls: the rollback
        # report is its one user.
        return {"rollback_confirmations": rollback_confirmations, "direct_drains": direct_drains}
