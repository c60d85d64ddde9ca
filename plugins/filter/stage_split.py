# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A canary stage's measured split on one node, as a filter (a thin shell over module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.traffic_split import (
    stage_split as judge_stage,
)

DOCUMENTATION = r"""
name: stage_split
short_description: A canary stage's measured split of new connections on one node
version_added: 0.1.0
description:
  - Compares two reads of M(zerolayer.fleet.route_info)'s C(routes) (the canary's routes
    only) - I(_input), read now, and I(before), read when the weight was confirmed.
  - Connections of the routes' cohorts do not follow the weight and are counted apart
    (C(opt_in), C(opt_out)). A route that hashes by connection gives one draw per new
    connection the weight decided; one that hashes by client one draw per client address
    (its C(clients)). The hits among the draws are binomial at the weight, judged as
    P(zerolayer.fleet.split_verdict#filter) does.
  - At a cohort stage (weight 0) the stage agrees when at least I(min_connections) of the
    cohort's connections reached an engine and the weight sent none direct.
positional: _input, before, weight_pct
options:
  _input:
    description: The routes as read now.
    type: list
    elements: dict
    required: true
  before:
    description: The same routes as read when the stage's weight was confirmed.
    type: list
    elements: dict
    required: true
  weight_pct:
    description: The stage's weight, percent (0-100).
    type: float
    required: true
  cohort_stage:
    description: Whether the stage is a cohort stage.
    type: bool
    default: false
  min_connections:
    description: The least count (of the weight's connections, or of the cohort's) to judge on.
    type: int
    default: 0
  sigmas:
    description: How far out the agreeing range reaches, in normal standard deviations (> 0).
    type: float
    default: 4
  floor_pct:
    description: The least half-width of the agreeing range, percentage points (0-100).
    type: float
    default: 0.5
"""

EXAMPLES = r"""
- name: Judge the stage on this node
  ansible.builtin.set_fact:
    split: "{{ routes_now | zerolayer.fleet.stage_split(routes_then, 5, min_connections=100) }}"
"""

RETURN = r"""
_value:
  description:
    - A dict with C(ok), C(detail) (one line), C(sample) (the count judged on), C(measured_pct),
      C(low_pct), C(high_pct), C(weight_pct), C(connections), C(addresses), C(to_engine)
      (the weight's hits), C(opt_in), C(opt_out), and C(cohort) true at a cohort stage.
  type: dict
"""


def stage_split(
    routes, before, weight_pct, cohort_stage=False, min_connections=0, sigmas=4, floor_pct=0.5
):
    try:
        return judge_stage(
            before, routes, weight_pct, cohort_stage, min_connections, sigmas, floor_pct
        )
    except (FleetError, KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError("stage_split: %s" % getattr(error, "message", error)) from None


class FilterModule:
    def filters(self):
        return {"stage_split": stage_split}
