"""Verify that nvidia_driver changed nothing on a node without an NVIDIA GPU.

The converge ran the role twice (refused, then skipped) and with bad input; none of
them may leave a trace on the node.
"""

import pytest


@pytest.mark.parametrize(
    "path",
    [
        "/etc/modprobe.d/zerolayer-blacklist-nouveau.conf",
        "/etc/apt/preferences.d/zerolayer-nvidia-driver",
        "/etc/apt/sources.list.d/nvidia-cuda.sources",
        "/usr/bin/nvidia-smi",
    ],
)
def test_nothing_installed(host, path):
    assert not host.file(path).exists


def test_no_nvidia_package(host):
    installed = host.check_output("dpkg-query -W -f '${Package}\\n'").splitlines()
    assert installed, "dpkg-query listed no package at all"
    assert [name for name in installed if "nvidia" in name or name.startswith("libcuda")] == []


def test_node_really_has_no_nvidia_pci_function(host):
    # The refusal is only meaningful if the node indeed has no NVIDIA device.
    vendors = host.check_output("cat /sys/bus/pci/devices/*/vendor").split()
    assert vendors, "no PCI function visible: detection would not have been exercised"
    assert "0x10de" not in vendors
    assert not host.file("/proc/driver/nvidia/gpus").exists
