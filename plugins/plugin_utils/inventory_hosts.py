# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The hosts of an inventory, read in the calling process by ansible-core's own inventory
code: the plugins, groups and patterns a playbook would see, without starting
`ansible-inventory` (about 0.4 s more of an operator's wait). Controller code: the
operator's command (`zerolayer rollback`, `zerolayer rollout abort -i`) imports it only
when it names nodes.
"""

from __future__ import annotations

from ansible import constants
from ansible.inventory.manager import InventoryManager
from ansible.parsing.dataloader import DataLoader
from ansible.plugins.loader import init_plugin_loader
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def inventory_nodes(inventories, pattern):
    """The inventory's hosts matching pattern, in ansible-core's order (the configured
    inventory when none is given). FleetError naming --hosts when none matches, so that a
    caller refuses before it changes anything."""
    init_plugin_loader(constants.COLLECTIONS_PATHS)
    sources = list(inventories) or constants.DEFAULT_HOST_LIST
    manager = InventoryManager(loader=DataLoader(), sources=sources)
    nodes = [host.name for host in manager.get_hosts(pattern)]
    if not nodes:
        raise FleetError(
            "--hosts %r matches no node of the inventory %s; nothing was changed"
            % (pattern, " ".join(sources) if isinstance(sources, list) else sources),
            {"field": "hosts", "outcome": "bad_input"},
        )
    return nodes
