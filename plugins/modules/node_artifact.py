#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: node_artifact
short_description: Install the collection's node-side commands as one versioned zip application
description:
  - Builds, on the controller, the node artifact - C(zerolayer-node-VERSION.pyz), one zip
    application (Python's zipapp format, standard library only) with the collection code that
    C(zerolayer-routectl) (and its fence watcher), C(zerolayer-register-engine), the route exporter
    and the store exporter run - and installs it on the host in O(dest_dir).
  - The version is the collection's version and a digest of what the archive holds, so two hosts
    that report the same version run the same code. The same sources always build the same bytes.
  - The archive is copied only when the host lacks that version (compared by checksum), written
    beside its final name and renamed into place; C(zerolayer-node.pyz) in O(dest_dir) then points
    at it, and each of O(commands) in O(commands_dir) is a link to C(zerolayer-node.pyz). Every
    switch of a link is one rename, so a command is never missing.
  - The version the link pointed to before stays (a process started from it reads it until its
    restart); older versions and the paths in O(remove) (what earlier releases copied file by file)
    are removed.
  - C(COMMAND --version) prints the version on the host, and both exporters export it as
    C(zerolayer_node_artifact_info), so a fleet that runs two versions is visible.
  - This is an action - the archive is built on the controller, in O(build_dir).
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  dest_dir:
    description: Host directory for the versioned archives and the link C(zerolayer-node.pyz).
    type: path
    required: true
  commands_dir:
    description: Directory on the host for the command links.
    type: path
    required: true
  commands:
    description: The commands to link to the artifact on this host.
    type: list
    elements: str
    choices:
      - zerolayer-routectl
      - zerolayer-register-engine
      - zerolayer-route-exporter
      - zerolayer-store-exporter
    required: true
  remove:
    description: Paths on the host to remove once the artifact is installed (files or directories).
    type: list
    elements: path
    default: []
  build_dir:
    description:
      - Directory on the controller where the artifact is built, one file per version.
      - Defaults to C(zerolayer/node-artifact) under C($XDG_CACHE_HOME), else C(~/.cache).
    type: path
  artifact:
    description:
      - What the action built and copied to the host - C(name), C(version), C(sha256) and C(source),
        the copy's path on the host (absent when the host has that version already).
      - Set by the action on the controller; a task that sets it is refused.
    type: dict
    suboptions:
      name:
        description: The archive's file name.
        type: str
        required: true
      version:
        description: Its version.
        type: str
        required: true
      sha256:
        description: Its checksum; a copy that does not match is refused and changes nothing.
        type: str
        required: true
      source:
        description: The copy on the host.
        type: path
attributes:
  check_mode:
    support: full
    description: The archive is built on the controller; nothing is copied or changed on the host.
  diff_mode:
    support: full
    description: The version before and after.
seealso:
  - module: zerolayer.fleet.router
"""

EXAMPLES = r"""
- name: Install the node commands
  zerolayer.fleet.node_artifact:
    dest_dir: /usr/local/lib/zerolayer
    commands_dir: /usr/local/sbin
    commands: [zerolayer-routectl, zerolayer-register-engine, zerolayer-route-exporter]
    remove: [/usr/local/lib/zerolayer/ansible_collections]
  register: node_artifact

- name: Show the version the host runs now
  ansible.builtin.debug:
    msg: "{{ inventory_hostname }} runs {{ node_artifact.version }}"
"""

RETURN = r"""
version:
  description: The version installed - the collection's version, C(+), a digest of the content.
  returned: always
  type: str
  sample: 0.1.0+3f2a9c0d41b7
sha256:
  description: The archive's checksum.
  returned: always
  type: str
  sample: 4b8c5d0e1f7a0c6d2e9b3a8f5c1d7e2a9b0c4d6e8f1a3b5c7d9e0f2a4b6c8d0e
path:
  description: The archive on the host.
  returned: always
  type: str
  sample: /usr/local/lib/zerolayer/zerolayer-node-0.1.0+3f2a9c0d41b7.pyz
previous:
  description: The archive the link pointed to before, or null.
  returned: always
  type: str
  sample: zerolayer-node-0.1.0+0a1b2c3d4e5f.pyz
removed:
  description: Stale archives and paths of O(remove) removed (in check mode, that would be).
  returned: always
  type: list
  elements: str
  sample: [/usr/local/lib/zerolayer/ansible_collections]
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_artifact import (
    COMMANDS,
    install,
    install_plan,
)


def argument_spec():
    """The options a task writes, and artifact, which the action adds."""
    return dict(
        dest_dir=dict(type="path", required=True),
        commands_dir=dict(type="path", required=True),
        commands=dict(type="list", elements="str", required=True, choices=sorted(COMMANDS)),
        remove=dict(type="list", elements="path", default=[]),
        build_dir=dict(type="path"),
        artifact=dict(
            type="dict",
            options=dict(
                name=dict(type="str", required=True),
                version=dict(type="str", required=True),
                sha256=dict(type="str", required=True),
                source=dict(type="path"),
            ),
        ),
    )


def main():
    module = AnsibleModule(argument_spec=argument_spec(), supports_check_mode=True)
    params = module.params
    artifact = params["artifact"]
    if not artifact:
        module.fail_json(
            msg="artifact: the node_artifact action builds and copies the archive on the "
            "controller; this module runs only behind it",
            field="artifact",
        )
    try:
        arguments = (
            params["dest_dir"],
            params["commands_dir"],
            params["commands"],
            artifact["name"],
            artifact["sha256"],
            params["remove"],
        )
        if module.check_mode:
            plan = install_plan(*arguments)
        else:
            plan = install(artifact["source"], *arguments)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    removed = [os.path.join(params["dest_dir"], n) for n in plan["stale"]] + plan["remove"]
    changed = bool(plan["copy"] or plan["link"] or plan["commands"] or removed)
    result = dict(
        changed=changed,
        version=artifact["version"],
        sha256=artifact["sha256"],
        path=os.path.join(params["dest_dir"], artifact["name"]),
        previous=plan["previous"],
        removed=removed,
    )
    if module._diff:
        result["diff"] = dict(
            before="node artifact: %s\n" % plan["previous"],
            after="node artifact: %s\n" % artifact["name"],
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
