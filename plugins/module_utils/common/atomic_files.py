# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Files replaced whole: a reader sees the old file or the new one, never a torn write.

Plain standard library, so that every layer can use it: the rollout records (rollout.py),
the node's direct-drain marker (dataplane/direct_drain.py) and the node artifact (node_artifact.py).
"""

from __future__ import annotations

import os
import tempfile

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def write_atomic(path, write, mode=0o644):
    """Write through a temporary file in the same directory, then rename over the path:
    write(stream) fills a binary stream, which is synced before the rename, and the
    directory after it.

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
        with os.fdopen(handle, "wb") as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.chmod(temporary, mode)
        os.replace(temporary, path)
        # The rename is in the directory: synced too, so that after a crash the path holds
        # the new file, not the old one or none.
        directory_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)
    except BaseException as error:
        if os.path.exists(temporary):
            os.unlink(temporary)
        if isinstance(error, OSError):
            raise FleetError(
                "cannot write %s: %s" % (path, error.strerror), {"path": path}
            ) from None
        raise


def write_text_atomic(path, text, mode=0o644):
    """write_atomic of a text, in UTF-8."""
    write_atomic(path, lambda stream: stream.write(text.encode("utf-8")), mode)
