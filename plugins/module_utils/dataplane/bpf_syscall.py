# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A small ctypes layer over the bpf(2) system call and pidfd_getfd(2).

Only what the router needs: pinned objects, map elements, BPF links, test runs,
run-time statistics and object information. Attribute layouts follow
include/uapi/linux/bpf.h; each command packs its fields at their offsets in a
zeroed `union bpf_attr`, which the kernel requires to be zero past the fields
it reads.
"""

from __future__ import annotations

import ctypes
import errno as errno_codes
import os
import platform
import struct

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

_BPF_SYSCALL = {"x86_64": 321, "aarch64": 280}
_PIDFD_OPEN_SYSCALL = 434  # the same number on every architecture
_PIDFD_GETFD_SYSCALL = 438

# enum bpf_cmd
BPF_MAP_CREATE = 0
BPF_MAP_LOOKUP_ELEM = 1
BPF_MAP_UPDATE_ELEM = 2
BPF_MAP_DELETE_ELEM = 3
BPF_MAP_GET_NEXT_KEY = 4
BPF_OBJ_PIN = 6
BPF_OBJ_GET = 7
BPF_PROG_TEST_RUN = 10
BPF_OBJ_GET_INFO_BY_FD = 15
BPF_LINK_CREATE = 28
BPF_LINK_UPDATE = 29
BPF_ENABLE_STATS = 32
BPF_LINK_DETACH = 34

# map update flags
BPF_ANY = 0
BPF_NOEXIST = 1
BPF_EXIST = 2

BPF_F_REPLACE = 1 << 2  # link update: only if the link still runs old_prog_fd
BPF_F_RDONLY = 1 << 3  # BPF_OBJ_GET file_flags: the fd can look up but never update or delete
BPF_SK_LOOKUP = 36  # enum bpf_attach_type
BPF_STATS_RUN_TIME = 0
SOCKMAP_ABSENT_ERRNOS = (errno_codes.ENOENT, errno_codes.EINVAL)
BPF_LINK_TYPE_NETNS = 5

_ATTR_SIZE = 144  # sizeof(union bpf_attr) on 6.x kernels; larger is fine if zero
_PROG_INFO_SIZE = 232
_LINK_INFO_SIZE = 48
_MAP_INFO_SIZE = 88

_COMMAND_NAMES = {
    BPF_MAP_LOOKUP_ELEM: "BPF_MAP_LOOKUP_ELEM",
    BPF_MAP_UPDATE_ELEM: "BPF_MAP_UPDATE_ELEM",
    BPF_MAP_DELETE_ELEM: "BPF_MAP_DELETE_ELEM",
    BPF_MAP_GET_NEXT_KEY: "BPF_MAP_GET_NEXT_KEY",
    BPF_OBJ_PIN: "BPF_OBJ_PIN",
    BPF_OBJ_GET: "BPF_OBJ_GET",
    BPF_PROG_TEST_RUN: "BPF_PROG_TEST_RUN",
    BPF_OBJ_GET_INFO_BY_FD: "BPF_OBJ_GET_INFO_BY_FD",
    BPF_LINK_CREATE: "BPF_LINK_CREATE",
    BPF_LINK_UPDATE: "BPF_LINK_UPDATE",
    BPF_ENABLE_STATS: "BPF_ENABLE_STATS",
    BPF_LINK_DETACH: "BPF_LINK_DETACH",
}

_libc = None


def _syscall():
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
        _libc.syscall.restype = ctypes.c_long
    return _libc.syscall


def _bpf_syscall_number():
    machine = platform.machine()
    try:
        return _BPF_SYSCALL[machine]
    except KeyError:
        raise FleetError(
            "bpf() is not wired for machine %r; supported: %s"
            % (machine, ", ".join(sorted(_BPF_SYSCALL))),
            {"machine": machine},
        ) from None


def _raise_errno(what, err, extra=None):
    details = {
        "errno": err,
        "errno_name": errno_codes.errorcode.get(err, str(err)),
        "syscall": what,
    }
    details.update(extra or {})
    raise FleetError(
        "%s failed: %s (%s)" % (what, os.strerror(err), details["errno_name"]), details
    )


def bpf(cmd, attr, what=None):
    """Run bpf(cmd, attr) and return its result; raise FleetError on failure.

    attr is a ctypes buffer holding the packed attributes.
    """
    result = _syscall()(
        ctypes.c_long(_bpf_syscall_number()), ctypes.c_long(cmd), attr, ctypes.c_uint(len(attr))
    )
    if result < 0:
        _raise_errno(what or _COMMAND_NAMES.get(cmd, "bpf(%d)" % cmd), ctypes.get_errno())
    return result


def _attr(*fields):
    """A zeroed bpf_attr with (struct format, offset, value) fields packed in."""
    buf = ctypes.create_string_buffer(_ATTR_SIZE)
    for fmt, offset, value in fields:
        struct.pack_into(fmt, buf, offset, value)
    return buf


def _address(buf):
    return ctypes.addressof(buf) if buf is not None else 0


def _path_buffer(path):
    return ctypes.create_string_buffer(os.fsencode(path))


# Pinned objects


def obj_get(path, what=None, read_only=False):
    """Open a pinned BPF object (program, map or link) and return a new fd.

    read_only: updates and deletes through the fd fail with EPERM, and opening needs
    only read permission on the pin. A link cannot be opened so (the kernel: EINVAL).
    """
    path_buf = _path_buffer(path)
    flags = BPF_F_RDONLY if read_only else 0
    attr = _attr(("=Q", 0, _address(path_buf)), ("=I", 12, flags))
    return bpf(
        BPF_OBJ_GET,
        attr,
        what or "opening pinned BPF object %s%s" % (path, " read-only" if read_only else ""),
    )


def obj_pin(fd, path):
    """Pin the object behind fd at path on a bpffs."""
    path_buf = _path_buffer(path)
    attr = _attr(("=Q", 0, _address(path_buf)), ("=I", 8, fd))
    bpf(BPF_OBJ_PIN, attr, "pinning BPF object at %s" % path)


# Maps


def map_create(map_type, key_size, value_size, max_entries, name, map_flags=0):
    """Create a map and return its fd (name: at most 15 bytes, the kernel's limit)."""
    encoded = name.encode("ascii")
    if len(encoded) > 15:
        raise FleetError("map name %r is longer than 15 bytes" % name, {"field": "name"})
    attr = _attr(
        ("=I", 0, map_type),
        ("=I", 4, key_size),
        ("=I", 8, value_size),
        ("=I", 12, max_entries),
        ("=I", 16, map_flags),
        ("=16s", 28, encoded),
    )
    return bpf(BPF_MAP_CREATE, attr, "creating BPF map %s" % name)


# Map elements


def map_lookup(map_fd, key, value_size):
    """Return the value bytes stored under key, or None when there is none."""
    key_buf = ctypes.create_string_buffer(bytes(key), len(key))
    value_buf = ctypes.create_string_buffer(value_size)
    attr = _attr(("=I", 0, map_fd), ("=Q", 8, _address(key_buf)), ("=Q", 16, _address(value_buf)))
    try:
        bpf(BPF_MAP_LOOKUP_ELEM, attr)
    except FleetError as exc:
        if exc.errno == errno_codes.ENOENT:
            return None
        raise
    return value_buf.raw


def map_update(map_fd, key, value, flags=BPF_ANY):
    """Store value under key in one atomic update."""
    key_buf = ctypes.create_string_buffer(bytes(key), len(key))
    value_buf = ctypes.create_string_buffer(bytes(value), len(value))
    attr = _attr(
        ("=I", 0, map_fd),
        ("=Q", 8, _address(key_buf)),
        ("=Q", 16, _address(value_buf)),
        ("=Q", 24, flags),
    )
    bpf(BPF_MAP_UPDATE_ELEM, attr)


def map_delete(map_fd, key, absent_errnos=(errno_codes.ENOENT,)):
    """Delete key; return False when it was not there.

    A sockmap reports an empty slot with EINVAL rather than ENOENT: pass
    absent_errnos=SOCKMAP_ABSENT_ERRNOS for it.
    """
    key_buf = ctypes.create_string_buffer(bytes(key), len(key))
    attr = _attr(("=I", 0, map_fd), ("=Q", 8, _address(key_buf)))
    try:
        bpf(BPF_MAP_DELETE_ELEM, attr)
    except FleetError as exc:
        if exc.errno in absent_errnos:
            return False
        raise
    return True


def map_next_key(map_fd, key, key_size):
    """The key after key (the first key when key is None), or None at the end."""
    key_buf = ctypes.create_string_buffer(bytes(key), len(key)) if key is not None else None
    next_buf = ctypes.create_string_buffer(key_size)
    attr = _attr(("=I", 0, map_fd), ("=Q", 8, _address(key_buf)), ("=Q", 16, _address(next_buf)))
    try:
        bpf(BPF_MAP_GET_NEXT_KEY, attr)
    except FleetError as exc:
        if exc.errno == errno_codes.ENOENT:
            return None
        raise
    return next_buf.raw


def map_keys(map_fd, key_size):
    """All keys of a map (a hash map may change while it is walked)."""
    keys = []
    key = map_next_key(map_fd, None, key_size)
    while key is not None:
        keys.append(key)
        key = map_next_key(map_fd, key, key_size)
    return keys


# Object information


def _obj_info(fd, size, what):
    info = ctypes.create_string_buffer(size)
    attr = _attr(("=I", 0, fd), ("=I", 4, size), ("=Q", 8, ctypes.addressof(info)))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr, what)
    return info.raw


def _c_string(raw):
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def prog_info(prog_fd):
    """Identity and run-time statistics of a loaded program."""
    raw = _obj_info(prog_fd, _PROG_INFO_SIZE, "reading BPF program information")
    prog_type, prog_id = struct.unpack_from("=II", raw, 0)
    return {
        "type": prog_type,
        "id": prog_id,
        "tag": raw[8:16].hex(),
        "name": _c_string(raw[64:80]),
        "load_time_ns": struct.unpack_from("=Q", raw, 40)[0],
        "run_time_ns": struct.unpack_from("=Q", raw, 192)[0],
        "run_cnt": struct.unpack_from("=Q", raw, 200)[0],
    }


def prog_map_ids(prog_fd):
    """The ids of the maps a loaded program uses (bpf_prog_info nr_map_ids, map_ids)."""
    count = struct.unpack_from(
        "=I", _obj_info(prog_fd, _PROG_INFO_SIZE, "reading BPF program information"), 52
    )[0]
    if count == 0:
        return []
    ids = ctypes.create_string_buffer(4 * count)
    info = ctypes.create_string_buffer(_PROG_INFO_SIZE)
    struct.pack_into("=IQ", info, 52, count, ctypes.addressof(ids))
    attr = _attr(("=I", 0, prog_fd), ("=I", 4, _PROG_INFO_SIZE), ("=Q", 8, ctypes.addressof(info)))
    bpf(BPF_OBJ_GET_INFO_BY_FD, attr, "reading the maps of a BPF program")
    filled = min(count, struct.unpack_from("=I", info.raw, 52)[0])
    return list(struct.unpack_from("=%dI" % filled, ids.raw, 0))


def link_info(link_fd):
    """A link's id, program and, for a netns link, its netns inode (0 once detached)."""
    raw = _obj_info(link_fd, _LINK_INFO_SIZE, "reading BPF link information")
    link_type, link_id, prog_id = struct.unpack_from("=III", raw, 0)
    info = {"type": link_type, "id": link_id, "prog_id": prog_id}
    if link_type == BPF_LINK_TYPE_NETNS:
        info["netns_ino"], info["attach_type"] = struct.unpack_from("=II", raw, 16)
    return info


def map_info(map_fd):
    """A map's type, id, key and value sizes, capacity and name."""
    raw = _obj_info(map_fd, _MAP_INFO_SIZE, "reading BPF map information")
    map_type, map_id, key_size, value_size, max_entries, map_flags = struct.unpack_from(
        "=6I", raw, 0
    )
    return {
        "type": map_type,
        "id": map_id,
        "key_size": key_size,
        "value_size": value_size,
        "max_entries": max_entries,
        "flags": map_flags,
        "name": _c_string(raw[24:40]),
    }


# Links


def link_create(prog_fd, target_fd, attach_type, flags=0):
    """Attach a program through a new BPF link and return the link's fd."""
    attr = _attr(
        ("=I", 0, prog_fd), ("=I", 4, target_fd), ("=I", 8, attach_type), ("=I", 12, flags)
    )
    return bpf(BPF_LINK_CREATE, attr, "creating BPF link")


def link_update(link_fd, new_prog_fd, old_prog_fd=None):
    """Swap the link's program atomically (only if it still runs old_prog_fd, when given)."""
    fields = [("=I", 0, link_fd), ("=I", 4, new_prog_fd)]
    if old_prog_fd is not None:
        fields += [("=I", 8, BPF_F_REPLACE), ("=I", 12, old_prog_fd)]
    bpf(BPF_LINK_UPDATE, _attr(*fields), "updating BPF link program")


def link_detach(link_fd):
    """Detach the link now, even while other fds or pins still hold it."""
    bpf(BPF_LINK_DETACH, _attr(("=I", 0, link_fd)), "detaching BPF link")


# Test runs and statistics


def prog_test_run(prog_fd, ctx_in, ctx_out_size=None, repeat=1):
    """Run a program once (or repeat times) on a context; return (retval, ctx_out, duration_ns)."""
    ctx_out_size = len(ctx_in) if ctx_out_size is None else ctx_out_size
    ctx_in_buf = ctypes.create_string_buffer(bytes(ctx_in), len(ctx_in))
    ctx_out_buf = ctypes.create_string_buffer(ctx_out_size)
    attr = _attr(
        ("=I", 0, prog_fd),
        ("=I", 32, repeat),
        ("=I", 40, len(ctx_in)),
        ("=I", 44, ctx_out_size),
        ("=Q", 48, ctypes.addressof(ctx_in_buf)),
        ("=Q", 56, ctypes.addressof(ctx_out_buf)),
    )
    bpf(BPF_PROG_TEST_RUN, attr, "BPF_PROG_TEST_RUN")
    (retval,) = struct.unpack_from("=I", attr, 4)
    (duration,) = struct.unpack_from("=I", attr, 36)
    (ctx_size_out,) = struct.unpack_from("=I", attr, 44)
    return retval, ctx_out_buf.raw[:ctx_size_out], duration


def enable_run_time_stats():
    """Turn on per-program run_time_ns/run_cnt while the returned fd stays open."""
    return bpf(BPF_ENABLE_STATS, _attr(("=I", 0, BPF_STATS_RUN_TIME)), "BPF_ENABLE_STATS")


# Other processes' file descriptors


def pidfd_open(pid):
    """An fd that refers to process pid (stable even if the pid is reused)."""
    try:
        if hasattr(os, "pidfd_open"):
            return os.pidfd_open(pid)
    except OSError as exc:
        _raise_errno("pidfd_open(%d)" % pid, exc.errno, {"pid": pid})
    result = _syscall()(ctypes.c_long(_PIDFD_OPEN_SYSCALL), ctypes.c_int(pid), ctypes.c_uint(0))
    if result < 0:
        _raise_errno("pidfd_open(%d)" % pid, ctypes.get_errno(), {"pid": pid})
    return result


def pidfd_getfd(pidfd, target_fd):
    """A duplicate, in this process, of another process's fd (needs ptrace rights)."""
    result = _syscall()(
        ctypes.c_long(_PIDFD_GETFD_SYSCALL),
        ctypes.c_int(pidfd),
        ctypes.c_int(target_fd),
        ctypes.c_uint(0),
    )
    if result < 0:
        _raise_errno("pidfd_getfd(fd %d)" % target_fd, ctypes.get_errno(), {"fd": target_fd})
    return result


def possible_cpus():
    """How many CPUs per-CPU maps hold a value for (/sys/devices/system/cpu/possible)."""
    with open("/sys/devices/system/cpu/possible") as handle:
        text = handle.read().strip()
    count = 0
    for part in text.split(","):
        first, _dash, last = part.partition("-")
        count += int(last or first) - int(first) + 1
    return count
