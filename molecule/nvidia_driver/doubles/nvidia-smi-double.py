"""TEST DOUBLE of nvidia-smi, shipped in the test-double nvidia-smi package of the
nvidia_driver scenario's local apt repository (build_test_double_repo.py).

Not NVIDIA's program. It answers the two queries the nvidia_driver role makes, for the one
GPU the scenario's test-double sysfs holds, as if the node had rebooted into the driver
version it was packaged with (DRIVER_VERSION, filled in when the package is built):
  --query-gpu=driver_version --format=csv,noheader
  --query-gpu=index,persistence_mode --format=csv,noheader
Persistence mode is "Enabled" only while the nvidia-persistenced test double runs with
--persistence-mode, read from its pid file and /proc, as the real daemon sets it.
"""

import sys

DRIVER_VERSION = "@DRIVER_VERSION@"
PID_FILE = "/run/nvidia-persistenced/nvidia-persistenced.pid"


def persistence_mode():
    try:
        with open(PID_FILE, encoding="ascii") as handle:
            pid = int(handle.read().strip())
        with open("/proc/%d/cmdline" % pid, "rb") as handle:
            arguments = handle.read().split(b"\0")
    except (OSError, ValueError):
        return "Disabled"
    return "Enabled" if b"--persistence-mode" in arguments else "Disabled"


def main(argv):
    if argv == ["--query-gpu=driver_version", "--format=csv,noheader"]:
        print(DRIVER_VERSION)
        return 0
    if argv == ["--query-gpu=index,persistence_mode", "--format=csv,noheader"]:
        print("0, %s" % persistence_mode())
        return 0
    print("nvidia-smi TEST DOUBLE: unsupported arguments %r" % (argv,), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
