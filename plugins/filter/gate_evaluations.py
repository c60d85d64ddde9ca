# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""How many evaluations a hold may take, as a filter (a thin shell over module_utils)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.gates import (
    most_evaluations,
)

DOCUMENTATION = r"""
name: gate_evaluations
short_description: How many evaluations a hold's loop of M(zerolayer.fleet.canary_gate) may take
version_added: 0.1.0
description:
  - Takes the hold in seconds (I(_input)) and returns the bound of the C(until) loop that
    evaluates the gates every I(interval) seconds - the hold's own evaluations, two for each
    inconclusive one I(max_holds) allows, every failure below I(failure_limit), and ten to
    spare. A pause or a rollback ends the loop long before.
positional: _input, interval, max_holds, failure_limit
options:
  _input:
    description: The hold, in seconds.
    type: int
    required: true
  interval:
    description: Seconds between two evaluations (at least 1).
    type: int
    required: true
  max_holds:
    description: The inconclusive evaluations allowed before the gates pause the stage.
    type: int
    required: true
  failure_limit:
    description: The failed evaluations allowed before the gates roll the stage back.
    type: int
    required: true
"""

EXAMPLES = r"""
- name: Evaluate the gates every minute until the hold is over
  zerolayer.fleet.canary_gate:
    prometheus_url: http://prometheus:9090
    gates: "{{ canary_gates }}"
    state_file: /var/lib/zerolayer/gates.json
    hold: 1800
  register: gate
  until: gate is failed or gate.decision != 'continue'
  retries: "{{ 1800 | zerolayer.fleet.gate_evaluations(60, 60, 5) }}"
  delay: 60
"""

RETURN = r"""
_value:
  description: The number of evaluations.
  type: int
"""


def _whole(value, field):
    try:
        return int(value)
    except (TypeError, ValueError):
        raise AnsibleFilterError(
            "gate_evaluations: %s must be a whole number; got %r" % (field, value)
        ) from None


def gate_evaluations(hold_s, interval, max_holds, failure_limit):
    try:
        return most_evaluations(
            _whole(hold_s, "hold"),
            _whole(interval, "interval"),
            _whole(max_holds, "max_holds"),
            _whole(failure_limit, "failure_limit"),
        )
    except FleetError as error:
        raise AnsibleFilterError("gate_evaluations: %s" % error) from None


class FilterModule:
    def filters(self):
        return {"gate_evaluations": gate_evaluations}
