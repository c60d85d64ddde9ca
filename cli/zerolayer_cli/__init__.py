# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""`zerolayer` for a machine that installed the zerolayer.fleet collection.

The command's code is the collection's (plugins/module_utils/controller/rollout_cli.py), so that the
command and the playbooks never disagree: this entry point only puts the collections paths
Ansible uses (ansible.cfg's collections_path, $ANSIBLE_COLLECTIONS_PATH, else
~/.ansible/collections and /usr/share/ansible/collections) in front of Python's path, in
Ansible's order, and runs it.
"""

from __future__ import annotations

import sys

MODULE = "ansible_collections.zerolayer.fleet.plugins.module_utils.controller.rollout_cli"


def main(argv=None):
    try:
        from ansible import constants
    except ImportError:
        sys.stderr.write(
            "zerolayer: ansible-core is not installed for %s; pip install ansible-core\n"
            % sys.executable
        )
        return 2
    paths = [path for path in constants.COLLECTIONS_PATHS if path not in sys.path]
    sys.path[0:0] = paths
    try:
        from importlib import import_module

        rollout_cli = import_module(MODULE)
    except ImportError as exc:
        sys.stderr.write(
            "zerolayer: the zerolayer.fleet collection is not installed in %s (%s); install "
            "it with ansible-galaxy collection install, or set ANSIBLE_COLLECTIONS_PATH\n"
            % (":".join(constants.COLLECTIONS_PATHS), exc)
        )
        return 2
    return rollout_cli.main(argv)
