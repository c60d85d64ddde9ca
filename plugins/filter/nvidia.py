# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Filters that read NVIDIA tool output and sysfs for the GPU roles."""

from __future__ import annotations

import csv
import io
import posixpath

from ansible.errors import AnsibleFilterError

DOCUMENTATION = r"""
name: nvidia
short_description: Read nvidia-smi output, PCI device lists and mount tables for the GPU roles
version_added: 0.1.0
description:
  - C(nvidia_smi_csv) turns C(nvidia-smi --query-gpu=... --format=csv,noheader) output
    into a list of dicts.
  - C(nvidia_driver_check) compares the driver versions C(nvidia-smi) reports with the
    pinned branch or version.
  - C(nvidia_pci_devices) classifies the NVIDIA PCI functions found in sysfs as GPUs or
    NVSwitches.
  - C(cuda_mps_volatile_reason) says why a directory would not survive a reboot (tmpfs and
    the like), or returns an empty string.
positional: _input
options:
  _input:
    description:
      - For C(nvidia_smi_csv), the command's stdout.
      - For C(nvidia_driver_check), a registered command result with C(rc), C(stdout) and C(stderr).
      - For C(nvidia_pci_devices), the output of
        C(grep -H "" /sys/bus/pci/devices/*/{vendor,device,class}).
      - For C(cuda_mps_volatile_reason), an absolute directory path.
    type: raw
    required: true
  fields:
    description: For C(nvidia_smi_csv), the field names given to C(--query-gpu), in order.
    type: list
    elements: str
  branch:
    description: For C(nvidia_driver_check), the pinned driver branch, for example C(550).
    type: str
  version:
    description:
      - For C(nvidia_driver_check), the pinned full driver version.
      - An empty string accepts any version of I(branch).
    type: str
  nvswitch_ids:
    description:
      - For C(nvidia_pci_devices), extra PCI device ids (four hex digits) to treat as NVSwitches.
    type: list
    elements: str
  mounts:
    description: For C(cuda_mps_volatile_reason), the text of C(/proc/mounts).
    type: str
"""

EXAMPLES = r"""
- name: Parse the driver version of every GPU
  ansible.builtin.set_fact:
    gpus: "{{ smi.stdout | zerolayer.fleet.nvidia_smi_csv(['index', 'driver_version']) }}"

- name: Fail unless every GPU runs the pinned driver
  vars:
    check: "{{ smi | zerolayer.fleet.nvidia_driver_check('550', '550.127.05') }}"
  ansible.builtin.assert:
    that: check.ok
    fail_msg: "{{ check.message }}"

- name: Classify NVIDIA PCI functions
  ansible.builtin.set_fact:
    nvidia_devices: "{{ sysfs.stdout | zerolayer.fleet.nvidia_pci_devices }}"

- name: Refuse a pipe directory on tmpfs
  vars:
    reason: >-
      {{ '/var/lib/zerolayer/mps/a/pipe' | zerolayer.fleet.cuda_mps_volatile_reason(mounts_text) }}
  ansible.builtin.assert:
    that: reason | length == 0
    fail_msg: "{{ reason }}"
"""

RETURN = r"""
_value:
  description:
    - C(nvidia_smi_csv) returns a list of dicts keyed by I(fields); C([N/A]) and
      C([Not Supported]) become null.
    - C(nvidia_driver_check) returns a dict with C(ok) (bool), C(found) (list of versions),
      C(expected) (str) and C(message) (str).
    - C(nvidia_pci_devices) returns a list of dicts with C(address), C(device_id), C(class),
      C(kind) (C(gpu), C(nvswitch) or C(other)) and C(open_modules_supported) (bool, GPUs
      only; Turing and newer).
    - C(cuda_mps_volatile_reason) returns a string, empty when the path is on persistent storage.
  type: raw
"""

NVIDIA_VENDOR_ID = "10de"

# PCI class codes (class + subclass) of NVIDIA functions that run CUDA work.
GPU_CLASSES = ("0300", "0302")

# NVSwitch functions carry class 0680 ("other bridge"); the ids below are the
# NVSwitch generations of DGX-2/HGX-2, HGX A100 and HGX H100 boards.
BRIDGE_CLASS = "0680"
KNOWN_NVSWITCH_IDS = frozenset(
    ("1ac0", "1ac1", "1ac2", "1af0", "1af1", "1af2", "22a1", "22a2", "22a3", "22a4")
)

# The open kernel modules need Turing or newer. Turing device ids start at
# 0x1e00; every Volta, Pascal and Maxwell id is below it.
FIRST_TURING_DEVICE_ID = 0x1E00

NOT_A_VALUE = ("[N/A]", "[Not Supported]", "N/A", "")

# Directories that do not survive a reboot or are cleaned by the system.
VOLATILE_PREFIXES = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev")  # noqa: S108 - refused, not used
VOLATILE_FSTYPES = frozenset(("tmpfs", "ramfs", "devtmpfs"))


def nvidia_smi_csv(stdout, fields):
    """Parse `nvidia-smi --query-*=... --format=csv,noheader` output."""
    if not isinstance(fields, (list, tuple)) or not fields:
        raise AnsibleFilterError("nvidia_smi_csv: fields must be a non-empty list of field names")
    rows = []
    for line_number, row in enumerate(csv.reader(io.StringIO(stdout or "")), start=1):
        values = [value.strip() for value in row]
        if not any(values):
            continue
        if len(values) != len(fields):
            raise AnsibleFilterError(
                "nvidia_smi_csv: line %d has %d values, expected %d (%s): %r"
                % (line_number, len(values), len(fields), ", ".join(fields), ",".join(row))
            )
        rows.append(
            {
                field: (None if value in NOT_A_VALUE else value)
                for field, value in zip(fields, values)
            }
        )
    return rows


def _is_version(text):
    parts = text.split(".")
    return len(parts) >= 2 and all(part.isdigit() for part in parts)


def nvidia_driver_check(result, branch, version=""):
    """Compare the driver versions nvidia-smi reported with the pinned branch/version."""
    if not isinstance(result, dict) or "rc" not in result:
        raise AnsibleFilterError(
            "nvidia_driver_check: input must be a registered result with rc, stdout, stderr"
        )
    branch = str(branch or "").strip()
    version = str(version or "").strip()
    if not branch.isdigit():
        raise AnsibleFilterError(
            "nvidia_driver_check: branch must be digits such as '550', got %r" % branch
        )
    expected = version or (branch + ".*")
    stdout = result.get("stdout") or ""
    stderr = result.get("stderr") or ""
    report = {"ok": False, "found": [], "expected": expected, "message": ""}

    if result["rc"] != 0:
        tool_says = (stdout.strip() + " " + stderr.strip()).strip()
        tool_says = tool_says or str(result.get("msg") or "no output")
        report["message"] = "nvidia-smi failed (rc=%s), expected driver %s: %s" % (
            result["rc"],
            expected,
            tool_says,
        )
        return report

    found = [line.strip() for line in stdout.splitlines() if line.strip()]
    report["found"] = found
    if not found:
        report["message"] = "nvidia-smi listed no GPU, expected driver %s on every GPU" % expected
        return report
    unreadable = [item for item in found if not _is_version(item)]
    if unreadable:
        report["message"] = "nvidia-smi printed %s where a driver version was expected (%s)" % (
            ", ".join(repr(item) for item in unreadable),
            expected,
        )
        return report

    if version:
        wrong = [item for item in found if item != version]
    else:
        wrong = [item for item in found if item.split(".")[0] != branch]
    if wrong:
        report["message"] = "driver version mismatch: expected %s, nvidia-smi reports %s" % (
            expected,
            ", ".join(sorted(set(found))),
        )
        return report

    report["ok"] = True
    report["message"] = "all %d GPU(s) run driver %s" % (len(found), ", ".join(sorted(set(found))))
    return report


def _hex_value(text):
    text = text.strip().lower()
    return text[2:] if text.startswith("0x") else text


def nvidia_pci_devices(grep_output, nvswitch_ids=None):
    """Classify NVIDIA PCI functions from `grep -H "" .../vendor .../device .../class`."""
    extra_ids = {_hex_value(item) for item in (nvswitch_ids or [])}
    functions = {}
    for line in (grep_output or "").splitlines():
        # The PCI address itself holds colons: split at the last "/name:" instead.
        attribute_path, sep, value = line.rpartition(":")
        if not sep:
            continue
        directory, attribute = posixpath.split(attribute_path)
        if attribute not in ("vendor", "device", "class"):
            continue
        functions.setdefault(directory, {})[attribute] = _hex_value(value)

    devices = []
    for directory in sorted(functions):
        attributes = functions[directory]
        if attributes.get("vendor") != NVIDIA_VENDOR_ID:
            continue
        device_id = attributes.get("device", "")
        pci_class = attributes.get("class", "")[:4]
        if pci_class in GPU_CLASSES:
            kind = "gpu"
        elif device_id in KNOWN_NVSWITCH_IDS or device_id in extra_ids or pci_class == BRIDGE_CLASS:
            kind = "nvswitch"
        else:
            kind = "other"
        try:
            open_modules = kind == "gpu" and int(device_id, 16) >= FIRST_TURING_DEVICE_ID
        except ValueError:
            open_modules = False
        devices.append(
            {
                "address": posixpath.basename(directory),
                "device_id": device_id,
                "class": pci_class,
                "kind": kind,
                "open_modules_supported": open_modules,
            }
        )
    return devices


def _unescape_mount_field(field):
    # /proc/mounts writes space, tab, newline and backslash as octal escapes.
    for escaped, plain in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(escaped, plain)
    return field


def _is_below(path, directory):
    return directory == "/" or path == directory or path.startswith(directory.rstrip("/") + "/")


def cuda_mps_volatile_reason(path, mounts):
    """Return why `path` is not on persistent storage, or '' when it is."""
    if not isinstance(path, str) or not path.startswith("/"):
        return "%r is not an absolute path" % (path,)
    normalized = posixpath.normpath(path)
    if normalized != path.rstrip("/") or "/../" in path + "/":
        return "%r is not a normalized path (use %r)" % (path, normalized)
    for prefix in VOLATILE_PREFIXES:
        if _is_below(normalized, prefix):
            return "%s is under %s, which does not survive a reboot or is cleaned by the system" % (
                normalized,
                prefix,
            )

    best_mount, best_fstype = "", ""
    for line in (mounts or "").splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        mount_point = _unescape_mount_field(fields[1])
        if _is_below(normalized, mount_point) and len(mount_point) >= len(best_mount):
            best_mount, best_fstype = mount_point, fields[2]
    if best_fstype in VOLATILE_FSTYPES:
        return "%s is on a %s mount at %s, which does not survive a reboot" % (
            normalized,
            best_fstype,
            best_mount,
        )
    return ""


class FilterModule:
    """Filters for the nvidia_driver and cuda_mps roles."""

    def filters(self):
        return {
            "nvidia_smi_csv": nvidia_smi_csv,
            "nvidia_driver_check": nvidia_driver_check,
            "nvidia_pci_devices": nvidia_pci_devices,
            "cuda_mps_volatile_reason": cuda_mps_volatile_reason,
        }
