# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Loading the compiled router object with bpftool.

bpftool (installed on every node) already does ELF parsing, BTF, relocations
and map creation right; a loader of our own would repeat libbpf for no gain.
bpftool cannot attach sk_lookup programs, so attaching is done through
bpf_syscall.link_create instead.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CONFIG_MAP,
    MAP_NAMES,
    WEIGHTS_MAP,
    check_pinned_maps,
    opened,
    pinned_layout_version,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CONFIG_KEY,
    CONFIG_VALUE,
    LAYOUT_VERSION,
    MAP_SPEC_BY_NAME,
    PORT_KEY,
    WEIGHT_VALUE,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_route_entries,
)

_BPFTOOL_FALLBACKS = ("/usr/sbin/bpftool", "/usr/local/sbin/bpftool", "/sbin/bpftool")


def run_command(argv):
    """Run argv with LANG=C; return (rc, stdout, stderr). The default command runner."""
    env = dict(os.environ, LANG="C", LC_ALL="C")
    proc = subprocess.run(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=False
    )
    return (
        proc.returncode,
        proc.stdout.decode("utf-8", "replace"),
        proc.stderr.decode("utf-8", "replace"),
    )


def find_bpftool():
    found = shutil.which("bpftool")
    if found:
        return found
    for path in _BPFTOOL_FALLBACKS:
        if os.access(path, os.X_OK):
            return path
    raise FleetError(
        "bpftool was not found in PATH or %s; install the bpftool package"
        % ", ".join(_BPFTOOL_FALLBACKS),
        {"tool": "bpftool"},
    )


def load_program(object_path, prog_pin, layout, reuse_maps, runner=None, seeds=None):
    """Load object_path as an sk_lookup program pinned at prog_pin.

    With reuse_maps the program uses the maps already pinned under layout.maps_dir
    (routes, sockets, counters and the node's seeds survive), after each was checked
    against its spec and the maps a newer layout adds were made; without, its new maps
    get pinned there and the node gets its own seeds (seeds: these instead, kept on
    purpose from before a deep rollback).
    """
    argv = [find_bpftool(), "prog", "load", object_path, prog_pin, "type", "sk_lookup"]
    if reuse_maps:
        check_pinned_maps(layout)
        add_maps_of_newer_layout(layout)
        for name in MAP_NAMES:
            argv += ["map", "name", name, "pinned", layout.map(name)]
    else:
        argv += ["pinmaps", layout.maps_dir]
    rc, out, err = (runner or run_command)(argv)
    if rc != 0:
        tail = " ".join(err.strip().splitlines()[-3:])
        raise FleetError(
            "bpftool could not load %s: %s" % (object_path, tail or "exit status %d" % rc),
            {"cmd": argv, "rc": rc, "stdout": out, "stderr": err},
        )
    if not reuse_maps:
        # Not attached yet: no connection is decided before the seeds are there.
        write_new_seeds(layout, seeds)


def write_new_seeds(layout, seeds=None):
    """Give the node its own random seeds (or seeds) and record the layout in zl_config."""
    seed_weight, seed_slot = seeds or struct.unpack("=QQ", os.urandom(16))
    with opened(layout.map(CONFIG_MAP)) as fd:
        bpf_syscall.map_update(
            fd,
            CONFIG_KEY.pack(0),
            CONFIG_VALUE.pack(LAYOUT_VERSION, 0, seed_weight, seed_slot),
        )


def pin_new_map(spec, path):
    """Create an empty map as spec (route_codec.MapSpec) describes it and pin it at path."""
    fd = bpf_syscall.map_create(
        spec.map_type, spec.key_size, spec.value_size, spec.max_entries, spec.name, spec.map_flags
    )
    try:
        bpf_syscall.obj_pin(fd, path)
    finally:
        os.close(fd)


def add_maps_of_newer_layout(layout):
    """Upgrade pins of an older layout in place: create and pin the maps it lacks.

    Routes, sockets and counters stay where they are; the old program keeps running on
    them until the link swaps to the new one. Pins of layout 1 get the node's own seeds
    here, so the paths of new connections are drawn once more at that upgrade (never again
    after); pins of layout 2 or 3 keep theirs (every tuple keeps its path) and zl_config
    records the new layout. The cohort maps and zl_clients start empty, no weight word has its
    opt-in bit and no route its hash-by-client flag: every route keeps hashing by connection.
    """
    version = pinned_layout_version(layout)
    if version is None or version == LAYOUT_VERSION:
        return []
    added = []
    for name in MAP_NAMES:
        path = layout.map(name)
        if os.path.exists(path):
            continue
        pin_new_map(MAP_SPEC_BY_NAME[name], path)
        added.append(name)
    write_new_seeds(layout, _pinned_seeds(layout) if version >= 2 else None)
    if WEIGHTS_MAP in added:
        copy_legacy_weights(layout)
    return added


def _pinned_seeds(layout):
    """(seed_weight, seed_slot) as zl_config holds them."""
    with opened(layout.map(CONFIG_MAP), read_only=True) as fd:
        raw = bpf_syscall.map_lookup(fd, CONFIG_KEY.pack(0), CONFIG_VALUE.size)
    return CONFIG_VALUE.unpack(raw)[2:]


def copy_legacy_weights(layout):
    """Layout 1 kept each weight in the route's entry: carry them into zl_weights.

    The old program reads the entries until the link swaps to the new one, which reads
    zl_weights: both see the same weights throughout.
    """
    with opened(layout.map(WEIGHTS_MAP)) as fd:
        for route in read_route_entries(layout):
            bpf_syscall.map_update(
                fd, PORT_KEY.pack(route.route_index), WEIGHT_VALUE.pack(route.weight_bp)
            )
