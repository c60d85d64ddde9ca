"""One concurrent writer of a router, run as its own process by test_concurrent_writers.py.

    writer_storm.py KIND PIN_DIR FENCE_FILE STOP_FILE [ARG ...]

KIND set-weight ROUTE...     writes random weights (no epoch) to the routes
KIND register ROUTE PID PORT registers the engine's socket in slot 0 and 1 in turn
KIND attach OBJECT NETNS...  attaches each object in turn (a real program swap each time)
KIND hold-lock               takes the writer lock and keeps it until STOP_FILE exists

Runs until STOP_FILE exists (STOP_FILE.KIND.PID says it started, STOP_FILE.wrote.PID that a
first write went through); prints one JSON object: counts of what was done, refused by
the fence, and anything else that failed (with samples).
"""

import json
import os
import random
import sys
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(REPO, ".collections"))

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (  # noqa: E402
    engine_sockets,
    router_lifecycle,
    routes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (  # noqa: E402
    FenceRefused,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (  # noqa: E402
    PinLayout,
    writer_lock,
)


def one_write(kind, layout, args, turn):
    """The turn-th single write of this kind."""
    if kind == "set-weight":
        routes.set_route(layout, args[turn % len(args)], weight=random.randint(0, 100))
    elif kind == "register":
        route, pid, port = args[0], int(args[1]), int(args[2])
        engine_sockets.register_engine_socket(layout, route, pid, port, slot=turn % 2, timeout=5)
    elif kind == "attach":
        objects, netns = args[:-1], args[-1]
        router_lifecycle.attach(layout, objects[turn % len(objects)], netns)
    else:
        raise SystemExit("unknown kind %r" % kind)


def main():
    kind, pin_dir, fence_file, stop_file, *args = sys.argv[1:]
    layout = PinLayout(pin_dir, fence_file=fence_file)
    report = {"done": 0, "fenced": 0, "failed": 0, "samples": []}
    if kind == "hold-lock":
        with writer_lock(layout, "the hold-lock test writer"):
            open(stop_file + ".held", "w").close()
            while not os.path.exists(stop_file):
                time.sleep(0.01)
        print(json.dumps(report))
        return
    open(stop_file + "." + kind + ".%d" % os.getpid(), "w").close()
    turn = 0
    while not os.path.exists(stop_file):
        turn += 1
        try:
            one_write(kind, layout, args, turn)
            report["done"] += 1
            if report["done"] == 1:
                # The test raises the fence only once every writer got a write through.
                open(stop_file + ".wrote.%d" % os.getpid(), "w").close()
        except FenceRefused:
            report["fenced"] += 1
        except FleetError as exc:
            report["failed"] += 1
            if len(report["samples"]) < 5:
                report["samples"].append(exc.message)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
