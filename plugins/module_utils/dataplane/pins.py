# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Where the router's objects are pinned, and safe access to them.

<pin_dir>/prog         the sk_lookup program
<pin_dir>/prog_next    a program being loaded for an upgrade (short-lived)
<pin_dir>/link         the BPF link attaching the program to a netns
<pin_dir>/maps/<name>  zl_routes, zl_sockets, zl_counters, zl_latency (layout 1),
                       zl_config, zl_families, zl_weights (layout 2),
                       zl_cohorts_v4, zl_cohorts_v6, zl_cohort_ctrs (layout 3),
                       zl_clients (layout 4)

Every map is checked against route_codec.MAP_SPECS when it is opened: a pin of another
layout (another value size, say) is refused before anything is read into a buffer of
the wrong size. Pins of the previous layout are complete as they are (routes, weights and
rollbacks work on them); the router's attach adds the maps the new layout brings.

The node's fence epoch (fence.py) is kept outside bpffs, in fence_file, so that a reboot
or a router upgrade does not lose it. The direct-drain marker (direct_drain.py), which the
engines read, is /run/zerolayer/direct-drain.json with the default fence file, and beside
the fence file for any other (a test's router, a second layout), so that each
router's marker is its own.

Which fence file a router has is the node's, not its caller's (node_layout): where the
node config (/etc/zerolayer/router.json, written by the ebpf_router role) is the router's
(names its pin_dir, or names none and the router is at the default one), its fence_file
(default /var/lib/zerolayer/fence.json) is the router's, and a caller naming another is
refused: a writer pointed at another file would skip the node's fence. Elsewhere (a test's
router, one attached by hand) the caller's stands. The writers' lock is the router's,
named by its pin dir whatever fence file a writer names (writer_lock_path).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import struct
import time
import urllib.parse

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.locks import flock_within
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.direct_drain import (
    DEFAULT_DIRECT_DRAIN_FILE,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    DEFAULT_FENCE_FILE,
    DEFAULT_STORE_CONFIG,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CONFIG_KEY,
    CONFIG_VALUE,
    LAYOUT_VERSION,
    MAP_SPEC_BY_NAME,
    MAP_SPECS,
)

DEFAULT_PIN_DIR = "/sys/fs/bpf/zerolayer"
# The node config the ebpf_router role writes (node_cli's --config default): it says which
# fence file, and which store client settings, the router at its pin_dir has.
DEFAULT_NODE_CONFIG = "/etc/zerolayer/router.json"
# One writers' lock per router, named by its pin dir: outside bpffs, so that removing the pins
# cannot take it away from under a holder, and in /run, as a lock outlives no boot.
WRITER_LOCK_DIR = "/run/zerolayer/writer-locks"
BPFFS_MAGIC = 0xCAFE4A11
# An attach holds the writer lock through a program load and the verifier (well under a
# second here); another writer waits at most this long for it.
WRITER_LOCK_TIMEOUT_S = 30.0
_LOCK_POLL_S = 0.005
MAP_NAMES = tuple(spec.name for spec in MAP_SPECS)
(
    ROUTES_MAP,
    SOCKETS_MAP,
    COUNTERS_MAP,
    LATENCY_MAP,
    CONFIG_MAP,
    FAMILIES_MAP,
    WEIGHTS_MAP,
    COHORTS_V4_MAP,
    COHORTS_V6_MAP,
    COHORT_COUNTERS_MAP,
    CLIENTS_MAP,
) = MAP_NAMES


class WriterLockTimeout(FleetError):
    """Another writer held the router's writer lock for longer than the wait allowed."""


class PinLayout:
    """The paths of one router's pins."""

    def __init__(self, pin_dir=DEFAULT_PIN_DIR, fence_file=None, store_config=None):
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
        # The router's, not the fence file's: a writer naming another fence file still waits
        # for the others.
        self.writer_lock_file = writer_lock_path(self.pin_dir)
        # The store client settings a writer's epoch is checked against (fence.admit); None:
        # no store for this router (no node config is its).
        self.store_config = store_config
        if self.fence_file == DEFAULT_FENCE_FILE:
            self.direct_drain_file = DEFAULT_DIRECT_DRAIN_FILE
        else:
            self.direct_drain_file = os.path.join(
                os.path.dirname(self.fence_file), "direct-drain.json"
            )
        self.prog = os.path.join(self.pin_dir, "prog")
        self.next_prog = os.path.join(self.pin_dir, "prog_next")
        self.link = os.path.join(self.pin_dir, "link")
        self.maps_dir = os.path.join(self.pin_dir, "maps")

    def map(self, name):
        return os.path.join(self.maps_dir, name)

    def map_paths(self):
        return [self.map(name) for name in MAP_NAMES]


def writer_lock_path(pin_dir):
    """The writers' lock of the router pinned at pin_dir: one file per router, whichever
    spelling of the path (a trailing slash, a symlink) or fence file its writers use."""
    real = os.path.realpath(pin_dir)
    name = urllib.parse.quote(real, safe="")
    if len(name) > 200:  # a file name has at most 255 bytes
        name = hashlib.sha256(os.fsencode(real)).hexdigest()
    return os.path.join(WRITER_LOCK_DIR, name + ".writer.lock")


def read_node_config(path=DEFAULT_NODE_CONFIG):
    """The node config as a dict; None where there is none (a test machine, a router
    attached by hand). One that cannot be read is refused, never read as none: it is the
    node's word on which fence file is its."""
    try:
        with open(path) as handle:
            config = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FleetError(
            "node config %s cannot be read as JSON (%s); it says which fence file is the "
            "node's: fix it, or run the ebpf_router role again" % (path, exc),
            {"field": "config", "path": path},
        ) from None
    if not isinstance(config, dict):
        raise FleetError(
            "node config %s must hold a JSON object" % path, {"field": "config", "path": path}
        )
    return config


def node_layout(pin_dir=None, fence_file=None, node_config=None, config_path=DEFAULT_NODE_CONFIG):
    """The layout of the router at pin_dir, with the node's fence file (see the module doc).

    node_config: the node config read from config_path, None where there is none. Where it
    is the router's, a fence_file other than its own is refused, naming both, before
    anything is read or written; the layout then carries the node's store client settings
    (store_config, default DEFAULT_STORE_CONFIG) for the epoch check.
    """
    config = node_config if node_config is not None else {}
    pin_dir = pin_dir or config.get("pin_dir") or DEFAULT_PIN_DIR
    if node_config is None or not _same_path(pin_dir, config.get("pin_dir") or DEFAULT_PIN_DIR):
        return PinLayout(pin_dir, fence_file=fence_file)
    layout = PinLayout(
        pin_dir,
        fence_file=config.get("fence_file") or DEFAULT_FENCE_FILE,
        store_config=config.get("store_config") or DEFAULT_STORE_CONFIG,
    )
    if fence_file and os.path.normpath(fence_file) != layout.fence_file:
        raise FleetError(
            "fence_file %s is not this node's fence file %s (fence_file in the node config %s, "
            "whose router is the one under %s); a writer must be checked against the node's "
            "fence: leave fence_file out or give %s. Nothing was read or written"
            % (fence_file, layout.fence_file, config_path, layout.pin_dir, layout.fence_file),
            {
                "field": "fence_file",
                "value": fence_file,
                "node_fence_file": layout.fence_file,
                "config": config_path,
            },
        )
    return layout


def _same_path(one, other):
    return os.path.realpath(one) == os.path.realpath(other)


def layout_options():
    """The argument_spec entries of every module that works on a router's pins.

    fence_file keeps its documented default for compatibility; that default stands for the
    node's fence file (layout_from_params), any other value must be the node's (node_layout).
    """
    return {
        "pin_dir": {"type": "path", "default": DEFAULT_PIN_DIR},
        "fence_file": {"type": "path", "default": DEFAULT_FENCE_FILE},
    }


def layout_from_params(params, config_path=DEFAULT_NODE_CONFIG):
    """The layout a module works on: the node's fence file (node_layout), read from the
    node config at config_path. The option's default asks for no file in particular: on a
    node whose config names another fence file, it means that one."""
    given = params["fence_file"]
    if given and os.path.normpath(given) == DEFAULT_FENCE_FILE:
        given = None
    return node_layout(params["pin_dir"], given, read_node_config(config_path), config_path)


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


def map_names_of_layout(version):
    return [spec.name for spec in MAP_SPECS if spec.since_layout <= version]


def pinned_layout_version(layout):
    """The layout the pinned maps form: LAYOUT_VERSION, an older one, or None (incomplete).

    Read from the maps that are there; the config map's own record is checked on open.
    """
    present = {name for name in MAP_NAMES if os.path.exists(layout.map(name))}
    for version in range(LAYOUT_VERSION, 0, -1):
        if present == set(map_names_of_layout(version)):
            return version
    return None


def missing_pins(layout, include_program=False):
    """Pins that are not there; a complete older layout misses nothing (attach upgrades it)."""
    missing = []
    if pinned_layout_version(layout) is None:
        missing = [path for path in layout.map_paths() if not os.path.exists(path)]
    if include_program and not os.path.exists(layout.prog):
        missing.append(layout.prog)
    return missing


def maps_pinned(layout):
    """Whether the router's maps are pinned (a deep rollback removes them)."""
    return os.path.isdir(layout.pin_dir) and not missing_pins(layout)


def has_map(layout, name):
    """Whether name is pinned (a map a newer layout added is absent from older pins)."""
    return os.path.exists(layout.map(name))


def require_maps(layout):
    """Fail, naming what is missing or foreign, unless the router's maps are usable."""
    missing = missing_pins(layout)
    if missing:
        raise FleetError(
            "router maps are not pinned under %s (missing: %s); attach the router first with "
            "zerolayer.fleet.router state=attached and the same pin_dir"
            % (layout.pin_dir, ", ".join(missing)),
            {"field": "pin_dir", "missing": missing},
        )
    if os.path.exists(layout.map(CONFIG_MAP)):
        read_layout_config(layout)


def check_map(fd, name, path):
    """Refuse a pinned map whose type, key or value size or capacity is not this code's."""
    info = bpf_syscall.map_info(fd)
    problems = MAP_SPEC_BY_NAME[name].differences(info)
    if problems:
        raise FleetError(
            "pinned map %s is not the %s this router version uses: %s. It was made by "
            "another layout; nothing was read or written. Remove the router with "
            "state=absent (this drops its routes) and attach it again"
            % (path, name, "; ".join(problems)),
            {"field": "pin_dir", "path": path, "map": name, "problems": problems},
        )
    return info


def check_pinned_maps(layout):
    """Check every pinned map of the router (before an upgrade reuses them)."""
    for name in MAP_NAMES:
        path = layout.map(name)
        if os.path.exists(path):
            with opened(path, read_only=True) as fd:
                check_map(fd, name, path)


def read_layout_config(layout):
    """(layout_version, seed_weight, seed_slot) from zl_config; refuses an unknown layout."""
    path = layout.map(CONFIG_MAP)
    with opened(path, read_only=True) as fd:
        check_map(fd, CONFIG_MAP, path)
        raw = bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size)
    version, _reserved, seed_weight, seed_slot = CONFIG_VALUE.unpack(raw)
    # Pins of a previous layout (2 or 3) keep working until an attach adds the maps they
    # lack; their zl_config says their layout as long as they have no map of a later one.
    if version != LAYOUT_VERSION and not (
        2 <= version < LAYOUT_VERSION and pinned_layout_version(layout) == version
    ):
        raise FleetError(
            "the maps under %s are of layout %d, and this router version knows layout %d; "
            "install the collection version that made them, or remove the router with "
            "state=absent (this drops its routes) and attach it again"
            % (layout.pin_dir, version, LAYOUT_VERSION),
            {"field": "pin_dir", "layout_version": version, "expected": LAYOUT_VERSION},
        )
    return version, seed_weight, seed_slot


@contextlib.contextmanager
def opened(path, read_only=False):
    """An fd of a pinned object, closed on exit (read_only: lookups only, for readers)."""
    fd = bpf_syscall.obj_get(path, read_only=read_only)
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def opened_map(layout, name, read_only=False):
    """An fd of one of the router's maps, checked against its spec first.

    Readers pass read_only: such an fd cannot change the map, and needs no capability.
    """
    require_maps(layout)
    path = layout.map(name)
    if not os.path.exists(path):
        raise FleetError(
            "map %s is not pinned under %s: the pins are of layout %s; attach the router "
            "(zerolayer.fleet.router state=attached) to upgrade them to layout %d"
            % (name, layout.pin_dir, pinned_layout_version(layout), LAYOUT_VERSION),
            {"field": "pin_dir", "missing": [path]},
        )
    with opened(path, read_only) as fd:
        check_map(fd, name, path)
        yield fd


@contextlib.contextmanager
def writer_lock(layout, what="a write", timeout=WRITER_LOCK_TIMEOUT_S):
    """Serialise the writers of one router (a playbook, the boot unit, an engine's hook).

    The lock file is the router's (writer_lock_path, named by its pin dir), outside the pin
    dir, so removing the pins cannot take the lock away from under a holder. A wait is
    bounded: after timeout seconds the writer is refused with the holder's pid and purpose.
    A fast rollback takes no writer lock at all (routes.zero_weights).

    The holder removes the file before it lets go, so that no router leaves one behind;
    a waiter that then gets the removed file's lock sees that it is no longer the one at
    the path and tries again (_acquire), so two writers never both hold the lock.
    """
    path = layout.writer_lock_file
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = _acquire(path, what, timeout)
    try:
        os.pwrite(fd, ("%d %s\n" % (os.getpid(), what)).encode(), 0)
        try:
            yield
        finally:
            unlink_if_present(path)
    finally:
        os.close(fd)  # closing the fd releases the flock


def _acquire(path, what, timeout):
    """An fd of the lock file at path, flocked, within timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            locked = flock_within(fd, max(0.0, deadline - time.monotonic()), _LOCK_POLL_S)
            if locked and _is_at(fd, path):
                return fd
            holder = None if locked else os.pread(fd, 200, 0).decode("utf-8", "replace")
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not locked:
            holder = (holder or "").strip() or "unknown"
            raise WriterLockTimeout(
                "%s waited %.1f s for the router's writer lock %s and gave up; it is held by "
                "pid and purpose: %s. Retry when that writer is done"
                % (what, timeout, path, holder),
                {"lock": path, "holder": holder},
            )
        # The lock of a file its holder removed as it let go: the path has a new one.


def _is_at(fd, path):
    """Whether fd is the file now at path (not one removed since it was opened)."""
    try:
        now = os.stat(path)
    except FileNotFoundError:
        return False
    opened_file = os.fstat(fd)
    return (now.st_dev, now.st_ino) == (opened_file.st_dev, opened_file.st_ino)


def unlink_if_present(path):
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True
