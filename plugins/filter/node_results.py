# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Each node's registered result (one key of it), as a filter over hostvars."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: node_results
short_description: One field of a registered result, for each of some nodes
version_added: 0.2.0
description:
  - Takes C(hostvars) (I(_input)) and returns, for each node in I(nodes), the field I(key) of the
    result the node registered as I(var), or null where the node has none (the task was skipped
    there, failed without it, or never ran).
  - The canary hands its nodes' read-backs to M(zerolayer.fleet.canary_reconcile) this way.
positional: _input, nodes, var, key
options:
  _input:
    description: C(hostvars).
    type: dict
    required: true
  nodes:
    description: The nodes.
    type: list
    elements: str
    required: true
  var:
    description: The registered variable.
    type: str
    required: true
  key:
    description: The field of it.
    type: str
    required: true
"""

EXAMPLES = r"""
- name: Hand each node's routes to the reconcile
  zerolayer.fleet.canary_reconcile:
    readbacks: "{{ hostvars | zerolayer.fleet.node_results(['n1', 'n2'], 'readback', 'routes') }}"
"""

RETURN = r"""
_value:
  description: "{node: the field, or null}."
  type: dict
"""


def node_results(hostvars, nodes, var, key):
    if not isinstance(var, str) or not isinstance(key, str):
        raise AnsibleFilterError("node_results: var and key must be names; got %r, %r" % (var, key))
    found = {}
    for node in nodes or []:
        try:
            result = hostvars[node].get(var)
        except KeyError:
            raise AnsibleFilterError(
                "node_results: %r is not a host of the inventory" % node
            ) from None
        found[node] = result.get(key) if isinstance(result, dict) else None
    return found


class FilterModule:
    def filters(self):
        return {"node_results": node_results}
