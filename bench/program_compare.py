"""The router of map layout 1 and today's, side by side: ns per decision under BPF_PROG_TEST_RUN.

    sudo .venv/bin/python bench/program_compare.py [--rounds 7] [--repeat 200000]

Both programs are loaded at once on a private bpffs, each with route svc (port 8080) and
one engine socket of this process, and run in turns, round by round, on a connection
whose decision is not timed: whatever slows the machine slows both. Prints a Markdown
table of the median ns per run of each, at weight 100 and 0, and their ratio. Layout 1
is built from tests/dataplane/previous_release/ with today's Makefile.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import statistics

import decision_cost
import lab
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
    find_bpftool,
    load_program,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    PinLayout,
    ensure_pin_dirs,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route

BPF_DIR = os.path.join(lab.REPO, "files", "bpf")
PREVIOUS_RELEASE = os.path.join(lab.REPO, "tests", "dataplane", "previous_release")


def build(stack, workdir):
    """(layout 1 object, today's object), both compiled for this run."""
    makefile = os.path.join(BPF_DIR, "Makefile")
    previous = os.path.join(workdir, "router-layout1.bpf.o")
    current = os.path.join(workdir, "router.bpf.o")
    lab.run(["make", "-s", "-f", makefile, "-C", PREVIOUS_RELEASE, "OUT=" + previous])
    lab.run(["make", "-s", "-C", BPF_DIR, "OUT=" + current])
    return previous, current


def set_up(stack, bpffs, workdir, name, object_path, engine, layout_1):
    layout = PinLayout(
        os.path.join(bpffs, name), fence_file=os.path.join(workdir, name + "-fence.json")
    )
    ensure_pin_dirs(layout)
    stack.callback(router_lifecycle.remove, layout)
    if layout_1:
        # As the previous release loaded it: bpftool pins its four maps.
        argv = [find_bpftool(), "prog", "load", object_path, layout.prog, "type", "sk_lookup"]
        lab.run([*argv, "pinmaps", layout.maps_dir])
    else:
        load_program(object_path, layout.prog, layout, reuse_maps=False)
    set_route(layout, "svc", port=lab.SERVICE_PORT, weight=100)
    register_engine_socket(layout, "svc", os.getpid(), engine.getsockname()[1], timeout=5)
    _timed, untimed = decision_cost.timed_and_untimed_ctx(layout, lab.SERVICE_PORT)
    return layout, untimed


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=decision_cost.TEST_RUN_REPEAT)
    args = parser.parse_args(argv)
    decision_cost.TEST_RUN_REPEAT = args.repeat
    decision_cost.TEST_RUN_SAMPLES = 1  # one loop per turn; the rounds give the median
    with contextlib.ExitStack() as stack:
        workdir = lab.make_workdir(stack)
        bpffs = lab.mount_private_bpffs(stack, workdir)
        engine = stack.enter_context(socket.socket())
        engine.bind(("127.0.0.1", 0))
        engine.listen()
        previous, current = build(stack, workdir)
        programs = {
            "layout 1 (previous release)": set_up(
                stack, bpffs, workdir, "layout1", previous, engine, True
            ),
            "layout 2 (this version)": set_up(
                stack, bpffs, workdir, "layout2", current, engine, False
            ),
        }
        rows = []
        for weight in (100, 0):
            runs = {name: [] for name in programs}
            for program in programs.values():
                set_route(program[0], "svc", weight=weight)
            for _round in range(args.rounds):
                for name, (layout, ctx) in programs.items():
                    runs[name].append(decision_cost.per_run_ns(layout.prog, ctx))
            rows.append((weight, {name: statistics.median(ns) for name, ns in runs.items()}))
    names = list(programs)
    print(
        "BPF_PROG_TEST_RUN, %d rounds of %d runs each, taken in turns; median ns per run of"
        % (args.rounds, args.repeat)
    )
    print("an untimed decision with one engine socket.\n")
    print("| Weight | %s | %s | ratio |" % tuple(names))
    print("| ---: | ---: | ---: | ---: |")
    for weight, medians in rows:
        old, new = medians[names[0]], medians[names[1]]
        print("| %d %% | %d | %d | %.3f |" % (weight, old, new, new / old))
    print("\nload average (1/5/15 min): %s" % lab.loadavg())


if __name__ == "__main__":
    main()
