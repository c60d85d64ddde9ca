"""The refusing node: no GPU (failed, then skipped), bad input, Secure Boot on without
signing keys, signing keys that do not exist. None of it may leave a trace."""

from nvd_state import ROLE_FILES, nvidia_packages

testinfra_hosts = ["podman://zl-gpu-nvd-refuse"]


def test_no_file_of_the_role(host):
    assert [path for path in ROLE_FILES if host.file(path).exists] == []
    assert not host.file("/etc/systemd/system/nvidia-persistenced.service.d").exists
    assert not host.file("/etc/dkms").exists


def test_no_nvidia_package(host):
    assert nvidia_packages(host) == {}


def test_initramfs_never_rebuilt(host):
    assert not host.file("/var/log/zerolayer-test-doubles/update-initramfs.log").exists


def test_node_really_has_no_nvidia_pci_function(host):
    # The no-GPU refusal is only meaningful if the node indeed has no NVIDIA device.
    vendors = host.check_output("cat /sys/bus/pci/devices/*/vendor").split()
    assert vendors, "no PCI function visible: detection would not have been exercised"
    assert "0x10de" not in vendors
    assert not host.file("/proc/driver/nvidia/gpus").exists


def test_the_refusals_had_secure_boot_on_in_the_test_double(host):
    # The Secure Boot refusal read this TEST DOUBLE of the EFI variable (prepare.yml).
    variable = (
        "/var/lib/zerolayer-test-doubles/root-gpu-secure-boot/sys/firmware/efi/efivars/"
        "SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
    )
    assert host.check_output("od -An -tu1 %s" % variable).split() == ["6", "0", "0", "0", "1"]
