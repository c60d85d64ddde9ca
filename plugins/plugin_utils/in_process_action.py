# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""An action that runs its module's work in the controller's own process.

A module delegated to localhost waits for a Python process to start and import its payload
(0.2-0.4 s of a loaded 2-core controller, profile_tasks). The canary's reconcile runs several
times a stage and a rollback's first step is raising the fence: both run where the task runs
on the controller (a local connection without become, which `delegate_to: localhost` gives)
with the module's own argument spec and the same core in module_utils; anywhere else the
module runs on its host as usual.
"""

from __future__ import annotations

from typing import ClassVar

from ansible.plugins.action import ActionBase
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    as_fleet_error,
)


class InProcessAction(ActionBase):
    """Subclasses give ARGUMENT_SPEC, REQUIRED_IF, REQUIRED_TOGETHER and call(params,
    check_mode, diff), which returns the module's result."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False
    ARGUMENT_SPEC: ClassVar[dict] = {}
    REQUIRED_IF: ClassVar[tuple] = ()
    REQUIRED_TOGETHER: ClassVar[tuple] = ()

    def call(self, params, check_mode, diff):
        raise NotImplementedError

    def runs_on_controller(self):
        return self._connection.transport == "local" and not self._play_context.become

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        del tmp  # no longer has any effect
        if not self.runs_on_controller():
            result.update(self._execute_module(task_vars=task_vars))
            return result
        # A bad argument fails here as the module would fail it, naming the argument.
        _validation, params = self.validate_argument_spec(
            argument_spec=self.ARGUMENT_SPEC,
            required_if=self.REQUIRED_IF,
            required_together=self.REQUIRED_TOGETHER,
        )
        try:
            result.update(self.call(params, self._task.check_mode, self._task.diff))
        except MODULE_FAILURES as exc:
            result.update(failed=True, **as_fleet_error(exc).fail_json_kwargs())
        return result
