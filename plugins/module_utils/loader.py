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
import subprocess

from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import MAP_NAMES

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


def load_program(object_path, prog_pin, layout, reuse_maps, runner=None):
    """Load object_path as an sk_lookup program pinned at prog_pin.

    With reuse_maps the program uses the maps already pinned under layout.maps_dir
    (routes, sockets and counters survive); without, its new maps get pinned there.
    """
    argv = [find_bpftool(), "prog", "load", object_path, prog_pin, "type", "sk_lookup"]
    if reuse_maps:
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
