"""Reach the nodes with `podman exec` rather than through Ansible.

molecule points testinfra at its Ansible inventory, which reaches the nodes over SSH; every
molecule instance is a local podman container, so the podman backend runs the same
commands without a connection to set up. Outside molecule the usual --hosts option applies.
"""

import os

import pytest
import yaml


def _podman_hosts():
    inventory = os.environ.get("MOLECULE_INVENTORY_FILE")
    if not inventory or not os.path.exists(inventory):
        return None
    with open(inventory, encoding="utf-8") as handle:
        hosts = (yaml.safe_load(handle) or {}).get("all", {}).get("hosts", {}) or {}
    if not hosts:
        return None
    return ["podman://" + name for name in sorted(hosts)]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    # Only when no host was named on the command line: molecule names none.
    if metafunc.config.option.hosts is None:
        podman_hosts = _podman_hosts()
        if podman_hosts is not None:
            metafunc.module.testinfra_hosts = podman_hosts
