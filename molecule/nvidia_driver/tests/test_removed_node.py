"""The removal node: converge installed the newest release of branch 550 with fabric
manager, side_effect ran the role with nvidia_driver_state: absent."""

from nvd_state import ROLE_FILES, nvidia_packages

testinfra_hosts = ["podman://zl-gpu-nvd-remove"]


def test_no_nvidia_package_left_not_even_config_files(host):
    assert nvidia_packages(host) == {}


def test_no_file_of_the_role_left(host):
    assert [path for path in ROLE_FILES if host.file(path).exists] == []


def test_units_and_daemons_gone(host):
    assert not host.service("nvidia-persistenced").is_running
    assert not host.service("nvidia-fabricmanager").is_running
    assert not host.file("/usr/bin/nvidia-smi").exists


def test_removal_kept_the_kernel_headers(host):
    # Other DKMS modules build against them: state=absent leaves them.
    kernel = host.check_output("uname -r")
    assert host.package("linux-headers-" + kernel).is_installed
