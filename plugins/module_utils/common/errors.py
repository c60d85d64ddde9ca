# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The one exception hierarchy of the collection, and how a module reports any failure.

Every failure in plugins/module_utils raises FleetError or a subclass of it (UsageError
here, for the commands' bad options; the store's, the fence's and others beside the code
that raises them); a module turns it into fail_json(msg=..., **details) and nothing else.
A system call or a read of bad data that module_utils did not foresee still raises
OSError, KeyError, ValueError or struct.error: a module's main() catches MODULE_FAILURES
and hands the error to fail_module(), so such a failure reaches people as one message
naming the errno and the path, not as a Python traceback.
"""

from __future__ import annotations

import errno as errno_codes
import os
import struct


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


class UsageError(FleetError):
    """Bad command-line input: the commands (zerolayer-routectl, zerolayer) exit with their
    bad-input status (2) on it; field names the option at fault when it is known."""

    def __init__(self, message, field=None):
        super().__init__(message, {"field": field})

    @property
    def field(self):
        return self.details["field"]


# Raised by the standard library on a failed system call (OSError) or by decoding data
# that is not what the code expects (a pinned map or a file of another layout).
UNEXPECTED_FAILURES = (OSError, KeyError, ValueError, struct.error)
MODULE_FAILURES = (FleetError, *UNEXPECTED_FAILURES)


def _os_error_details(error):
    details = {"error_type": type(error).__name__}
    if error.errno is not None:
        details["errno"] = error.errno
        details["errno_name"] = errno_codes.errorcode.get(error.errno, str(error.errno))
    if error.filename is not None:
        details["path"] = os.fsdecode(error.filename)
    if error.filename2 is not None:
        details["path2"] = os.fsdecode(error.filename2)
    return details


def _os_error_message(error, details):
    reason = error.strerror or str(error) or type(error).__name__
    if "errno_name" in details:
        reason = "%s (%s)" % (reason, details["errno_name"])
    paths = [details[key] for key in ("path", "path2") if key in details]
    where = " on %s" % " and ".join(paths) if paths else ""
    return "system call failed%s: %s" % (where, reason)


def as_fleet_error(error):
    """The FleetError that stands for any of MODULE_FAILURES (itself when it is one)."""
    if isinstance(error, FleetError):
        return error
    if isinstance(error, OSError):
        details = _os_error_details(error)
        return FleetError(_os_error_message(error, details), details)
    if isinstance(error, KeyError):
        # str(KeyError) is only the repr of the key: say what it means.
        reason = "missing key %r" % (error.args[0],) if error.args else "missing key"
    else:
        reason = str(error) or "no detail"
    # struct.error is called just "error": name its module too.
    kind = "struct.error" if isinstance(error, struct.error) else type(error).__name__
    return FleetError("unexpected data (%s): %s" % (kind, reason), {"error_type": kind})


def fail_module(module, error):
    """Fail an AnsibleModule with the message and details of any of MODULE_FAILURES."""
    module.fail_json(**as_fleet_error(error).fail_json_kwargs())
