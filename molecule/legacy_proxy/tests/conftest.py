"""Reach the nodes with `podman exec` rather than through Ansible.

molecule points testinfra at its Ansible inventory; each command then costs a full Ansible
task. The nodes are local podman containers, so the podman backend runs the same commands
in a fraction of the time. Outside molecule the usual --hosts option applies.
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
    if not hosts or any((v or {}).get("ansible_connection") != "podman" for v in hosts.values()):
        return None
    return ["podman://" + name for name in sorted(hosts)]


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc):
    # Only when no host was named on the command line: molecule names none.
    if metafunc.config.option.hosts is None:
        podman_hosts = _podman_hosts()
        if podman_hosts is not None:
            metafunc.module.testinfra_hosts = podman_hosts
