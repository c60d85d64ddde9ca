# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""rollout_fence on the controller runs in the controller's own process.

A rollback's first step is raising the fence; as a module it waits for a Python process to
start and import its payload (0.2-0.4 s of a loaded 2-core controller, profile_tasks), which
is most of what raising the fence costs. Where the task runs on the controller (a local
connection without become, which is what `delegate_to: localhost` gives), the same core
(module_utils/rollout/rollout_fence_core.py) runs here, with the module's argument spec; anywhere
else the module runs on its host as usual.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    as_fleet_error,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC,
    REQUIRED_IF,
    fence_call,
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _supports_check_mode = True
    _supports_async = False

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
            argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF
        )
        try:
            result.update(fence_call(params, self._task.check_mode, self._task.diff))
        except MODULE_FAILURES as exc:
            result.update(failed=True, **as_fleet_error(exc).fail_json_kwargs())
        return result
