"""The install node after converge (550.127.05), idempotence, and side_effect (the lock held
against apt-get upgrade and a branch-only run, then an explicit move to 550.144.03)."""

from nvd_state import (
    BLACKLIST_FILE,
    DRIVER_PACKAGES,
    DROPIN_FILE,
    FABRICMANAGER_PACKAGES,
    KEY_FILE,
    NEXT,
    OPTIONS_FILE,
    PIN_FILE,
    SIGNING_FILE,
    SOURCES_FILE,
    nvidia_packages,
)

testinfra_hosts = ["podman://zl-gpu-nvd-install"]


def test_driver_and_fabric_manager_run_the_same_exact_version(host):
    packages = nvidia_packages(host)
    expected = {name: ("ii", NEXT + "-1") for name in DRIVER_PACKAGES + FABRICMANAGER_PACKAGES}
    assert packages == expected


def test_apt_pin_holds_the_installed_version(host):
    pin = host.file(PIN_FILE)
    assert pin.mode == 0o644
    expected = "Package: *nvidia* libcuda* libnvidia-*\nPin: version %s-*\nPin-Priority: 1001\n"
    assert expected % NEXT in pin.content_string


def test_apt_would_install_nothing_else(host):
    # The lock is what apt itself applies: no NVIDIA package is upgradable past the pin.
    simulation = host.check_output("LANG=C apt-get -s -o Debug::NoLocking=1 upgrade")
    assert "Inst " not in simulation, simulation
    policy = host.check_output("LANG=C apt-cache policy libcuda1")
    assert "Candidate: %s-1" % NEXT in policy


def test_repository_and_key_point_at_the_test_double_mirror(host):
    sources = host.file(SOURCES_FILE).content_string
    assert "URIs: file:///srv/zerolayer-test-doubles/cuda-repos/debian12/x86_64/\n" in sources
    assert "Suites: /\n" in sources
    assert "Signed-By: %s\n" % KEY_FILE in sources
    assert host.file(KEY_FILE).content_string.startswith("-----BEGIN PGP PUBLIC KEY BLOCK-----")


def test_module_parameters_rendered_sorted(host):
    options = host.file(OPTIONS_FILE)
    assert options.mode == 0o644
    lines = [line for line in options.content_string.splitlines() if not line.startswith("#")]
    assert lines == [
        "options nvidia NVreg_EnableStreamMemOPs=1 NVreg_RegistryDwords=RMNvLinkDisable=0",
        "options nvidia_uvm uvm_perf_prefetch_enable=0",
    ]


def test_nouveau_blacklisted_and_initramfs_rebuilt(host):
    assert "blacklist nouveau\n" in host.file(BLACKLIST_FILE).content_string
    # The TEST DOUBLE of update-initramfs records each call of the role's handler.
    log = host.file("/var/log/zerolayer-test-doubles/update-initramfs.log").content_string
    assert log.splitlines()[0] == "update-initramfs -u"


def test_dkms_signs_with_the_mok_key_pair(host):
    signing = host.file(SIGNING_FILE).content_string
    assert 'mok_signing_key="/var/lib/zerolayer-test-doubles/mok/MOK.priv"\n' in signing
    assert 'mok_certificate="/var/lib/zerolayer-test-doubles/mok/MOK.der"\n' in signing


def test_persistenced_runs_with_persistence_mode(host):
    assert "ExecStart=\nExecStart=/usr/bin/nvidia-persistenced --user root --persistence-mode" in (
        host.file(DROPIN_FILE).content_string
    )
    service = host.service("nvidia-persistenced")
    assert service.is_enabled
    assert service.is_running
    pid = host.file("/run/nvidia-persistenced/nvidia-persistenced.pid").content_string.strip()
    arguments = host.file("/proc/%s/cmdline" % pid).content_string.split("\0")
    assert "--persistence-mode" in arguments
    assert "--no-persistence-mode" not in arguments


def test_nvidia_smi_double_reports_the_driver_and_persistence_mode(host):
    assert host.check_output("nvidia-smi --query-gpu=driver_version --format=csv,noheader") == NEXT
    assert (
        host.check_output("nvidia-smi --query-gpu=index,persistence_mode --format=csv,noheader")
        == "0, Enabled"
    )


def test_fabric_manager_runs(host):
    service = host.service("nvidia-fabricmanager")
    assert service.is_enabled
    assert service.is_running
