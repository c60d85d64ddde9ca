"""Route decision cost beside the traffic bench: the kernel's floor and BPF_PROG_TEST_RUN.

- The floor: bench/bpf/sk_lookup_pass.bpf.c, an sk_lookup program that only returns
  SK_PASS, attached in a netns of its own and driven by the same traffic. Its
  run_time_ns / run_cnt is what the kernel's accounting and the call into any
  sk_lookup program cost; the router's mean includes it.
- Test runs: the router's program run in a loop by BPF_PROG_TEST_RUN on one
  made-up connection (hot caches, no traffic, run-time statistics off), for a
  connection whose decision is timed into the histogram and for one that is not.
"""

from __future__ import annotations

import os
import socket
import statistics
import struct

import lab
from ansible_collections.zerolayer.fleet.plugins.module_utils import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.loader import find_bpftool
from ansible_collections.zerolayer.fleet.plugins.module_utils.metrics import read_latency_buckets
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import opened
from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import set_route

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PASS_SOURCE = os.path.join(BENCH_DIR, "bpf", "sk_lookup_pass.bpf.c")
TEST_RUN_REPEAT = 200000
TEST_RUN_SAMPLES = 7


def build_pass_program(workdir):
    """Compile the floor program with the flags files/bpf/Makefile uses."""
    out = os.path.join(workdir, "sk_lookup_pass.bpf.o")
    multiarch = "/usr/include/%s-linux-gnu" % os.uname().machine
    lab.run(
        [
            "clang",
            "-O2",
            "-g",
            "-target",
            "bpf",
            "-Wall",
            "-Werror",
            "-I",
            multiarch,
            "-c",
            PASS_SOURCE,
            "-o",
            out,
        ]
    )
    return out


def attach_pass_program(stack, netns, object_path, bpffs):
    """Load the floor program, link it to netns; returns its pin (all undone by stack)."""
    pin = os.path.join(bpffs, "floor-" + netns.name)
    lab.run([find_bpftool(), "prog", "load", object_path, pin, "type", "sk_lookup"])
    stack.callback(os.unlink, pin)
    prog_fd = bpf_syscall.obj_get(pin)
    stack.callback(os.close, prog_fd)
    netns_fd = os.open(netns.path, os.O_RDONLY)
    try:
        link_fd = bpf_syscall.link_create(prog_fd, netns_fd, bpf_syscall.BPF_SK_LOOKUP)
    finally:
        os.close(netns_fd)
    # Closing the only link fd detaches the program (the link is not pinned).
    stack.callback(os.close, link_fd)
    return pin


def program_stats(pin):
    with opened(pin) as prog_fd:
        info = bpf_syscall.prog_info(prog_fd)
    return {"run_cnt": info["run_cnt"], "run_time_ns": info["run_time_ns"]}


def loopback_ctx(remote_port, local_port):
    """struct bpf_sk_lookup of a TCP connection 127.0.0.1:remote_port -> 127.0.0.1:local_port."""
    ctx = bytearray(72)
    address = struct.unpack("=I", socket.inet_aton("127.0.0.1"))[0]
    struct.pack_into("=II", ctx, 8, socket.AF_INET, socket.IPPROTO_TCP)
    struct.pack_into("=I", ctx, 16, address)
    struct.pack_into("!H", ctx, 36, remote_port)
    struct.pack_into("=I", ctx, 40, address)
    struct.pack_into("=I", ctx, 60, local_port)
    return bytes(ctx)


def per_run_ns(pin, ctx):
    """Median over TEST_RUN_SAMPLES loops of TEST_RUN_REPEAT runs: ns per run."""
    with opened(pin) as prog_fd:
        return statistics.median(
            bpf_syscall.prog_test_run(prog_fd, ctx, repeat=TEST_RUN_REPEAT)[2]
            for _sample in range(TEST_RUN_SAMPLES)
        )


def timed_and_untimed_ctx(layout, local_port):
    """One connection whose decision the program times and one it does not, found by trial."""
    found = {}
    with opened(layout.prog) as prog_fd:
        for remote_port in range(40000, 42000):
            ctx = loopback_ctx(remote_port, local_port)
            before = sum(read_latency_buckets(layout))
            bpf_syscall.prog_test_run(prog_fd, ctx)
            found.setdefault(sum(read_latency_buckets(layout)) > before, ctx)
            if len(found) == 2:
                return found[True], found[False]
    raise RuntimeError("no timed decision among 2000 connections: is the histogram sampled?")


def test_run_costs(layout, route, local_port, pass_pin):
    """ns per run of the router at weight 100 and 0, timed and not, and of the floor program."""
    timed, untimed = timed_and_untimed_ctx(layout, local_port)
    rows = []
    for weight in (100, 0):
        set_route(layout, route, weight=weight)
        for label, ctx in (("not timed", untimed), ("timed", timed)):
            rows.append(
                {
                    "program": "router, weight %d" % weight,
                    "decision": label,
                    "ns_per_run": per_run_ns(layout.prog, ctx),
                }
            )
    rows.append(
        {
            "program": "only returns SK_PASS",
            "decision": "-",
            "ns_per_run": per_run_ns(pass_pin, loopback_ctx(40000, local_port)),
        }
    )
    return {"repeat": TEST_RUN_REPEAT, "samples": TEST_RUN_SAMPLES, "rows": rows}
