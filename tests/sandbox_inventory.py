"""Inventories for named sandbox fleets (scripts/sandbox, ZEROLAYER_SANDBOX_FLEET)."""

import shutil
from pathlib import Path

SANDBOX_INVENTORY = Path(__file__).resolve().parent.parent / "inventories" / "sandbox"


def named_fleet_inventory(name, directory, source=SANDBOX_INVENTORY):
    """A copy of the sandbox inventory that finds fleet `name` by its nodes' label and shares
    the group_vars (which depend on nothing but the nodes' labels); returns its path."""
    source = Path(source)
    directory.mkdir(parents=True, exist_ok=True)
    plugin = (source / "10-fleet.podman_containers.yml").read_text()
    selector = "zerolayer.sandbox: fleet\n"
    assert plugin.count(selector) == 1, "inventories/sandbox no longer selects its fleet by label"
    (directory / "10-fleet.podman_containers.yml").write_text(
        plugin.replace(selector, "zerolayer.sandbox: %s\n" % name)
    )
    shutil.copy(source / "20-addresses.constructed.yml", directory)
    (directory / "group_vars").symlink_to(source / "group_vars", target_is_directory=True)
    return directory
