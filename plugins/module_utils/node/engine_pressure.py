# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Memory pressure of the engines' slices: the kernel's PSI, as the route exporter exports it.

The model_engine role runs engine NAME in the slice zerolayer-engine-NAME.slice, and systemd
nests a slice under the slices its dashes name: every engine slice is a child of
zerolayer.slice/zerolayer-engine.slice in systemd's cgroup tree, and nothing else is. The
engines are therefore found by listing that directory, not by asking systemd: the exporter
runs without AF_UNIX and cannot see other users' processes, and a listing is one read.

systemd's tree starts at the cgroup systemd runs in, which is / on a host and the
container's own cgroup inside a container without a cgroup namespace. The exporter is a
systemd service itself, so that root is its own cgroup less its unit and the slices above
it (/proc/self/cgroup, the unified "0::" line). The PSI files live on the cgroup2 mount:
/sys/fs/cgroup on a unified host, /sys/fs/cgroup/unified on a hybrid one.

parse_pressure() is pure; read_engines() never raises: an engine whose file cannot be read
or understood is returned with an error, and a node where the tree cannot be found at all
gives no engine and one error, so the router's own metrics are always served.
"""

from __future__ import annotations

import math
import os
import re

ENGINES_SLICE = ("zerolayer.slice", "zerolayer-engine.slice")
ENGINE_SLICE = re.compile(r"^zerolayer-engine-(.+)\.slice$")
# Where cgroup2 is mounted: unified hosts first, then hybrid ones (v1 controllers beside it).
CGROUP2_MOUNTS = ("/sys/fs/cgroup", "/sys/fs/cgroup/unified")
OWN_CGROUP = "/proc/self/cgroup"
PRESSURE_FILE = "memory.pressure"
# "some": at least one task of the group waited for memory; "full": all of them did at once.
# Kernels before 5.13 may leave "full" out of some pressure files: only "some" is required.
KINDS = ("some", "full")
PERCENT = 100.0
MICROSECONDS_PER_SECOND = 1e6


def parse_pressure(text, path=PRESSURE_FILE):
    """{kind: {"avg10": ratio 0..1, "total": seconds}} of a PSI file's text.

    A line reads `some avg10=1.39 avg60=0.38 avg300=0.08 total=331037`: the averages are
    percentages of wall time, total is microseconds of stall since the group was created.
    Lines of a kind this code does not know are skipped. ValueError, naming the path and
    the line, when "some" is missing or a line lacks avg10 or total or holds a bad number.
    """
    found = {}
    for line in text.splitlines():
        fields = line.split()
        if not fields or fields[0] not in KINDS:
            continue
        values = dict(field.split("=", 1) for field in fields[1:] if "=" in field)
        try:
            avg10 = float(values["avg10"])
            total = int(values["total"])
        except (KeyError, ValueError):
            raise ValueError(
                "%s: %r has no avg10=<percent> and total=<microseconds>" % (path, line)
            ) from None
        if not math.isfinite(avg10) or not 0 <= avg10 <= PERCENT or total < 0:
            raise ValueError("%s: %r is out of range (avg10 0..100, total >= 0)" % (path, line))
        found[fields[0]] = {"avg10": avg10 / PERCENT, "total": total / MICROSECONDS_PER_SECOND}
    if "some" not in found:
        raise ValueError("%s has no 'some' line: %r" % (path, text[:200]))
    return found


def systemd_root(own_cgroup_text):
    """The path of systemd's root cgroup from the /proc/self/cgroup text of a process that
    runs in a systemd unit: its unified ("0::") path less the unit and the slices above it.
    None when the text has no unified line (a v1-only host: no PSI per cgroup there)."""
    for line in own_cgroup_text.splitlines():
        if line.startswith("0::"):
            parts = [part for part in line[3:].strip().split("/") if part]
            break
    else:
        return None
    if parts:
        parts.pop()  # the unit (or scope) the process runs in
    while parts and parts[-1].endswith(".slice"):
        parts.pop()
    return "/" + "/".join(parts)


def cgroup2_mount(mounts=CGROUP2_MOUNTS):
    """The first of mounts that is a cgroup2 root (it holds cgroup.controllers), or None."""
    for mount in mounts:
        if os.path.exists(os.path.join(mount, "cgroup.controllers")):
            return mount
    return None


def engines_dir(mounts=CGROUP2_MOUNTS, own_cgroup=OWN_CGROUP):
    """(directory holding the engine slices, None) or (None, why it cannot be found)."""
    mount = cgroup2_mount(mounts)
    if mount is None:
        return None, "no cgroup2 hierarchy at %s (a v1-only host has no PSI per cgroup)" % (
            " or ".join(mounts)
        )
    try:
        with open(own_cgroup) as handle:
            root = systemd_root(handle.read())
    except OSError as exc:
        return None, "cannot read %s: %s" % (own_cgroup, exc.strerror)
    if root is None:
        return None, "%s has no unified (0::) line" % own_cgroup
    return os.path.join(mount, root.lstrip("/"), *ENGINES_SLICE), None


def read_engine(directory, name):
    """{engine, pressure} of one engine slice, {engine, error} when its file cannot be read
    or understood, or None when the slice went away while it was read (engine stopped)."""
    path = os.path.join(directory, PRESSURE_FILE)
    try:
        with open(path) as handle:
            text = handle.read()
        return {"engine": name, "pressure": parse_pressure(text, path)}
    except FileNotFoundError:
        if not os.path.isdir(directory):
            return None
        # The slice is there without the file: PSI is off (psi=0, or a kernel without it).
        return {"engine": name, "error": "%s does not exist (PSI off in this kernel?)" % path}
    except OSError as exc:
        # EOPNOTSUPP: PSI switched off for this group (cgroup.pressure 0).
        return {"engine": name, "error": "cannot read %s: %s" % (path, exc.strerror)}
    except (ValueError, UnicodeDecodeError) as exc:
        return {"engine": name, "error": str(exc)}


def read_engines(mounts=CGROUP2_MOUNTS, own_cgroup=OWN_CGROUP):
    """{"engines": [read_engine(), ...] sorted by name, "error": why or None}.

    No engine slice (no engine runs on the node, or the model_engine role is not used)
    is no error: the list is empty. "error" joins the reasons of every engine that could
    not be read, and says so when the tree itself cannot be found.
    """
    directory, error = engines_dir(mounts, own_cgroup)
    if directory is None:
        return {"engines": [], "error": error}
    try:
        entries = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {"engines": [], "error": None}
    except OSError as exc:
        return {"engines": [], "error": "cannot list %s: %s" % (directory, exc.strerror)}
    engines = []
    for entry in entries:
        match = ENGINE_SLICE.match(entry)
        if match is None:
            continue
        engine = read_engine(os.path.join(directory, entry), match.group(1))
        if engine is not None:
            engines.append(engine)
    errors = [engine["error"] for engine in engines if "error" in engine]
    return {"engines": engines, "error": "; ".join(errors) or None}
