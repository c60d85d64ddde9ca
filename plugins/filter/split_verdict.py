# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The canary's measured-split check as a filter (a thin shell over module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.traffic_split import (
    split_verdict as judge_split,
)

DOCUMENTATION = r"""
name: split_verdict
short_description: Whether a node's measured split of new connections agrees with its weight
version_added: 0.1.0
description:
  - Out of I(connections) new connections, I(_input) went to the engine. Each connection goes
    there with probability I(weight_pct)/100, so the count is binomial; the agreeing range comes
    from the binomial distribution itself and leaves out, on each side, as much as a normal
    distribution leaves beyond I(sigmas) standard deviations.
  - The range is never narrower than I(weight_pct) +/- I(floor_pct).
  - No connections at all never agrees.
positional: _input, connections, weight_pct
options:
  _input:
    description: New connections the router sent to the engine.
    type: int
    required: true
  connections:
    description: New connections the router looked up over the same window.
    type: int
    required: true
  weight_pct:
    description: The route's weight, percent (0-100).
    type: float
    required: true
  sigmas:
    description: How far out the range reaches, in normal standard deviations (> 0).
    type: float
    default: 4
  floor_pct:
    description: The least half-width of the range, percentage points (0-100).
    type: float
    default: 0.5
"""

EXAMPLES = r"""
- name: Stop when the split is off
  vars:
    verdict: "{{ 6 | zerolayer.fleet.split_verdict(126, 1) }}"
  ansible.builtin.assert:
    that: verdict.ok
    fail_msg: "{{ verdict.measured_pct }}% is outside {{ verdict.low_pct }}-{{ verdict.high_pct }}%"
"""

RETURN = r"""
_value:
  description:
    - A dict with C(ok) (bool), C(measured_pct), C(low_pct) and C(high_pct) (percent, three
      decimals; null when there were no connections).
  type: dict
"""


def split_verdict(to_engine, connections, weight_pct, sigmas=4, floor_pct=0.5):
    try:
        return judge_split(to_engine, connections, weight_pct, sigmas, floor_pct)
    except FleetError as error:
        raise AnsibleFilterError("split_verdict: %s" % error.message) from None


class FilterModule:
    def filters(self):
        return {"split_verdict": split_verdict}
