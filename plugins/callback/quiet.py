# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
name: quiet
type: stdout
short_description: Ansible's default output, without the lines of what went as expected
description:
  - The output of C(ansible.builtin.default), made for long rollouts. At the default verbosity it
    shows what changed, what failed or could not be reached, and what the playbooks print
    (M(ansible.builtin.debug) messages and the play recap); it hides ok and skipped results, the
    banners of tasks that showed nothing, and the lines of included files.
  - A retry of M(zerolayer.fleet.canary_gate), one gate evaluation of a hold, prints nothing, as
    the C(zerolayer.fleet.zerolayer_progress) callback prints one line per evaluation. Any other
    retry prints a C(waiting) line with its attempt instead of C(FAILED - RETRYING), because a
    retry is a loop waiting for its condition, not a failure.
  - With C(-v) or more, the output is exactly C(ansible.builtin.default)'s, every line included.
version_added: 0.3.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
extends_documentation_fragment:
  - default_callback
  - result_format_callback
requirements:
  - Set as the stdout callback, for example C(stdout_callback = zerolayer.fleet.quiet) in
    C(ansible.cfg) or C(ANSIBLE_STDOUT_CALLBACK=zerolayer.fleet.quiet).
"""

EXAMPLES = r"""
# ansible.cfg
# [defaults]
# stdout_callback = zerolayer.fleet.quiet
# callbacks_enabled = zerolayer.fleet.zerolayer_progress
"""

# ansible-doc reads DOCUMENTATION and EXAMPLES before any import.
from ansible import constants as C  # noqa: E402
from ansible.plugins.callback.default import CallbackModule as DefaultCallback  # noqa: E402

# Modules whose ok results are what the playbook means to print.
PRINTING_MODULES = ("debug",)
# Modules whose retries are progress that another callback prints as one line each.
SILENT_RETRIES = ("canary_gate",)


def short_action(task):
    action = getattr(task, "resolved_action", None) or task.action or ""
    return action.rsplit(".", 1)[-1]


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "zerolayer.fleet.quiet"

    def set_options(self, task_keys=None, var_options=None, direct=None):
        super().set_options(task_keys=task_keys, var_options=var_options, direct=direct)
        self._quiet = self._display.verbosity == 0
        if self._quiet:
            # The default callback then prints a task's banner only with its first shown result.
            self.set_option("display_ok_hosts", False)
            self.set_option("display_skipped_hosts", False)

    def v2_runner_on_ok(self, result):
        if self._quiet and short_action(result._task) in PRINTING_MODULES:
            self.set_option("display_ok_hosts", True)
            try:
                super().v2_runner_on_ok(result)
            finally:
                self.set_option("display_ok_hosts", False)
            return
        super().v2_runner_on_ok(result)

    def v2_runner_retry(self, result):
        if not self._quiet:
            super().v2_runner_retry(result)
            return
        if short_action(result._task) in SILENT_RETRIES:
            return
        if self._last_task_banner != result._task._uuid:
            self._print_task_banner(result._task)
        attempts = result._result.get("attempts", 0)
        retries = result._result.get("retries", 0)
        self._display.display(
            "waiting: [%s]: %s (attempt %d of %d)"
            % (self.host_label(result), result.task_name or result._task, attempts, retries),
            color=C.COLOR_DEBUG,
        )

    def v2_playbook_on_include(self, included_file):
        if not self._quiet:
            super().v2_playbook_on_include(included_file)
