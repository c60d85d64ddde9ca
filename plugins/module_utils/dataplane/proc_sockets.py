# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The TCP sockets a process holds, read from /proc: the one parser of /proc/<pid>/net/tcp
rows and of a process's socket fds, for registering an engine's listener
(engine_sockets), for counting the connections a draining engine still serves
(engine_idle) and the direct-path ones a rollback sends away (direct_drain); and the one
way to run such a read, or a connection, inside the network namespace the router steers."""

from __future__ import annotations

import ctypes
import os
import re
import threading

TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"
SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")
CLONE_NEWNET = 0x40000000
SELF_NETNS = "/proc/self/ns/net"


def in_netns(netns_path, work):
    """work() run inside the network namespace netns_path, and its answer.

    This process's own netns (the usual case) runs it here; another one (a node that runs
    its services in a netns of their own) is entered by one short-lived thread, as setns(2)
    moves only the calling thread, a socket keeps the netns it was made in, and
    /proc/thread-self/net shows the thread's.
    """
    if not netns_path or os.stat(netns_path).st_ino == os.stat(SELF_NETNS).st_ino:
        return work()
    outcome = {}

    def enter_and_work():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            with open(netns_path) as netns:
                if libc.setns(netns.fileno(), CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns %s" % netns_path)
            outcome["answer"] = work()
        except Exception as exc:  # raised again in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=enter_and_work, name="netns-work")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["answer"]


def tcp_rows(text):
    """(local port, state, inode) of each socket row of a /proc net/tcp or net/tcp6 text."""
    rows = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        rows.append((int(fields[1].rsplit(":", 1)[1], 16), fields[3], int(fields[9])))
    return rows


def socket_fds(pid, proc="/proc"):
    """{socket inode: fd number} of what pid holds open; {} when pid is gone. A fd closed
    while it is read is passed over."""
    fd_dir = os.path.join(proc, str(pid), "fd")
    try:
        names = os.listdir(fd_dir)
    except (FileNotFoundError, ProcessLookupError):
        return {}
    found = {}
    for name in names:
        try:
            match = SOCKET_LINK.match(os.readlink(os.path.join(fd_dir, name)))
        except OSError:
            continue
        if match:
            found[int(match.group(1))] = int(name)
    return found
