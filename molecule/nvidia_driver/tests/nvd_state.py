"""What the nvidia_driver role writes, and how the tests read a node's NVIDIA packages.

The scenario's nodes are local podman containers: testinfra reaches them with `podman exec`.
"""

FIRST = "550.127.05"
NEXT = "550.144.03"
DRIVER_PACKAGES = [
    "nvidia-kernel-open-dkms",
    "firmware-nvidia-gsp",
    "nvidia-smi",
    "libcuda1",
    "nvidia-persistenced",
]
FABRICMANAGER_PACKAGES = ["nvidia-fabricmanager-550", "libnvidia-nscq-550"]
PIN_FILE = "/etc/apt/preferences.d/zerolayer-nvidia-driver"
SOURCES_FILE = "/etc/apt/sources.list.d/nvidia-cuda.sources"
KEY_FILE = "/etc/apt/keyrings/zerolayer-nvidia-cuda.asc"
OPTIONS_FILE = "/etc/modprobe.d/nvidia-zerolayer.conf"
BLACKLIST_FILE = "/etc/modprobe.d/zerolayer-blacklist-nouveau.conf"
SIGNING_FILE = "/etc/dkms/framework.conf.d/zerolayer-nvidia-signing.conf"
DROPIN_FILE = "/etc/systemd/system/nvidia-persistenced.service.d/zerolayer-persistence-mode.conf"
ROLE_FILES = [
    PIN_FILE,
    SOURCES_FILE,
    KEY_FILE,
    OPTIONS_FILE,
    BLACKLIST_FILE,
    SIGNING_FILE,
    DROPIN_FILE,
]


def nvidia_packages(host):
    """{package: version} of the installed (or config-files-only) NVIDIA packages."""
    lines = host.check_output(
        "dpkg-query -W -f '${db:Status-Abbrev}|${Package}|${Version}\\n'"
    ).splitlines()
    assert lines, "dpkg-query listed no package at all"
    packages = {}
    for line in lines:
        status, name, version = line.split("|")
        if status.strip() in ("", "un") or not ("nvidia" in name or name.startswith("libcuda")):
            continue
        packages[name] = (status.strip(), version)
    return packages
