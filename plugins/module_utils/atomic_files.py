# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Files replaced whole: a reader sees the old file or the new one, never a torn write.

Plain standard library, so that every layer can use it: the rollout records (rollout.py)
and the node's direct-drain marker (direct_drain.py).
"""

from __future__ import annotations

import os
import tempfile

from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError


def write_text_atomic(path, text, mode=0o644):
    """Write through a temporary file in the same directory, then rename over the path.

    A reader sees the old file or the new one, never a torn write, even if the
    writer dies half way.
    """
    directory = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(directory, exist_ok=True)
        handle, temporary = tempfile.mkstemp(prefix=".%s." % os.path.basename(path), dir=directory)
    except OSError as error:
        raise FleetError(
            "cannot write in %s: %s" % (directory, error.strerror), {"path": path}
        ) from None
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except OSError as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise FleetError("cannot write %s: %s" % (path, error.strerror), {"path": path}) from None
