"""Waiting in tests for something another process does, with a deadline that fails the test."""

import time


def wait_until(check, what, seconds=20, interval=0.05):
    """check()'s first truthy value; fails the test, naming what, after seconds."""
    deadline = time.monotonic() + seconds
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "waited %d s for %s" % (seconds, what)
        time.sleep(interval)
