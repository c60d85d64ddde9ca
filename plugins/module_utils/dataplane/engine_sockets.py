# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Finding an engine's listening socket and registering it in a route's slot.

The socket is borrowed with pidfd_getfd, checked, inserted into the sockmap and
our copy closed at once: a copy kept open would hold a dead engine's listener
alive, in LISTEN and in the map, and keep drawing connections to it.
"""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    direct_drain,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    admit,
    store_epoch_reader,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import run_command
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    FAMILIES_MAP,
    SOCKETS_MAP,
    has_map,
    opened_map,
    writer_lock,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.proc_sockets import (
    TCP_LISTEN,
    socket_fds,
    tcp_rows,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    FAMILIES_VALUE,
    MAX_SLOTS,
    SOCKET_VALUE,
    TAKES_IPV4,
    TAKES_IPV6,
    socket_key,
    validate_port,
    validate_slot,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_lifecycle import (
    SELF_NETNS,
    link_state,
    netns_inode,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    require_route,
    sync_slot_limit,
)

FAMILIES = {"inet": socket.AF_INET, "inet6": socket.AF_INET6}
_PROC_NET_FILES = {"inet": "tcp", "inet6": "tcp6"}
_SO_COOKIE = 57
_SO_PROTOCOL = 38
_SO_DOMAIN = 39
_SIOCGSKNS = 0x894C
_POLL_INTERVAL_S = 0.2


def main_pid_of_unit(unit, runner=None):
    """The MainPID systemd reports for unit; fails when the unit has no running main process."""
    argv = ["systemctl", "show", "-p", "MainPID", "--value", unit]
    rc, out, err = (runner or run_command)(argv)
    pid = out.strip()
    if rc != 0 or not pid.isdigit() or int(pid) == 0:
        raise FleetError(
            "unit %s has no running main process (systemctl show MainPID gave %r)"
            % (unit, pid or err.strip()),
            {"field": "unit", "cmd": argv, "rc": rc, "stdout": out, "stderr": err},
        )
    return int(pid)


def listening_inodes(pid, port, family=None):
    """Inodes of TCP sockets in LISTEN on port, as seen in pid's netns: [(family, inode)]."""
    found = []
    for name in [family] if family else sorted(_PROC_NET_FILES):
        path = "/proc/%d/net/%s" % (pid, _PROC_NET_FILES[name])
        try:
            with open(path) as handle:
                text = handle.read()
        except FileNotFoundError:
            continue  # no such process, or IPv6 disabled
        for local_port, state, inode in tcp_rows(text):
            if local_port == port and state == TCP_LISTEN and inode != 0:
                found.append((name, inode))
    return found


def fd_of_inode(pid, inode):
    """The fd number under which pid holds socket inode, or None."""
    return socket_fds(pid).get(inode)


def wait_for_listener(pid, port, family=None, timeout=30.0):
    """Poll until pid holds a TCP socket listening on port; return (family, fd number, inode).

    The fd number is only what /proc said a moment ago: the caller checks the copy it
    takes (check_engine_socket) against the inode and port found here.
    """
    deadline = time.monotonic() + timeout
    while True:
        if not os.path.exists("/proc/%d" % pid):
            raise FleetError("pid %d is not running" % pid, {"field": "pid", "value": pid})
        for found_family, inode in listening_inodes(pid, port, family):
            fd = fd_of_inode(pid, inode)
            if fd is not None:
                return found_family, fd, inode
        if time.monotonic() >= deadline:
            raise FleetError(
                "pid %d holds no TCP socket listening on port %d%s after %s seconds"
                % (pid, port, " (family %s)" % family if family else "", timeout),
                {"field": "listen_port", "value": port, "pid": pid},
            )
        time.sleep(_POLL_INTERVAL_S)


def socket_netns_inode(fd):
    """Inode of the netns a socket lives in (SIOCGSKNS gives an fd of that netns)."""
    ns_fd = fcntl.ioctl(fd, _SIOCGSKNS)
    try:
        return os.fstat(ns_fd).st_ino
    finally:
        os.close(ns_fd)


def describe_socket(fd):
    """What the router needs to know of the socket behind fd (not a socket: FleetError)."""
    try:
        inode = os.fstat(fd).st_ino
        sock = socket.socket(fileno=os.dup(fd))
    except OSError as exc:
        raise FleetError(
            "the engine's fd is not a socket (%s); the process may have closed and reused it"
            % exc.strerror,
            {"field": "pid", "errno": exc.errno},
        ) from None
    try:
        family = sock.getsockopt(socket.SOL_SOCKET, _SO_DOMAIN)
        return {
            "family": family,
            "type": sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE),
            "protocol": sock.getsockopt(socket.SOL_SOCKET, _SO_PROTOCOL),
            "listening": bool(sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)),
            "v6only": family == socket.AF_INET6
            and bool(sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY)),
            "port": sock.getsockname()[1] if family in FAMILIES.values() else None,
            "inode": inode,
            "netns_ino": socket_netns_inode(fd),
            "cookie": struct.unpack("=Q", sock.getsockopt(socket.SOL_SOCKET, _SO_COOKIE, 8))[0],
        }
    finally:
        sock.close()


def families_taken(info):
    """The ZL_TAKES_* bits of a socket: the connection families bpf_sk_assign accepts for it."""
    if info["family"] == socket.AF_INET:
        return TAKES_IPV4
    return TAKES_IPV6 if info["v6only"] else TAKES_IPV4 | TAKES_IPV6


def check_engine_socket(info, family, want_netns, inode=None, port=None):
    """Refuse anything the router could not, or should not, hand connections to.

    inode and port are what the /proc scan found: between the scan and pidfd_getfd the
    process may have closed that fd and opened another (or the pid may be another
    process now), so the copy itself must be the socket the scan saw.
    """
    problems = []
    if inode is not None and info["inode"] != inode:
        problems.append(
            "the fd now holds socket inode %d, not the listener %d the scan found "
            "(the fd or the pid was reused meanwhile)" % (info["inode"], inode)
        )
    if port is not None and info["port"] != port:
        problems.append("it is bound to port %s, not %d" % (info["port"], port))
    if info["type"] != socket.SOCK_STREAM or info["protocol"] != socket.IPPROTO_TCP:
        problems.append("it is not a TCP socket")
    if not info["listening"]:
        problems.append("it is not listening")
    if family and info["family"] != FAMILIES[family]:
        problems.append("its family is not %s" % family)
    if info["netns_ino"] != want_netns:
        problems.append(
            "it lives in netns %d, not the router's netns %d" % (info["netns_ino"], want_netns)
        )
    if problems:
        raise FleetError("refusing the engine socket: %s" % "; ".join(problems), {"socket": info})


def router_netns_inode(layout):
    """The netns the router is attached to; this process's own when it is not attached."""
    link = link_state(layout)
    if link and link["attached"]:
        return link["netns_ino"]
    return netns_inode(SELF_NETNS)


def read_slots(layout, route_index):
    """{slot: socket cookie} of the live sockets registered for a route."""
    slots = {}
    with opened_map(layout, SOCKETS_MAP, read_only=True) as fd:
        for slot in range(MAX_SLOTS):
            raw = bpf_syscall.map_lookup(fd, socket_key(route_index, slot), SOCKET_VALUE.size)
            if raw is not None:
                slots[slot] = SOCKET_VALUE.unpack(raw)[0]
    return slots


def register_engine_socket(
    layout, route, pid, listen_port, slot=0, family=None, timeout=30.0, check_mode=False,
    epoch=None,
):  # fmt: skip
    """Put the socket pid listens on at listen_port into slot of route.

    A writer that carries a fence epoch (the canary, the engine upgrade) is refused when
    it is older than the node's fence, or above the rollout store's (fence.admit). The boot
    path and an engine's own start hook carry none: they put the node's own engine back and
    never raise a weight.

    Returns changed, before and after (slot cookies), cookie, route_index, socket and
    warnings (what the fence could not check: the store down).
    """
    warnings = []
    slot = validate_slot(slot)
    listen_port = validate_port(listen_port, "listen_port")
    if family is not None and family not in FAMILIES:
        raise FleetError(
            "family must be one of %s; got %r" % (", ".join(sorted(FAMILIES)), family),
            {"field": "family", "value": family},
        )
    entry = require_route(layout, route)
    want_netns = router_netns_inode(layout)
    _found_family, target_fd, inode = wait_for_listener(pid, listen_port, family, timeout)
    pidfd = bpf_syscall.pidfd_open(pid)
    try:
        engine_fd = bpf_syscall.pidfd_getfd(pidfd, target_fd)
    finally:
        os.close(pidfd)
    try:
        info = describe_socket(engine_fd)
        check_engine_socket(info, family, want_netns, inode=inode, port=listen_port)
        with writer_lock(layout, "registering slot %d of route %r" % (slot, route)):
            # Again under the lock: the route may have been removed (and its index given to
            # another route) since it was read above.
            entry = require_route(layout, route)
            slots = read_slots(layout, entry.route_index)
            before = slots.get(slot)
            changed = before != info["cookie"]
            if changed and epoch is not None:
                admit(
                    layout.fence_file,
                    epoch,
                    True,
                    "engine socket in slot %d of route %r" % (slot, route),
                    check_mode,
                    store_epoch=store_epoch_reader(layout.store_config),
                    warnings=warnings,
                )
            if not check_mode and has_map(layout, FAMILIES_MAP):
                # Before the insert: the program never sees this socket with another's bits.
                with opened_map(layout, FAMILIES_MAP) as families_fd:
                    bpf_syscall.map_update(
                        families_fd,
                        socket_key(entry.route_index, slot),
                        FAMILIES_VALUE.pack(families_taken(info)),
                    )
            if changed and not check_mode:
                with opened_map(layout, SOCKETS_MAP) as map_fd:
                    # One update replaces whatever the slot held: no moment without a socket.
                    bpf_syscall.map_update(
                        map_fd, socket_key(entry.route_index, slot), SOCKET_VALUE.pack(engine_fd)
                    )
                if before is not None:
                    # A live engine's socket was replaced (an upgrade's swap): its pooled
                    # direct clients come back through the router, to the new one.
                    direct_drain.note_engine_replaced(
                        layout,
                        entry.port,
                        entry.weight_bp,
                        "slot %d of route %r: another engine socket" % (slot, route),
                        epoch,
                    )
            # After the insert: until the limit covers the new slot, the program just does
            # not use that socket yet. Also mends a limit written by an older version (0).
            limit_changed = sync_slot_limit(layout, entry, set(slots) | {slot}, check_mode)
            changed = changed or limit_changed
    finally:
        os.close(engine_fd)
    return {
        "changed": changed,
        "before": before,
        "after": info["cookie"],
        "cookie": info["cookie"],
        "route_index": entry.route_index,
        "socket": info,
        "warnings": warnings,
    }


def unregister_engine_socket(layout, route, slot=0, check_mode=False):
    """Empty slot of route; new connections then use the route's other slots or the proxy."""
    slot = validate_slot(slot)
    require_route(layout, route)
    with writer_lock(layout, "emptying slot %d of route %r" % (slot, route)):
        entry = require_route(layout, route)  # under the lock: the index is the route's now
        slots = read_slots(layout, entry.route_index)
        before = slots.get(slot)
        if before is not None and not check_mode:
            with opened_map(layout, SOCKETS_MAP) as map_fd:
                bpf_syscall.map_delete(
                    map_fd, socket_key(entry.route_index, slot), bpf_syscall.SOCKMAP_ABSENT_ERRNOS
                )
        # After the delete: a limit still above the emptied slot only costs lookups.
        limit_changed = sync_slot_limit(layout, entry, set(slots) - {slot}, check_mode)
    return {
        "changed": before is not None or limit_changed,
        "before": before,
        "after": None,
        "cookie": None,
        "route_index": entry.route_index,
    }
