# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""node_artifact: build the node artifact on the controller, copy it when the host lacks
that version, and let the module install it there (module_utils/node/node_artifact.py)."""

from __future__ import annotations

import os

from ansible.plugins.action import ActionBase
from ansible.utils.hashing import checksum
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    as_fleet_error,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_artifact import build

# plugins/action/node_artifact.py -> the collection's root.
COLLECTION_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def default_build_dir():
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "zerolayer", "node-artifact")


class ActionModule(ActionBase):
    TRANSFERS_FILES = True
    _supports_check_mode = True
    _supports_async = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # no longer has any effect
        args = dict(self._task.args)
        if "artifact" in args:
            result.update(
                failed=True,
                msg="artifact is set by the node_artifact action on the controller, not by a "
                "task; remove it",
                field="artifact",
            )
            return result
        try:
            built = build(COLLECTION_ROOT, args.get("build_dir") or default_build_dir())
        except MODULE_FAILURES as exc:
            result.update(failed=True, **as_fleet_error(exc).fail_json_kwargs())
            return result
        artifact = {"name": built["name"], "version": built["version"], "sha256": built["sha256"]}
        try:
            if not self._task.check_mode and self._host_lacks(args, built, task_vars):
                remote = self._connection._shell.join_path(
                    self._connection._shell.tmpdir, built["name"]
                )
                self._transfer_file(built["path"], remote)
                self._fixup_perms2((self._connection._shell.tmpdir, remote))
                artifact["source"] = remote
            args["artifact"] = artifact
            result.update(
                self._execute_module(
                    module_name="zerolayer.fleet.node_artifact",
                    module_args=args,
                    task_vars=task_vars,
                )
            )
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        return result

    def _host_lacks(self, args, built, task_vars):
        """Whether the host has no archive of this version with this content."""
        dest_dir = args.get("dest_dir")
        if not dest_dir:
            return True  # the module names the missing option
        path = self._connection._shell.join_path(dest_dir, built["name"])
        found = self._execute_remote_stat(path, all_vars=task_vars, follow=False, checksum=True)
        # stat's checksum is a SHA-1, as Ansible's copy compares files.
        return not found.get("exists") or found.get("checksum") != checksum(built["path"])
