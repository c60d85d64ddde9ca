# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""A rollout's report rows, per wave and stage, as a filter (a thin shell over module_utils)."""

from __future__ import annotations

import time

from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.stage_table import (
    render_table,
    rollout_rows,
)

DOCUMENTATION = r"""
name: stage_rows
short_description: A rollout's rows per wave and stage, from its records
version_added: 0.3.0
description:
  - One row per stage each wave ran, in the order the waves were planned, with the stage's
    weight, its measured split and agreeing range (as the record kept them), its gate verdicts,
    the time spent in it (paused included and named) and how it ended.
  - The same rows as C(zerolayer rollout report) and the progress callback's final table.
positional: _input
options:
  _input:
    description: The rollout's records, wave name to record (M(zerolayer.fleet.rollout_state)).
    type: dict
    required: true
  text:
    description: Return the table as text instead of the rows.
    type: bool
    default: false
"""

EXAMPLES = r"""
- name: Write the rollout's report
  ansible.builtin.copy:
    content: "{{ {'stages': records | zerolayer.fleet.stage_rows} | to_nice_json }}"
    dest: /var/tmp/report.json
    mode: "0644"
"""

RETURN = r"""
_value:
  description:
    - Without O(text), one dict per row (wave, stage, weight, split, verdicts, seconds, end);
      with it, the table as text.
  type: raw
"""


def stage_rows(records, text=False):
    try:
        rows = rollout_rows(records, time.time())
    except (FleetError, KeyError, TypeError, ValueError) as error:
        raise AnsibleFilterError("stage_rows: not a dict of rollout records: %s" % error) from None
    return render_table(rows) if text else rows


class FilterModule:
    def filters(self):
        return {"stage_rows": stage_rows}
