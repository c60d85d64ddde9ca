# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""canary_reconcile on the controller runs in the controller's own process, several times a
stage (plugin_utils/in_process_action.py); its work is module_utils/controller/canary_reconcile.py.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.controller.canary_reconcile import (
    ARGUMENT_SPEC,
    REQUIRED_TOGETHER,
    run,
)
from ansible_collections.zerolayer.fleet.plugins.plugin_utils.in_process_action import (
    InProcessAction,
)


class ActionModule(InProcessAction):
    ARGUMENT_SPEC = ARGUMENT_SPEC
    REQUIRED_TOGETHER = REQUIRED_TOGETHER

    def call(self, params, check_mode, diff):
        return run(params, check_mode)
