"""TEST DOUBLE of nvidia-persistenced, shipped in the test-double nvidia-persistenced
package of the nvidia_driver scenario's local apt repository.

Not NVIDIA's daemon: it keeps no GPU state. It runs in the foreground under systemd, keeps
its command line (the nvidia-smi double reads --persistence-mode from it) and writes the
pid file where the real daemon writes its own.
"""

import os
import signal
import sys

PID_FILE = "/run/nvidia-persistenced/nvidia-persistenced.pid"


def main():
    os.makedirs(os.path.dirname(PID_FILE), exist_ok=True)
    with open(PID_FILE, "w", encoding="ascii") as handle:
        handle.write("%d\n" % os.getpid())
    print("nvidia-persistenced TEST DOUBLE started with %s" % " ".join(sys.argv[1:]), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    while True:
        signal.pause()


if __name__ == "__main__":
    main()
