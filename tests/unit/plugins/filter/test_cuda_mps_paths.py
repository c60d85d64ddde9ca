"""cuda_mps_volatile_reason: pipe and log directories must survive a reboot."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.filter.nvidia import cuda_mps_volatile_reason

# A /proc/mounts of a GPU node: root on ext4, a data disk, and several tmpfs mounts.
MOUNTS = """\
/dev/nvme0n1p2 / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid,nodev,noexec,relatime 0 0
tmpfs /run tmpfs rw,nosuid,nodev,size=3273100k,mode=755 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
/dev/nvme1n1 /var/lib/zerolayer xfs rw,relatime 0 0
tmpfs /var/lib/zerolayer/scratch tmpfs rw,size=1g 0 0
/dev/nvme2n1 /srv/with\\040space ext4 rw 0 0
tmpfs /srv/ram tmpfs rw 0 0
"""


@pytest.mark.parametrize(
    "path",
    [
        "/var/lib/zerolayer/mps",
        "/var/lib/zerolayer/mps/engine-a/pipe",
        "/opt/mps",
        "/srv/with space/mps",
        "/var/lib/zerolayer/scratchy",
    ],
)
def test_persistent_paths_are_accepted(path):
    assert cuda_mps_volatile_reason(path, MOUNTS) == ""


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("/tmp/mps", "/tmp/mps is under /tmp"),
        ("/var/tmp/mps", "/var/tmp/mps is under /var/tmp"),
        ("/run/zerolayer/mps", "/run/zerolayer/mps is under /run"),
        ("/var/run/mps", "/var/run/mps is under /var/run"),
        ("/dev/shm/mps", "/dev/shm/mps is under /dev"),
        ("/var/lib/zerolayer/scratch/mps", "is on a tmpfs mount at /var/lib/zerolayer/scratch"),
        ("/srv/ram", "/srv/ram is on a tmpfs mount at /srv/ram"),
    ],
)
def test_volatile_paths_are_refused(path, reason):
    assert reason in cuda_mps_volatile_reason(path, MOUNTS)


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("var/lib/mps", "is not an absolute path"),
        ("/var/lib/../tmp/mps", "is not a normalized path"),
        ("/var//lib/mps", "is not a normalized path"),
        (None, "is not an absolute path"),
    ],
)
def test_malformed_paths_are_refused(path, reason):
    assert reason in cuda_mps_volatile_reason(path, MOUNTS)


def test_tmp_prefix_is_matched_by_path_component():
    assert cuda_mps_volatile_reason("/tmpdata/mps", MOUNTS) == ""
