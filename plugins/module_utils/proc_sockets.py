# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The TCP sockets a process holds, read from /proc: the one parser of /proc/<pid>/net/tcp
rows and of a process's socket fds, for registering an engine's listener
(engine_sockets) and for counting the connections a draining engine still serves
(engine_idle)."""

from __future__ import annotations

import os
import re

TCP_LISTEN = "0A"
TCP_ESTABLISHED = "01"
SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


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
