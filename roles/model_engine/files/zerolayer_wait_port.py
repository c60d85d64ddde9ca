"""Start gate for engine units: return once the engine accepts TCP connections.

An engine that loads a model may take minutes before it listens; the unit stays
"activating" until then, so whatever runs after it (the router registration) finds a
listening socket. systemd's TimeoutStartSec bounds the wait.
"""

import socket
import sys
import time


def main(argv):
    if len(argv) not in (2, 3):
        sys.stderr.write("usage: zerolayer_wait_port.py PORT [HOST]\n")
        return 2
    port = int(argv[1])
    host = argv[2] if len(argv) == 3 else "127.0.0.1"
    while True:
        try:
            socket.create_connection((host, port), timeout=2).close()
            return 0
        except OSError:
            time.sleep(1)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
