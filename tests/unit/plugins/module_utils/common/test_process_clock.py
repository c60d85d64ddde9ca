"""When a process started (process_clock.py), read from /proc as the rollback's clock."""

import multiprocessing
import os
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    command_pid,
    process_started_at,
)

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def test_a_new_process_started_between_the_readings_around_its_start():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        after = time.time()
        started = process_started_at(child.pid)
    finally:
        child.kill()
        child.wait()
    # The kernel keeps the start in whole clock ticks, rounded down.
    assert before - 2 * TICK_S <= started <= after + TICK_S, (before, started, after)


def test_this_process_started_before_now():
    assert process_started_at() < time.time()


def test_a_process_that_is_gone_is_a_clear_error():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    with pytest.raises(FleetError) as gone:
        process_started_at(child.pid)
    assert gone.value.details == {"field": "pid", "pid": child.pid}


def _report_command_pid(queue):
    queue.put(command_pid())


def test_in_a_forked_worker_the_command_is_the_parent():
    assert command_pid() == os.getpid()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    worker = context.Process(target=_report_command_pid, args=(queue,))
    worker.start()
    try:
        assert queue.get(timeout=30) == os.getpid()
    finally:
        worker.join(timeout=30)
