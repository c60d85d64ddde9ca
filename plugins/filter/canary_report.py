# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""The canary's report at the end of a run, as a filter (a thin shell over module_utils)."""

from __future__ import annotations

import time

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports.canary_report import (
    canary_report as build_report,
)

DOCUMENTATION = r"""
name: canary_report
short_description: The canary's report at the end of a run, with its one-line summary
version_added: 0.1.0
description:
  - Takes the rollout's records (I(_input), wave name to record, as the lookup
    P(zerolayer.fleet.record_copies#lookup) reads the controller's copies) and returns the
    report C(canary.yml) writes to C(report-<rollout_id>.json).
  - C(stopped) is what stopped the run, or C({}); C(waves) each wave's summary in the order the
    run went through them; C(stages) one row per wave and stage (the same rows as
    P(zerolayer.fleet.stage_rows#filter)); C(summary) the line a person reads first, the stop's
    own message or each wave's outcome and weight.
positional: _input, rollout_id, stopped, waves
options:
  _input:
    description: The rollout's records, wave name to record; C({}) when there are none.
    type: dict
    required: true
  rollout_id:
    description: The rollout's id.
    type: str
    required: true
  stopped:
    description: What stopped the run (a dict with its C(message)), or C({}).
    type: dict
    required: true
  waves:
    description: Each wave's summary (M(zerolayer.fleet.rollout_state)'s C(summary)) with its name
      under C(wave).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Show where the rollout stands
  ansible.builtin.debug:
    msg: "{{ (records | zerolayer.fleet.canary_report('chat-2', {}, waves)).summary }}"
"""

RETURN = r"""
_value:
  description: The report, with the keys rollout_id, stopped, waves, stages and summary.
  type: dict
"""


def canary_report(records, rollout_id, stopped, waves):
    try:
        return build_report(rollout_id, stopped, waves, records or {}, time.time())
    except (FleetError, AttributeError, KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError("canary_report: %s" % error) from None


class FilterModule:
    def filters(self):
        return {"canary_report": canary_report}
