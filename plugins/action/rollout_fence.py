# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""rollout_fence on the controller runs in the controller's own process.

A rollback's first step is raising the fence; as a module it waits for a Python process to
start, which is most of what raising the fence costs. The same core
(module_utils/rollout/rollout_fence_core.py) runs here, with the module's argument spec,
where the task runs on the controller (plugin_utils/in_process_action.py).
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC,
    REQUIRED_IF,
    fence_call,
)
from ansible_collections.zerolayer.fleet.plugins.plugin_utils.in_process_action import (
    InProcessAction,
)


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    REQUIRED_IF = REQUIRED_IF

    def call(self, params, check_mode, diff):
        return fence_call(params, check_mode, diff)
