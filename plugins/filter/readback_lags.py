# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Whether a node's read-back misses the stage, as a filter (a thin shell over module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_steps import (
    readback_lags as node_lags,
)

DOCUMENTATION = r"""
name: readback_lags
short_description: Whether one node's route read-back misses a canary stage
version_added: 0.1.0
description:
  - Takes M(zerolayer.fleet.route_info)'s C(routes) of one node (I(_input)) and tells whether
    the canary's I(routes) are not yet at the stage - a route missing, at a weight other than
    I(weight_bp), or, at a stage that sets a cohort, holding another C(always_direct).
  - The read-back retries while this is true; M(zerolayer.fleet.rollout_state)'s C(confirmed)
    step judges each node by the same rule.
positional: _input, routes, weight_bp, cohort
options:
  _input:
    description: The node's routes as route_info read them.
    type: list
    elements: dict
    required: true
  routes:
    description: The names of the canary's routes.
    type: list
    elements: str
    required: true
  weight_bp:
    description: The stage's weight in basis points (0-10000).
    type: int
    required: true
  cohort:
    description: The stage's cohort (its always_direct prefixes), or null where the stage sets
      none.
    type: list
    elements: str
"""

EXAMPLES = r"""
- name: Read the routes back until they are at the stage
  zerolayer.fleet.route_info:
  register: readback
  until: not (readback.routes | zerolayer.fleet.readback_lags(['chat'], 500, none))
  retries: 5
  delay: 1
"""

RETURN = r"""
_value:
  description: True while the node misses the stage.
  type: bool
"""


def readback_lags(read, routes, weight_bp, cohort=None):
    try:
        return node_lags(read, routes, int(weight_bp), cohort)
    except (AttributeError, TypeError, ValueError) as error:
        raise AnsibleFilterError("readback_lags: %s" % error) from None


class FilterModule:
    def filters(self):
        return {"readback_lags": readback_lags}
