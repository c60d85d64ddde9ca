# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The one exception type of the collection.

Every failure in plugins/module_utils raises FleetError; a module turns it into
fail_json(msg=..., **details) and nothing else.
"""

from __future__ import annotations


class FleetError(Exception):
    """A failure with a message for people and details for machines."""

    def __init__(self, message, details=None):
        super().__init__(message)
        self.message = message
        self.details = dict(details or {})

    @property
    def errno(self):
        """The kernel's errno when the failure came from a system call, else None."""
        return self.details.get("errno")

    def fail_json_kwargs(self):
        """Arguments for AnsibleModule.fail_json."""
        kwargs = {"msg": self.message}
        kwargs.update(self.details)
        return kwargs
