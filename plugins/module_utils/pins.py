# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Where the router's objects are pinned, and safe access to them.

<pin_dir>/prog         the sk_lookup program
<pin_dir>/prog_next    a program being loaded for an upgrade (short-lived)
<pin_dir>/link         the BPF link attaching the program to a netns
<pin_dir>/maps/<name>  zl_routes, zl_sockets, zl_counters, zl_latency

The node's fence epoch (fence.py) is kept outside bpffs, in fence_file, so that a reboot
or a router upgrade does not lose it.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import struct

from ansible_collections.zerolayer.fleet.plugins.module_utils import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.fence import DEFAULT_FENCE_FILE

DEFAULT_PIN_DIR = "/sys/fs/bpf/zerolayer"
BPFFS_MAGIC = 0xCAFE4A11
MAP_NAMES = ("zl_routes", "zl_sockets", "zl_counters", "zl_latency")
ROUTES_MAP, SOCKETS_MAP, COUNTERS_MAP, LATENCY_MAP = MAP_NAMES


class PinLayout:
    """The paths of one router's pins."""

    def __init__(self, pin_dir=DEFAULT_PIN_DIR, fence_file=None):
        if not pin_dir or not os.path.isabs(pin_dir):
            raise FleetError(
                "pin_dir must be an absolute path on a bpffs, e.g. %s; got %r"
                % (DEFAULT_PIN_DIR, pin_dir),
                {"field": "pin_dir"},
            )
        self.pin_dir = os.path.normpath(pin_dir)
        fence_file = fence_file or DEFAULT_FENCE_FILE
        if not os.path.isabs(fence_file):
            raise FleetError(
                "fence_file must be an absolute path outside bpffs, e.g. %s; got %r"
                % (DEFAULT_FENCE_FILE, fence_file),
                {"field": "fence_file"},
            )
        self.fence_file = os.path.normpath(fence_file)
        self.prog = os.path.join(self.pin_dir, "prog")
        self.next_prog = os.path.join(self.pin_dir, "prog_next")
        self.link = os.path.join(self.pin_dir, "link")
        self.maps_dir = os.path.join(self.pin_dir, "maps")

    def map(self, name):
        return os.path.join(self.maps_dir, name)

    def map_paths(self):
        return [self.map(name) for name in MAP_NAMES]


def layout_options():
    """The argument_spec entries of every module that works on a router's pins."""
    return {
        "pin_dir": {"type": "path", "default": DEFAULT_PIN_DIR},
        "fence_file": {"type": "path", "default": DEFAULT_FENCE_FILE},
    }


def layout_from_params(params):
    return PinLayout(params["pin_dir"], fence_file=params["fence_file"])


def filesystem_magic(path):
    """statfs(2) f_type of the filesystem holding path (os.statvfs does not expose it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(256)  # struct statfs is 120 bytes on 64-bit Linux
    if libc.statfs(os.fsencode(path), buf) != 0:
        err = ctypes.get_errno()
        raise FleetError(
            "statfs(%s) failed: %s" % (path, os.strerror(err)), {"errno": err, "path": path}
        )
    return struct.unpack_from("=q", buf, 0)[0] & 0xFFFFFFFF


def require_bpffs(layout):
    """Fail clearly unless pin_dir (or, before it exists, its parent) is on a bpffs."""
    probe = layout.pin_dir if os.path.isdir(layout.pin_dir) else os.path.dirname(layout.pin_dir)
    if not os.path.isdir(probe):
        raise FleetError(
            "pin_dir %s: its parent %s does not exist; mount a bpffs there first "
            "(mount -t bpf bpf /sys/fs/bpf)" % (layout.pin_dir, probe),
            {"field": "pin_dir", "path": probe},
        )
    if filesystem_magic(probe) != BPFFS_MAGIC:
        raise FleetError(
            "pin_dir %s must be on a bpffs, but %s is not on one; mount it first "
            "(mount -t bpf bpf /sys/fs/bpf)" % (layout.pin_dir, probe),
            {"field": "pin_dir", "path": probe},
        )


def ensure_pin_dirs(layout):
    """Create pin_dir and pin_dir/maps with mode 0700; return True if one was created."""
    require_bpffs(layout)
    created = False
    for path in (layout.pin_dir, layout.maps_dir):
        if not os.path.isdir(path):
            os.mkdir(path, 0o700)
            created = True
        os.chmod(path, 0o700)
    return created


def missing_pins(layout, include_program=False):
    paths = layout.map_paths() + ([layout.prog] if include_program else [])
    return [path for path in paths if not os.path.exists(path)]


def require_maps(layout):
    """Fail, naming what is missing, unless every map of the router is pinned."""
    missing = missing_pins(layout)
    if missing:
        raise FleetError(
            "router maps are not pinned under %s (missing: %s); attach the router first with "
            "zerolayer.fleet.router state=attached and the same pin_dir"
            % (layout.pin_dir, ", ".join(missing)),
            {"field": "pin_dir", "missing": missing},
        )


@contextlib.contextmanager
def opened(path):
    """An fd of a pinned object, closed on exit."""
    fd = bpf_syscall.obj_get(path)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_map(layout, name):
    require_maps(layout)
    with opened(layout.map(name)) as fd:
        yield fd


@contextlib.contextmanager
def writer_lock(layout):
    """Serialise writers of one router (a rollback command and a playbook, say)."""
    fd = os.open(layout.pin_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def unlink_if_present(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
