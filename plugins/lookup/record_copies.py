# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The controller's copies of a rollout's wave records (a thin shell over module_utils)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: record_copies
short_description: The controller's copies of a rollout's wave records, wave name to record
version_added: 0.1.0
description:
  - Reads every C(<wave>.json) in the directory given as the term (C(canary_record_dir/<rollout
    id>), where M(zerolayer.fleet.rollout_state) keeps its copy of each wave's record) and
    returns one dict, wave name to record; C({}) when the directory is not there.
  - For reports only. With a rollout store, the store holds the records every actor reads.
options:
  _terms:
    description: The directory of the rollout's copies.
    required: true
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
"""

EXAMPLES = r"""
- name: Count the waves recorded
  ansible.builtin.debug:
    msg: "{{ lookup('zerolayer.fleet.record_copies', '/var/lib/zerolayer/chat-2') | length }}"
"""

RETURN = r"""
_raw:
  description: One dict, wave name to record.
  type: list
  elements: dict
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    mirror_copies,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if len(terms) != 1 or not isinstance(terms[0], str) or not terms[0]:
            raise AnsibleLookupError(
                "record_copies takes one term, the directory of the copies; got %r" % (terms,)
            )
        try:
            return [mirror_copies(terms[0])]
        except FleetError as exc:
            raise AnsibleLookupError(exc.message) from None
