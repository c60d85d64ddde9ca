# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""When a process started, in Unix time: what an operator's wait is measured from.

A rollback's time runs from the command's start, not from its first task: Python's start,
the collection's imports, inventory and playbook parsing are all part of what the person
who typed the command waits for.
"""

from __future__ import annotations

import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def stat_fields(pid, thread=None):
    """The fields of /proc/PID/stat (a thread's: /proc/PID/task/TID/stat) after the command
    name, as strings: [0] is field 3 of stat(5) (the state), [1] the parent, [2] the process
    group, [19] the start time. None when the process (or thread) is gone.

    The command name (field 2) may hold spaces and parentheses: the split is after its last
    closing parenthesis."""
    path = "/proc/%d/stat" % pid if thread is None else "/proc/%d/task/%s/stat" % (pid, thread)
    try:
        with open(path) as handle:
            return handle.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def process_started_at(pid=None):
    """The Unix time process pid (default: this one) started, to the kernel's clock tick.

    /proc/PID/stat holds the start as clock ticks after boot (CLOCK_BOOTTIME, which counts
    suspend too); it is turned into Unix time with one reading of both clocks, which is
    finer than /proc/stat's btime (whole seconds).
    """
    pid = os.getpid() if pid is None else pid
    fields = stat_fields(pid)
    if fields is None:
        raise FleetError(
            "the start time of process %d cannot be read: no such process" % pid,
            {"field": "pid", "pid": pid},
        )
    start_ticks = int(fields[19])  # field 22 of stat(5); fields[0] is field 3
    since_boot = start_ticks / os.sysconf("SC_CLK_TCK")
    now, boot_clock = time.time(), time.clock_gettime(time.CLOCK_BOOTTIME)
    return now - (boot_clock - since_boot)


def command_pid():
    """The command's own process: the parent when run in a multiprocessing worker.

    Ansible runs each task (and the lookups in it) in a worker forked from the main
    ansible-playbook process; that one started when the command did.
    """
    import multiprocessing

    parent = multiprocessing.parent_process()
    return parent.pid if parent is not None and parent.pid else os.getpid()
