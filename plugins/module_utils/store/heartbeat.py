# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The runner's heartbeat: keeps its lease on a rollout scope alive while the runner lives.

A module returns long before a rollout ends, so the lease is kept alive by a small detached
process tied to the runner, the `ansible-playbook` process that called the module. When
the runner dies (kill -9 included) the heartbeat stops, and the lease expires on its own
after its TTL: until then `status` shows the dead runner as the holder, as it should.
"""

from __future__ import annotations

import os
import syslog
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    stat_fields,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import lease_gone


def _stat(pid):
    """(ppid, start time in clock ticks) of pid, or None when it is gone."""
    fields = stat_fields(pid)
    if fields is None:
        return None
    return int(fields[1]), int(fields[19])


def _argv(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            return [part.decode(errors="replace") for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def _is_playbook(pid):
    return any(os.path.basename(arg).startswith("ansible-playbook") for arg in _argv(pid)[:2])


def runner_process(start=None):
    """(pid, start time) of the ansible-playbook process that runs this module.

    The module runs in a worker forked from that process, and a fork keeps its command
    line: the runner is the topmost of the ancestors that read ansible-playbook (a worker
    ends with its task; the runner lives as long as the rollout). Without one (an ad hoc
    command) it is the parent.
    """
    own = start or os.getpid()
    pid, runner = own, None
    while pid > 1:
        stat = _stat(pid)
        if stat is None:
            break
        if pid != own and _is_playbook(pid):
            runner = (pid, stat[1])
        elif runner is not None:
            break
        pid = stat[0]
    if runner is not None:
        return runner
    parent = _stat(own)[0] if _stat(own) else os.getppid()
    stat = _stat(parent)
    return parent, stat[1] if stat else 0


def alive(pid, started):
    stat = _stat(pid)
    return stat is not None and stat[1] == started


# The tag of the heartbeat's lines in the controller's journal (journalctl -t ...).
LOG_TAG = "zerolayer-heartbeat"
# How soon a renewal that failed is tried again: often enough that a store busy for a few
# seconds (a leader change, an fsync stall) costs no lease, seldom enough to add no load.
RETRY_S = 1.0


def beat(client, lease, runner, ttl_s, sleep=time.sleep, clock=time.monotonic):
    """Renew lease every ttl_s / 3 while runner (pid, start time) lives; return why it ended.

    Only the store's own word ends the heartbeat early: the lease is gone (released, expired
    or unknown). A renewal that fails otherwise (the store unreachable, or answering with an
    error under load: a request timed out, a leader changed, a stalled apply) is tried again
    every RETRY_S until ttl_s has passed since the last renewal, when the lease is surely
    gone. Ending at the first such error, as this did, lost a live runner its scope.
    """
    renewed = clock()
    while True:
        if not alive(*runner):
            return "runner %d ended" % runner[0]
        try:
            left = client.keep_alive(lease)
        except FleetError as exc:
            if lease_gone(exc):
                return "lease %d: %s" % (lease, exc.message)
            if clock() - renewed >= ttl_s:
                return "lease %d not renewed for %ss: %s" % (lease, ttl_s, exc.message)
            sleep(min(RETRY_S, ttl_s / 3.0))
            continue
        if left <= 0:
            return "lease %d released or expired" % lease
        renewed = clock()
        sleep(ttl_s / 3.0)


def run_detached(work):
    """Fork work() off, detached from the caller's session and streams; its pid.

    A module's caller waits for the module's streams to close, so the process closes them at
    once; it runs until work returns, whatever becomes of the module.
    """
    read_end, write_end = os.pipe()
    first = os.fork()
    if first:
        os.close(write_end)
        with os.fdopen(read_end) as pipe:
            pid = int(pipe.read() or 0)
        os.waitpid(first, 0)
        return pid
    try:
        os.close(read_end)
        os.setsid()
        second = os.fork()
        if second:
            os.write(write_end, str(second).encode())
            os._exit(0)
        os.close(write_end)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        os.chdir("/")
        work()
    finally:
        os._exit(0)


def start_detached(client, lease, runner, ttl_s):
    """Fork the heartbeat of a lease of ttl_s off, detached from the module's session and
    streams; its pid. Why it ended goes to the controller's journal, tagged LOG_TAG: the
    one trace of a lease lost while its runner lived."""

    def work():
        why = beat(client, lease, runner, ttl_s)
        syslog.openlog(LOG_TAG, syslog.LOG_PID)
        syslog.syslog(syslog.LOG_WARNING if "runner" not in why else syslog.LOG_INFO, why)

    return run_detached(work)
