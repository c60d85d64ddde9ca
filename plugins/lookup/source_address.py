# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The controller's own source address toward hosts, as CIDRs (a thin shell over module_utils)."""

from __future__ import annotations

DOCUMENTATION = r"""
name: source_address
short_description: The address the controller's connections to some hosts come from
version_added: 0.3.0
description:
  - For each host (a name or an address), the local address the controller's kernel picks for
    a connection to it (its route and source selection), found with a connected UDP socket,
    which sends no packet.
  - Returns the distinct addresses as host networks (C(/32) or C(/128)), sorted, ready for a
    cohort (C(always_direct)). Behind NAT the hosts see another address; name that one instead.
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
"""

EXAMPLES = r"""
- name: Make the controller's own load the cohort of a cohort stage
  ansible.builtin.set_fact:
    cohort: "{{ query('zerolayer.fleet.source_address', *groups['gpu_nodes']) }}"
"""

RETURN = r"""
_raw:
  description: Host networks (C(192.0.2.1/32), C(2001:db8::1/128)), one per distinct address.
  type: list
  elements: str
"""

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller.source_addresses import (
    source_cidrs,
)


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        if not terms:
            raise AnsibleLookupError("source_address needs at least one host")
        try:
            return source_cidrs(terms)
        except FleetError as exc:
            raise AnsibleLookupError(exc.message) from None
