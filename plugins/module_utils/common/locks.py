# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Exclusive file locks taken within a bound: the fence file's and the router's writer lock."""

from __future__ import annotations

import fcntl
import time


def flock_within(fd, timeout, poll_s):
    """Take an exclusive flock on fd, trying for at most timeout seconds; whether it got it.

    Polled rather than blocking, so that no caller ever waits longer than it said.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
