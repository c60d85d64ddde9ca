# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The Unix time the running ansible-playbook command started (a thin shell over module_utils)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: command_started_at
short_description: When the running ansible-playbook command started, in Unix time
version_added: 0.2.0
description:
  - The start of the controller's ansible-playbook process, read from C(/proc) (Linux
    controllers), to the kernel's clock tick (10 ms on most systems).
  - The rollback playbook measures its time from here, so the figure compared with the budget
    includes the interpreter's start, inventory and playbook parsing, not only the tasks.
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
"""

EXAMPLES = r"""
- name: Note when the command started
  ansible.builtin.set_fact:
    started_at: "{{ lookup('zerolayer.fleet.command_started_at') }}"
"""

RETURN = r"""
_raw:
  description: One float, the Unix time the command started.
  type: list
  elements: float
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    command_pid,
    process_started_at,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if terms:
            raise AnsibleLookupError("command_started_at takes no terms; got %r" % (terms,))
        try:
            return [round(process_started_at(command_pid()), 3)]
        except FleetError as exc:
            raise AnsibleLookupError(exc.message) from None
