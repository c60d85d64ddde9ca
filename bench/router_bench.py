#!/usr/bin/env python3
"""Data-plane bench: engine direct vs. routed by the sk_lookup program vs. the nginx proxy hop.

Three cases, each in its own fresh network namespace with real nginx (one worker):
  a  wrk -> engine port                         (no router in that netns)
  b  wrk -> service port, router weight 100     (the program hands the SYN to the engine)
  c  wrk -> service port, router weight 0       (the proxy nginx forwards to the engine)
and, connection-per-request only, the floor of the decision time:
  e  wrk -> service port, a program that only returns SK_PASS (the proxy serves)
The router is loaded, routed and given the engine socket through plugins/module_utils,
the same functions the modules call. Rounds are interleaved (a, b, c, then c, b, a, ...) in
two modes, keepalive and connection-per-request; the report gives medians. After the
rounds, BPF_PROG_TEST_RUN measures the decision alone (decision_cost.py).

Cohorts (--cohorts, default 0,1,200,200in,hashclient): per variant with cohorts, one more
netns like (b), its route at weight 100 with the variant's client cohorts (hashclient: no
cohorts, the route hashes by client, hash: client). Per round and mode (a), (b) and every
such netns run at the same time, so each routed/direct ratio and each variant's decision
time come from the same moments. Then BPF_PROG_TEST_RUN runs one router per
variant in turns, batch by batch (decision_cost.cohort_test_runs).

Run as root: sudo .venv/bin/python bench/router_bench.py --rounds 5 --duration 10
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# scripts/setup links the checkout as ansible_collections/zerolayer/fleet under .collections.
sys.path.insert(0, os.path.join(REPO, ".collections"))

import decision_cost  # noqa: E402
import lab  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (  # noqa: E402
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (  # noqa: E402
    RunTimeStats,
    histogram_percentile,
    interpolated_percentile,
    read_cohort_counters,
    read_counters,
    read_latency_buckets,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import PinLayout  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route  # noqa: E402

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
BPF_DIR = os.path.join(REPO, "files", "bpf")
DEFAULT_OBJECT = os.path.join(BPF_DIR, "build", "zerolayer_router.bpf.o")
WRK_SCRIPT = os.path.join(BENCH_DIR, "wrk_summary.lua")
RESULT_MARK = "ZL_BENCH_RESULT "
ROUTE = "svc"
# wrk on one core, every nginx process on the other: nginx and wrk then do not take
# turns on the same core at random, and all three cases get the same server CPU.
CLIENT_CPUS = "0"
SERVER_CPUS = "1"

CASES = {
    "a": {"title": "engine direct", "port": lab.ENGINE_PORT, "weight": None},
    "b": {
        "title": "service port, sk_lookup to engine (w=100)",
        "port": lab.SERVICE_PORT,
        "weight": 100,
    },
    "c": {"title": "service port, nginx proxy hop (w=0)", "port": lab.SERVICE_PORT, "weight": 0},
    "e": {
        "title": "service port, a program that only returns SK_PASS (floor)",
        "port": lab.SERVICE_PORT,
        "weight": None,
        "floor": True,
        "modes": ("close",),
    },
}
MODES = {
    "keepalive": "keepalive",
    "close": "connection per request (Connection: close)",
}
TARGETS = (
    (
        "(b)/(a) req/s, keepalive, side by side",
        ">= 0.97",
        lambda s: s["side_by_side"]["keepalive"]["median"],
        0.97,
        "ge",
    ),
    (
        "(b)/(a) req/s, close, side by side",
        ">= 0.97",
        lambda s: s["side_by_side"]["close"]["median"],
        0.97,
        "ge",
    ),
    ("(b)/(c) req/s, keepalive", ">= 2.5", lambda s: s["ratios"]["b/c keepalive"], 2.5, "ge"),
    ("mean decision time (b)", "<= 200 ns", lambda s: s["decision"]["b"]["mean_ns"], 200, "le"),
    (
        "p99 decision time (b), interpolated in its bucket as histogram_quantile() does",
        "<= 1000 ns",
        lambda s: s["decision"]["b"]["p99_interpolated_ns"],
        1000,
        "le",
    ),
)


COHORT_TARGETS = {
    "above_none_ns": ("mean decision, minus none's (BPF_PROG_TEST_RUN)", "<= 60 ns", 60, "le"),
    "traffic_above_none_ns": (
        "mean decision in traffic, minus none's (close, run by run)",
        "<= 60 ns",
        60,
        "le",
    ),
    "p99_ns": ("p99 decision (BPF_PROG_TEST_RUN, histogram, interpolated)", "<= 500 ns", 500, "le"),
    "keepalive": ("routed/direct req/s, keepalive, all at once", ">= 0.99", 0.99, "ge"),
    "close": ("routed/direct req/s, close, all at once", ">= 0.99", 0.99, "ge"),
}


# --quick: pairs of new and known clients per phase (the harness, not a figure).
QUICK_NEW_CLIENT_PAIRS = 200
DEFAULT_COHORTS = "0,%s,1,200,200in,%s" % (
    decision_cost.TRIE_LOOKUP_VARIANT,
    decision_cost.HASH_CLIENT_VARIANT,
)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument("--duration", type=int, default=10, help="seconds per wrk run")
    parser.add_argument("--warmup", type=int, default=2, help="unrecorded seconds per case/mode")
    parser.add_argument("--connections", type=int, default=16, help="wrk -c (default 16)")
    parser.add_argument("--threads", type=int, default=2, help="wrk -t (default 2)")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="wrk on CPU %s, nginx on CPU %s (default on)" % (CLIENT_CPUS, SERVER_CPUS),
    )
    parser.add_argument("--object", default=None, help="router object (default: make it)")
    parser.add_argument(
        "--output-dir", default=os.path.join(BENCH_DIR, "results"), help="where .md/.json go"
    )
    parser.add_argument(
        "--cohorts",
        default=DEFAULT_COHORTS,
        help="cohort variants to compare, comma-separated: N = N prefixes none of which holds "
        "the client (alternately always_direct and never_direct), Nin = N always_direct prefixes "
        "one of which is the client's /32, %s = no cohorts, the route hashes by client "
        "(hash: client), %s = no cohorts, the empty trie looked up (a route entry without "
        "ZL_ROUTE_NO_COHORTS); 0 (no cohorts, hash by connection) is always in (default %s)"
        % (decision_cost.HASH_CLIENT_VARIANT, decision_cost.TRIE_LOOKUP_VARIANT, DEFAULT_COHORTS),
    )
    parser.add_argument(
        "--cohort-rounds",
        type=int,
        default=None,
        help="runs per mode of the cohort variants all at once (default: --rounds)",
    )
    parser.add_argument(
        "--batches",
        type=int,
        default=decision_cost.COHORT_BATCHES,
        help="BPF_PROG_TEST_RUN batches per cohort variant (default %d)"
        % decision_cost.COHORT_BATCHES,
    )
    parser.add_argument(
        "--batch-runs",
        type=int,
        default=decision_cost.COHORT_BATCH_RUNS,
        help="runs per batch (default %d)" % decision_cost.COHORT_BATCH_RUNS,
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="harness check: 1 round of 1 s, no warm-up, 20 test-run batches",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.duration, args.warmup, args.batches = 1, 1, 0, 20
        args.cohort_rounds = 1
    if args.cohort_rounds is None:
        args.cohort_rounds = args.rounds
    try:
        args.cohort_variants = decision_cost.parse_cohort_variants(args.cohorts)
    except ValueError as exc:
        parser.error("--cohorts: %s" % exc)
    for name in (
        "rounds",
        "cohort_rounds",
        "duration",
        "connections",
        "threads",
        "batches",
        "batch_runs",
    ):
        if getattr(args, name) < 1:
            parser.error(
                "--%s must be at least 1; got %d" % (name.replace("_", "-"), getattr(args, name))
            )
    if args.warmup < 0:
        parser.error("--warmup must be 0 or more; got %d" % args.warmup)
    if args.pin and (os.cpu_count() or 1) < 2:
        args.pin = False
    return args


def router_object(args):
    if args.object:
        return os.path.abspath(args.object)
    lab.run(["make", "-s", "-C", BPF_DIR])
    return DEFAULT_OBJECT


def case_modes(key):
    return CASES[key].get("modes", tuple(MODES))


def set_up_case(stack, key, workdir, bpffs, objects, server_cpus):
    """A fresh netns with the engine; for b/c the proxy and the router with route svc; for e
    the proxy and the floor program."""
    case = CASES[key]
    netns = lab.Netns(stack, key, workdir)
    engine = netns.start_nginx("engine", lab.ENGINE_PORT, server_cpus)
    target = {"key": key, "netns": netns, "layout": None, "route_index": None, "floor_pin": None}
    if case.get("floor"):
        netns.start_nginx("proxy", lab.SERVICE_PORT, server_cpus)
        target["floor_pin"] = decision_cost.attach_pass_program(
            stack, netns, objects["floor"], bpffs
        )
        return target
    if case["weight"] is None:
        return target
    netns.start_nginx("proxy", lab.SERVICE_PORT, server_cpus)
    layout, route_index = attach_router(
        stack, netns, engine, workdir, bpffs, objects["router"], case["weight"]
    )
    target.update(layout=layout, route_index=route_index)
    return target


def attach_router(stack, netns, engine, workdir, bpffs, object_path, weight, variant=None):
    """The router in netns, route svc at weight (with variant's cohorts), the engine's
    socket registered; returns (layout, route index)."""
    # The router's fence file in the bench's own directory: the machine's node state
    # (/var/lib/zerolayer) is not the bench's to touch.
    layout = PinLayout(
        os.path.join(bpffs, netns.name),
        fence_file=os.path.join(workdir, netns.name + "-fence.json"),
    )
    stack.callback(router_lifecycle.remove, layout)
    router_lifecycle.attach(layout, object_path, netns.path)
    if variant is None:
        route = set_route(layout, ROUTE, port=lab.SERVICE_PORT, weight=weight)["after"]
    else:
        route = decision_cost.set_cohort_route(layout, ROUTE, lab.SERVICE_PORT, weight, variant)
    register_engine_socket(layout, ROUTE, engine.pid, lab.ENGINE_PORT, family="inet", timeout=10)
    return layout, route.route_index


def set_up_cohort_case(stack, variant, workdir, bpffs, objects, server_cpus):
    """A netns as (b)'s (engine, proxy, router at weight 100) whose route has variant's
    cohorts."""
    netns = lab.Netns(stack, "b" + variant["name"], workdir)
    engine = netns.start_nginx("engine", lab.ENGINE_PORT, server_cpus)
    netns.start_nginx("proxy", lab.SERVICE_PORT, server_cpus)
    layout, route_index = attach_router(
        stack, netns, engine, workdir, bpffs, objects["router"], 100, variant
    )
    return {
        "key": "b",
        "variant": variant["name"],
        "netns": netns,
        "layout": layout,
        "route_index": route_index,
        "floor_pin": None,
    }


def router_snapshot(target):
    """Program run statistics, decision histogram and route counters; None without a program."""
    if target["floor_pin"]:
        return decision_cost.program_stats(target["floor_pin"])
    layout = target["layout"]
    if layout is None:
        return None
    program = router_lifecycle.program_state(layout)
    return {
        "run_cnt": program["run_cnt"],
        "run_time_ns": program["run_time_ns"],
        "buckets": read_latency_buckets(layout),
        "counters": read_counters(layout, target["route_index"]),
    }


def snapshot_delta(before, after):
    if before is None:
        return None
    delta = {
        "run_cnt": after["run_cnt"] - before["run_cnt"],
        "run_time_ns": after["run_time_ns"] - before["run_time_ns"],
    }
    if "buckets" in after:
        delta["buckets"] = [new - old for new, old in zip(after["buckets"], before["buckets"])]
        delta["counters"] = {
            name: after["counters"][name] - before["counters"][name] for name in after["counters"]
        }
    return delta


def start_wrk(target, mode, duration, args):
    """Start one wrk run in the case's netns; finish_wrk() waits for it."""
    port = CASES[target["key"]]["port"]
    wrk = [
        "wrk",
        "-c",
        str(args.connections),
        "-t",
        str(args.threads),
        "-d",
        "%ds" % duration,
        "--timeout",
        "5s",
        "-s",
        WRK_SCRIPT,
        "http://127.0.0.1:%d/" % port,
    ]
    env = dict(os.environ, ZL_BENCH_CONNECTION="close" if mode == "close" else "keep-alive")
    cpus = CLIENT_CPUS if args.pin else None
    proc = subprocess.Popen(
        target["netns"].argv(wrk, cpus),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return proc, duration


def finish_wrk(started):
    """wrk's summary of a started run, with req/s added."""
    proc, duration = started
    try:
        stdout, stderr = proc.communicate(timeout=duration + 60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    lines = [line for line in stdout.splitlines() if line.startswith(RESULT_MARK)]
    if proc.returncode != 0 or not lines:
        raise RuntimeError("wrk printed no summary:\n%s\n%s" % (stdout, stderr))
    result = json.loads(lines[-1][len(RESULT_MARK) :])
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def run_wrk(target, mode, duration, args):
    """One wrk run in the case's netns; returns wrk's summary with req/s added."""
    return finish_wrk(start_wrk(target, mode, duration, args))


def run_side_by_side(targets, args, progress):
    """(a) and (b) at the same time, per round and mode: whatever slows the machine during
    a run slows both, so their ratio does not drift with it."""
    by_key = {target["key"]: target for target in targets}
    pairs = []
    for round_number in range(1, args.rounds + 1):
        for mode in MODES:
            started = {key: start_wrk(by_key[key], mode, args.duration, args) for key in "ab"}
            results = {key: finish_wrk(run) for key, run in started.items()}
            pair = {
                "round": round_number,
                "mode": mode,
                "rps": {key: result["rps"] for key, result in results.items()},
                "errors": {key: sum(result["errors"].values()) for key, result in results.items()},
            }
            progress(
                "side by side %d %-9s (a) %9.0f  (b) %9.0f req/s"
                % (round_number, mode, pair["rps"]["a"], pair["rps"]["b"])
            )
            pairs.append(pair)
    return pairs


def measure(target, mode, round_number, args):
    before = router_snapshot(target)
    result = run_wrk(target, mode, args.duration, args)
    result.update(
        case=target["key"],
        mode=mode,
        round=round_number,
        router=snapshot_delta(before, router_snapshot(target)),
    )
    return result


def run_rounds(targets, args, progress):
    runs = []
    if args.warmup:
        for mode in MODES:
            for target in targets:
                if mode in case_modes(target["key"]):
                    run_wrk(target, mode, args.warmup, args)
    for round_number in range(1, args.rounds + 1):
        # Every other round runs the cases in reverse order, so a drift of the machine's
        # speed during a round does not always favour the same case.
        ordered = targets if round_number % 2 else targets[::-1]
        for mode in MODES:
            for target in ordered:
                if mode not in case_modes(target["key"]):
                    continue
                run = measure(target, mode, round_number, args)
                progress(
                    "round %d %-9s (%s) %9.0f req/s  p99 %s"
                    % (
                        round_number,
                        mode,
                        run["case"],
                        run["rps"],
                        format_us(run["latency_us"]["p99"]),
                    )
                )
                runs.append(run)
    return runs


def cohort_snapshot(target):
    """router_snapshot() of a routed netns, with the route's cohort counters."""
    snapshot = router_snapshot(target)
    snapshot["counters"].update(read_cohort_counters(target["layout"], target["route_index"]) or {})
    return snapshot


def run_cohorts_side_by_side(direct, routed, args, progress):
    """(a) and the routed netns of every cohort variant ({variant: target}) at the same
    time, per round and mode: every ratio to (a), and each variant's decision time, comes
    from the same seconds, so the machine's drift moves them all alike."""
    names = list(routed)
    if args.warmup:
        for mode in MODES:
            started = [start_wrk(direct, mode, args.warmup, args)]
            started += [start_wrk(routed[name], mode, args.warmup, args) for name in names]
            for run in started:
                finish_wrk(run)
    runs = []
    for round_number in range(1, args.cohort_rounds + 1):
        # The order the wrk commands start in alternates, as the rounds' order does.
        order = names if round_number % 2 else names[::-1]
        for mode in MODES:
            before = {name: cohort_snapshot(routed[name]) for name in order}
            started = {"a": start_wrk(direct, mode, args.duration, args)}
            started.update(
                (name, start_wrk(routed[name], mode, args.duration, args)) for name in order
            )
            results = {key: finish_wrk(run) for key, run in started.items()}
            run = {
                "round": round_number,
                "mode": mode,
                "rps": {key: result["rps"] for key, result in results.items()},
                "errors": {key: sum(result["errors"].values()) for key, result in results.items()},
                "router": {
                    name: snapshot_delta(before[name], cohort_snapshot(routed[name]))
                    for name in names
                },
            }
            progress(
                "cohorts %d %-9s (a) %8.0f  %s"
                % (
                    round_number,
                    mode,
                    run["rps"]["a"],
                    "  ".join("(b %s) %8.0f" % (name, run["rps"][name]) for name in names),
                )
            )
            runs.append(run)
    return runs


# Summary


def case_row(runs, key, mode):
    picked = [run for run in runs if run["case"] == key and run["mode"] == mode]
    rps = [run["rps"] for run in picked]
    return {
        "case": key,
        "mode": mode,
        "rounds": len(picked),
        "rps_median": statistics.median(rps),
        "rps_min": min(rps),
        "rps_max": max(rps),
        "p50_us": statistics.median(run["latency_us"]["p50"] for run in picked),
        "p99_us": statistics.median(run["latency_us"]["p99"] for run in picked),
        "requests": sum(run["requests"] for run in picked),
        "errors": sum(sum(run["errors"].values()) for run in picked),
    }


def ratio(runs, rows, top, bottom, mode):
    """The ratio round by round (its median, min and max) and the ratio of the medians.

    Both cases of a round run minutes apart at most, so their ratio is not moved by
    the machine's speed drifting between rounds: the median of those paired ratios is
    the figure the targets are judged on.
    """
    by_round = {}
    for run in runs:
        if run["mode"] == mode and run["case"] in (top, bottom):
            by_round.setdefault(run["round"], {})[run["case"]] = run["rps"]
    per_round = [pair[top] / pair[bottom] for pair in by_round.values() if len(pair) == 2]
    return {
        "paired_median": statistics.median(per_round),
        "median_based": rows[(top, mode)]["rps_median"] / rows[(bottom, mode)]["rps_median"],
        "per_round_min": min(per_round),
        "per_round_max": max(per_round),
    }


def decision_summary(runs, key):
    """Decision time of case key's program over every measured run, both modes."""
    deltas = [run["router"] for run in runs if run["case"] == key]
    run_cnt = sum(delta["run_cnt"] for delta in deltas)
    run_time_ns = sum(delta["run_time_ns"] for delta in deltas)
    if CASES[key].get("floor"):
        return {"run_cnt": run_cnt, "mean_ns": run_time_ns / run_cnt if run_cnt else None}
    buckets = [sum(column) for column in zip(*(delta["buckets"] for delta in deltas))]
    counters = {}
    for delta in deltas:
        for name, value in delta["counters"].items():
            counters[name] = counters.get(name, 0) + value
    return {
        "run_cnt": run_cnt,
        "mean_ns": run_time_ns / run_cnt if run_cnt else None,
        "histogram_count": sum(buckets),
        "p50_ns": histogram_percentile(buckets, 0.50),
        "p99_ns": histogram_percentile(buckets, 0.99),
        "p99_interpolated_ns": interpolated_percentile(buckets, 0.99),
        "buckets": {str(2 ** (bucket + 1)): count for bucket, count in enumerate(buckets) if count},
        "counters": counters,
    }


def side_by_side_summary(pairs):
    """Per mode: the (b)/(a) ratio of each concurrent pair, its median and range."""
    summary = {}
    for mode in MODES:
        ratios = [pair["rps"]["b"] / pair["rps"]["a"] for pair in pairs if pair["mode"] == mode]
        summary[mode] = {
            "ratios": ratios,
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "errors": sum(sum(pair["errors"].values()) for pair in pairs if pair["mode"] == mode),
        }
    return summary


def summarise(runs, pairs):
    rows = {
        (key, mode): case_row(runs, key, mode)
        for mode in MODES
        for key in CASES
        if mode in case_modes(key)
    }
    ratios = {
        "b/a keepalive": ratio(runs, rows, "b", "a", "keepalive"),
        "b/a close": ratio(runs, rows, "b", "a", "close"),
        "b/c keepalive": ratio(runs, rows, "b", "c", "keepalive"),
        "b/c close": ratio(runs, rows, "b", "c", "close"),
    }
    summary = {
        "rows": list(rows.values()),
        "ratios": {name: value["paired_median"] for name, value in ratios.items()},
        "ratio_ranges": ratios,
        "decision": {key: decision_summary(runs, key) for key in ("b", "c", "e")},
        "side_by_side": side_by_side_summary(pairs),
    }
    floor = summary["decision"]["e"]["mean_ns"]
    summary["above_floor_ns"] = {
        key: None if floor is None else summary["decision"][key]["mean_ns"] - floor
        for key in ("b", "c")
    }
    summary["targets"] = [target_verdict(summary, *target) for target in TARGETS]
    return summary


def paired_ratios(runs, mode, top, bottom):
    """top/bottom req/s of every run of mode (both ran at the same time): median, range."""
    ratios = [run["rps"][top] / run["rps"][bottom] for run in runs if run["mode"] == mode]
    return {
        "ratios": ratios,
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def traffic_decision(runs, name):
    """Decision time of variant name's program in traffic, over both modes' runs."""
    deltas = [run["router"][name] for run in runs]
    run_cnt = sum(delta["run_cnt"] for delta in deltas)
    buckets = [sum(column) for column in zip(*(delta["buckets"] for delta in deltas))]
    counters = {}
    for delta in deltas:
        for field, value in delta["counters"].items():
            counters[field] = counters.get(field, 0) + value
    return {
        "run_cnt": run_cnt,
        "mean_ns": sum(delta["run_time_ns"] for delta in deltas) / run_cnt if run_cnt else None,
        "histogram_count": sum(buckets),
        "p99_ns": histogram_percentile(buckets, 0.99),
        "p99_interpolated_ns": interpolated_percentile(buckets, 0.99),
        "counters": counters,
    }


def traffic_above_none(runs, name):
    """Variant name's mean decision minus none's, run by run (close mode: every request a
    decision; the two ran at the same time): median and range; None for none itself."""
    if name == "0":
        return None
    differences = []
    for run in runs:
        mine, none = run["router"][name], run["router"]["0"]
        if run["mode"] == "close" and mine["run_cnt"] and none["run_cnt"]:
            differences.append(
                mine["run_time_ns"] / mine["run_cnt"] - none["run_time_ns"] / none["run_cnt"]
            )
    if not differences:
        return None
    return {
        "per_run_ns": differences,
        "median_ns": statistics.median(differences),
        "min_ns": min(differences),
        "max_ns": max(differences),
    }


def summarise_cohorts(cohorts):
    """Per variant: its test-run figures, its ratios to (a) and to none, its decision in
    traffic; and the cohort targets judged on them."""
    runs = cohorts["runs"]
    test_rows = {row["variant"]: row for row in cohorts["test_runs"]["rows"]}
    variants = {}
    for variant in cohorts["variants"]:
        name = variant["name"]
        variants[name] = {
            "title": variant["title"],
            "route": cohorts["routes"][name],
            "test_run": test_rows[name],
            "to_direct": {mode: paired_ratios(runs, mode, name, "a") for mode in MODES},
            "to_none": {mode: paired_ratios(runs, mode, name, "0") for mode in MODES},
            "traffic": traffic_decision(runs, name),
            "traffic_above_none": traffic_above_none(runs, name),
            "errors": sum(run["errors"][name] for run in runs),
        }
    targets = []
    for name, figures in variants.items():
        measured = {
            "above_none_ns": figures["test_run"]["above_none_ns"],
            "traffic_above_none_ns": (figures["traffic_above_none"] or {}).get("median_ns"),
            "p99_ns": figures["test_run"]["p99_interpolated_ns"],
            "keepalive": figures["to_direct"]["keepalive"]["median"],
            "close": figures["to_direct"]["close"]["median"],
        }
        for key, (title, wanted, bound, sense) in COHORT_TARGETS.items():
            if key in ("above_none_ns", "traffic_above_none_ns") and name == "0":
                continue
            verdict = target_verdict(
                measured, title, wanted, lambda figures, key=key: figures[key], bound, sense
            )
            verdict.update(variant=name, figure=key)
            targets.append(verdict)
    return {
        "variants": variants,
        "direct_errors": sum(run["errors"]["a"] for run in runs),
        "targets": targets,
        "all_passed": all(verdict["passed"] for verdict in targets),
    }


def target_verdict(summary, name, wanted, measured_of, bound, sense):
    measured = measured_of(summary)
    if measured is None:
        passed = False
    else:
        passed = measured >= bound if sense == "ge" else measured <= bound
    return {"name": name, "target": wanted, "measured": measured, "passed": passed}


# Report


def format_us(value):
    return "%.2f ms" % (value / 1000.0) if value >= 1000 else "%d us" % value


def format_ns(value):
    return "n/a" if value is None else "%.0f ns" % value


CASE_COLUMNS = (
    "Case",
    "Mode",
    "req/s (median)",
    "req/s (min-max)",
    "latency p50",
    "latency p99",
    "requests",
    "errors",
)
DECISION_COLUMNS = (
    "Route decision",
    "Runs",
    "Mean (run_time_ns/run_cnt)",
    "p50 (histogram)",
    "p99 (histogram)",
    "p99 (interpolated)",
    "to_engine",
    "to_proxy_by_weight",
    "fallback / assign errors",
)


def table_row(cells):
    return "| " + " | ".join(str(cell) for cell in cells) + " |"


def describe_settings(report):
    settings, host = report["settings"], report["host"]
    if settings["pin"]:
        pin = "wrk pinned to CPU %s, every nginx process to CPU %s (taskset)." % (
            CLIENT_CPUS,
            SERVER_CPUS,
        )
    else:
        pin = "No CPU pinning."
    return [
        "Date: %s (UTC). Command: `%s`" % (report["started"], report["command"]),
        "",
        "Host: Linux %s, %d CPUs; load average (1/5/15 min) before %s, after %s. %s"
        % (host["kernel"], host["cpus"], host["loadavg_before"], host["loadavg_after"], pin),
        "",
        "%d interleaved rounds of %d s per case and mode, after %d s of warm-up each; "
        % (settings["rounds"], settings["duration_s"], settings["warmup_s"])
        + "`wrk -c%d -t%d`. " % (settings["connections"], settings["threads"])
        + "Connection-per-request mode: a wrk Lua script adds the header `Connection: close`, "
        "so every request opens a new connection.",
    ]


def case_table(summary):
    lines = [
        table_row(CASE_COLUMNS),
        table_row(["---", "---"] + ["---:"] * (len(CASE_COLUMNS) - 2)),
    ]
    for row in summary["rows"]:
        lines.append(
            table_row(
                [
                    "(%s) %s" % (row["case"], CASES[row["case"]]["title"]),
                    row["mode"],
                    "%.0f" % row["rps_median"],
                    "%.0f-%.0f" % (row["rps_min"], row["rps_max"]),
                    format_us(row["p50_us"]),
                    format_us(row["p99_us"]),
                    row["requests"],
                    row["errors"],
                ]
            )
        )
    return lines


def ratio_table(summary):
    lines = [
        table_row(
            [
                "Ratio of req/s",
                "Round by round (median)",
                "Round by round (min-max)",
                "Of the medians",
            ]
        ),
        table_row(["---", "---:", "---:", "---:"]),
    ]
    for name, value in summary["ratio_ranges"].items():
        top, bottom, mode = name[0], name[2], name[4:]
        lines.append(
            table_row(
                [
                    "(%s)/(%s) %s" % (top, bottom, mode),
                    "%.3f" % value["paired_median"],
                    "%.3f-%.3f" % (value["per_round_min"], value["per_round_max"]),
                    "%.3f" % value["median_based"],
                ]
            )
        )
    return lines


def decision_table(summary):
    lines = [
        table_row(DECISION_COLUMNS),
        table_row(["---"] + ["---:"] * (len(DECISION_COLUMNS) - 1)),
    ]
    for key, decision in summary["decision"].items():
        if CASES[key].get("floor"):
            not_measured = ["n/a"] * (len(DECISION_COLUMNS) - 3)
            lines.append(
                table_row(
                    [
                        "(e) only returns SK_PASS",
                        decision["run_cnt"],
                        format_ns(decision["mean_ns"]),
                        *not_measured,
                    ]
                )
            )
            continue
        counters = decision["counters"]
        lines.append(
            table_row(
                [
                    "(%s) weight %d" % (key, CASES[key]["weight"]),
                    decision["run_cnt"],
                    format_ns(decision["mean_ns"]),
                    "<= " + format_ns(decision["p50_ns"]),
                    "<= " + format_ns(decision["p99_ns"]),
                    format_ns(decision["p99_interpolated_ns"]),
                    counters["to_engine"],
                    counters["to_proxy_by_weight"],
                    "%d / %d" % (counters["fallback_no_socket"], counters["assign_errors"]),
                ]
            )
        )
    return lines


def side_by_side_table(summary):
    lines = [
        "Side by side: (a) and (b) run at the same time, each with the wrk settings above "
        "(sharing CPU 0 for wrk and CPU 1 for nginx), once per round and mode.",
        "",
        table_row(["(b)/(a) req/s", "Median", "Min-max", "Per round", "errors"]),
        table_row(["---", "---:", "---:", "---", "---:"]),
    ]
    for mode, value in summary["side_by_side"].items():
        lines.append(
            table_row(
                [
                    mode,
                    "%.3f" % value["median"],
                    "%.3f-%.3f" % (value["min"], value["max"]),
                    " ".join("%.3f" % ratio for ratio in value["ratios"]),
                    value["errors"],
                ]
            )
        )
    return lines


def floor_note(summary):
    above = summary["above_floor_ns"]
    if above["b"] is None:
        return ["The floor (e) was not measured."]
    return [
        "Above the floor (e), the cost of running any sk_lookup program with the kernel's "
        "run-time accounting on, the router's own mean decision time is %s for (b) and %s "
        "for (c)." % (format_ns(above["b"]), format_ns(above["c"]))
    ]


def test_run_table(test_runs):
    lines = [
        "Decision alone, by BPF_PROG_TEST_RUN: median of %d loops of %d runs each on one "
        "connection, hot caches, run-time accounting off."
        % (test_runs["samples"], test_runs["repeat"]),
        "",
        table_row(["Program", "Decision", "ns per run"]),
        table_row(["---", "---", "---:"]),
    ]
    for row in test_runs["rows"]:
        lines.append(table_row([row["program"], row["decision"], "%.0f" % row["ns_per_run"]]))
    return lines


def target_table(summary):
    lines = [
        table_row(["Target", "Wanted", "Measured", "Result"]),
        table_row(["---", "---", "---:", "---"]),
    ]
    for verdict in summary["targets"]:
        measured = verdict["measured"]
        if "time" in verdict["name"]:
            shown = format_ns(measured)
        else:
            shown = "n/a" if measured is None else "%.3f" % measured
        result = "pass" if verdict["passed"] else "MISS"
        lines.append(table_row([verdict["name"], verdict["target"], shown, result]))
    return lines


def format_range(ratios):
    return "%.3f (%.3f-%.3f)" % (ratios["median"], ratios["min"], ratios["max"])


def format_above(above):
    if above is None:
        return "-"
    return "%+.0f ns (%+.0f to %+.0f)" % (above["median_ns"], above["min_ns"], above["max_ns"])


def format_counters(counters):
    """to_engine (of them opt-in) / to_proxy_by_weight / to_proxy_opt_out / fallback+assign."""
    return "%d (%d) / %d / %d / %d" % (
        counters["to_engine"],
        counters.get("to_engine_opt_in", 0),
        counters["to_proxy_by_weight"],
        counters.get("to_proxy_opt_out", 0),
        counters["fallback_no_socket"] + counters["assign_errors"],
    )


def cohort_notes(report):
    cohorts = report["cohorts"]
    test_runs = cohorts["test_runs"]
    held = (
        "Another process held the kernel's run-time accounting on during them (the programs' "
        "run_cnt grew): their figures include it."
        if test_runs["run_time_stats_held_by_another"]
        else "Nobody held the kernel's run-time accounting on during them (run_cnt stayed)."
    )
    variants = "; ".join(
        "%s = %s" % (variant["name"], variant["title"]) for variant in cohorts["variants"]
    )
    hashed = [
        variant["name"]
        for variant in cohorts["variants"]
        if variant.get("hash_mode") == decision_cost.HASH_BY_CLIENT
    ]
    by_client = []
    if hashed:
        by_client = [
            "",
            "Hash by client (%s): the route is written with `routes.set_route(..., "
            'hash_mode="client")`, as the route module writes `hash: client` (flags bit '
            "ZL_ROUTE_HASH_CLIENT; the hash read back from the stored entry is in the tables). "
            "The weight's hash is of the client's address alone, and the router notes each "
            "address the weight decided in zl_clients. The bench has one client address, so "
            "after its first decision every lookup finds its zl_clients entry unchanged: one "
            "LRU hash lookup and no write, a known client's steady state, not a new client's "
            "insert." % ", ".join(hashed),
        ]
    skipping = [
        name for name, route in cohorts.get("routes", {}).items() if route.get("skips_trie")
    ]
    by_client += [
        "",
        "The trie skipped: a route whose lists are empty carries ZL_ROUTE_NO_COHORTS and the "
        "program looks up neither the trie nor the cohort counters. Read back from the traffic "
        "routes' stored entries, the flag is set on: %s; %s rewrites its entry without it, so "
        "the empty trie is looked up as every route's was before the flag."
        % (", ".join(skipping) or "none", decision_cost.TRIE_LOOKUP_VARIANT),
    ]
    return [
        "**Client cohorts.** Variants: %s. The prefixes are /32s packed next to the client "
        "%s (127.0.0.2, .3, ...), so a client outside them walks as deep into the trie as it "
        "goes; the route is at weight 100, so a client in no cohort goes to the engine by "
        "its weight." % (variants, test_runs["client"]),
        "",
        "Decision alone, by BPF_PROG_TEST_RUN: one router per variant on maps of its own, "
        "%d batches of %d runs each per variant, the variants in turns batch by batch (the "
        "order reversed every other batch); per batch the untimed connection, then the timed "
        "one. Mean: median of the untimed batch means; minus none's: the median over batches "
        "of the variant's batch mean minus none's in the same batch. %s"
        % (test_runs["batches"], test_runs["runs_per_batch"], held),
        "",
        "p99, how it is obtained: every run of the timed connection is timed into the "
        "variant's own zl_latency histogram (all %d of its decisions, not a sample). The p99 "
        "judged is interpolated linearly inside its log2 bucket as histogram_quantile() "
        "does; its resolution is the bucket, a factor of 2 (the bound beside it is never "
        "low). The timed section runs from after the tuple hash to the end (the route's maps, "
        "the trie, the weight, the socket) and includes one clock read, so it errs high by "
        "that. The p99 of the untimed batch means (nearest rank) has 1 ns resolution but "
        "averages %d runs: it shows how often a batch was slowed, not single decisions."
        % (test_runs["batches"] * test_runs["runs_per_batch"], test_runs["runs_per_batch"]),
        *by_client,
    ]


def format_clients(noted):
    """zl_clients addresses of the route: direct / proxy."""
    return "%d / %d" % (noted["to_engine"], noted["to_proxy"])


def cohort_test_run_table(report):
    summary = report["cohorts"]["summary"]
    lines = [
        "Cohorts, the decision alone (BPF_PROG_TEST_RUN), ns per run:",
        table_row(
            [
                "Cohort variant",
                "always / never",
                "Hash",
                "Mean (median of batch means)",
                "Minus none's",
                "Mean of all runs",
                "p99 of batch means",
                "Timed: p99 interpolated",
                "Timed: p50 / p99 bucket",
                "to_engine (opt-in) / by weight / opt-out / errors",
                "zl_clients: direct / proxy",
            ]
        ),
        table_row(["---", "---:", "---"] + ["---:"] * 6 + ["---", "---:"]),
    ]
    for name, figures in summary["variants"].items():
        row = figures["test_run"]
        lines.append(
            table_row(
                [
                    name,
                    "%d / %d" % (row["always_direct"], row["never_direct"]),
                    row["hash_mode"],
                    format_ns(row["median_batch_mean_ns"]),
                    "-" if name == "0" else "%+.0f ns" % row["above_none_ns"],
                    "%.1f ns" % row["mean_ns"],
                    format_ns(row["p99_batch_mean_ns"]),
                    format_ns(row["p99_interpolated_ns"]),
                    "<= %s / <= %s" % (format_ns(row["p50_ns"]), format_ns(row["p99_ns"])),
                    format_counters(row["counters"]),
                    format_clients(row["clients_noted"]),
                ]
            )
        )
    return lines


def cohort_traffic_table(report):
    cohorts = report["cohorts"]
    summary = cohorts["summary"]
    lines = [
        "Cohorts in traffic: (a) and one routed netns per variant at the same time, %d "
        "run(s) of %d s per mode; req/s ratios of runs that ran together (median, min-max); "
        "decision time over both modes (mean: run_time_ns / run_cnt, accounting on):"
        % (report["settings"]["cohort_rounds"], report["settings"]["duration_s"]),
        table_row(
            [
                "Cohort variant",
                "Hash",
                "routed/direct keepalive",
                "routed/direct close",
                "routed/none's close",
                "Decisions",
                "Mean",
                "Mean minus none's (close, run by run)",
                "p99 interpolated (bucket)",
                "to_engine (opt-in) / by weight / opt-out / errors",
                "zl_clients: direct / proxy",
                "wrk errors",
            ]
        ),
        table_row(["---", "---"] + ["---:"] * 7 + ["---", "---:", "---:"]),
    ]
    for name, figures in summary["variants"].items():
        traffic = figures["traffic"]
        lines.append(
            table_row(
                [
                    name,
                    figures["route"]["hash_mode"],
                    format_range(figures["to_direct"]["keepalive"]),
                    format_range(figures["to_direct"]["close"]),
                    "-" if name == "0" else format_range(figures["to_none"]["close"]),
                    traffic["run_cnt"],
                    format_ns(traffic["mean_ns"]),
                    format_above(figures["traffic_above_none"]),
                    "%s (<= %s)"
                    % (format_ns(traffic["p99_interpolated_ns"]), format_ns(traffic["p99_ns"])),
                    format_counters(traffic["counters"]),
                    format_clients(figures["route"]["clients_noted"]),
                    figures["errors"],
                ]
            )
        )
    return lines


def cohort_target_table(report):
    summary = report["cohorts"]["summary"]
    lines = [
        "Cohort targets (%s):" % ("all met" if summary["all_passed"] else "not all met"),
        table_row(["Cohort target", "Variant", "Wanted", "Measured", "Result"]),
        table_row(["---", "---", "---", "---:", "---"]),
    ]
    for verdict in summary["targets"]:
        measured = verdict["measured"]
        if verdict["figure"] in ("keepalive", "close"):
            shown = "n/a" if measured is None else "%.3f" % measured
        elif measured is None:
            shown = "n/a"
        elif verdict["figure"] in ("above_none_ns", "traffic_above_none_ns"):
            shown = "%+.0f ns" % measured
        else:
            shown = format_ns(measured)
        lines.append(
            table_row(
                [
                    verdict["name"],
                    verdict["variant"],
                    verdict["target"],
                    shown,
                    "pass" if verdict["passed"] else "MISS",
                ]
            )
        )
    return lines


def new_client_table(new_clients):
    """What a hash-by-client route's decision costs a client it has never seen."""
    lines = [
        "**New clients of a route that hashes by client** (BPF_PROG_TEST_RUN, one run per "
        "call, %d pairs per phase: a new address counting up from %s, then the known client "
        "%s; the insert is the median of the pairs' differences; zl_clients holds %d "
        "addresses, least recently seen ones making room):"
        % (
            new_clients["pairs"],
            new_clients["first_address"],
            new_clients["known_client"],
            new_clients["bound"],
        ),
        table_row(
            [
                "zl_clients",
                "Addresses before",
                "New client, median",
                "Known client, median",
                "Insert (paired)",
                "New client, p99",
                "Noted after (direct / proxy)",
            ]
        ),
        table_row(["---", "---:", "---:", "---:", "---:", "---:", "---:"]),
    ]
    titles = {"below_bound": "below its bound", "at_bound": "full (each insert evicts)"}
    for phase, figures in new_clients["phases"].items():
        lines.append(
            table_row(
                [
                    titles.get(phase, phase),
                    "{:,}".format(figures["addresses_before"]),
                    format_ns(figures["new_median_ns"]),
                    format_ns(figures["known_median_ns"]),
                    "%+.0f ns" % figures["insert_ns"],
                    format_ns(figures["new_p99_ns"]),
                    format_clients(figures["noted_after"]),
                ]
            )
        )
    return lines


def markdown(report):
    summary = report["summary"]
    blocks = [
        describe_settings(report),
        case_table(summary),
        ratio_table(summary),
        side_by_side_table(summary),
        decision_table(summary),
        floor_note(summary),
        test_run_table(report["test_runs"]),
        target_table(summary),
    ]
    if report.get("cohorts"):
        blocks += [
            cohort_notes(report),
            cohort_test_run_table(report),
            cohort_traffic_table(report),
            cohort_target_table(report),
        ]
        if report["cohorts"].get("new_clients"):
            blocks.append(new_client_table(report["cohorts"]["new_clients"]))
    return "\n\n".join("\n".join(block) for block in blocks) + "\n"


def write_report(report, output_dir, stamp):
    os.makedirs(output_dir, exist_ok=True)
    base = os.path.join(output_dir, stamp)
    with open(base + ".json", "w") as handle:
        json.dump(report, handle, indent=2, sort_keys=True)
        handle.write("\n")
    with open(base + ".md", "w") as handle:
        handle.write("# Router data-plane bench\n\n" + report["markdown"])
    return base + ".md", base + ".json"


def git_revision():
    done = subprocess.run(
        ["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.stdout.strip() or None


def bench(args, progress):
    started = datetime.datetime.now(datetime.timezone.utc)
    report = {
        "started": started.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join([os.path.relpath(sys.argv[0], REPO), *sys.argv[1:]]),
        "revision": git_revision(),
        "host": {
            "kernel": platform.release(),
            "cpus": os.cpu_count(),
            "loadavg_before": lab.loadavg(),
        },
        "settings": {
            "rounds": args.rounds,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "connections": args.connections,
            "threads": args.threads,
            "pin": args.pin,
            "client_cpus": CLIENT_CPUS if args.pin else None,
            "server_cpus": SERVER_CPUS if args.pin else None,
            "close_mode": "wrk Lua script sets the request header Connection: close",
            "nginx_keepalive_requests": lab.KEEPALIVE_REQUESTS,
            "cohorts": [variant["name"] for variant in args.cohort_variants],
            "cohort_rounds": args.cohort_rounds,
            "test_run_batches": args.batches,
            "test_run_batch_runs": args.batch_runs,
        },
        "cases": CASES,
    }
    with contextlib.ExitStack() as stack:
        lab.become_child_subreaper()
        workdir = lab.make_workdir(stack)
        bpffs = lab.mount_private_bpffs(stack, workdir)
        objects = {
            "router": router_object(args),
            "floor": decision_cost.build_pass_program(workdir),
        }
        server_cpus = SERVER_CPUS if args.pin else None
        targets = [set_up_case(stack, key, workdir, bpffs, objects, server_cpus) for key in CASES]
        by_key = {target["key"]: target for target in targets}
        # Variant 0 is (b) itself: the route without cohorts.
        cohort_targets = {"0": by_key["b"]}
        for variant in args.cohort_variants[1:]:
            cohort_targets[variant["name"]] = set_up_cohort_case(
                stack, variant, workdir, bpffs, objects, server_cpus
            )
        extra = [cohort_targets[variant["name"]] for variant in args.cohort_variants[1:]]
        report["lab"] = {
            "bpffs": bpffs,
            "netns": [target["netns"].name for target in targets + extra],
            "pin_dirs": [
                target["layout"].pin_dir for target in targets + extra if target["layout"]
            ],
        }
        progress("netns %s; bpffs %s" % (", ".join(report["lab"]["netns"]), bpffs))
        with RunTimeStats():
            report["runs"] = run_rounds(targets, args, progress)
            report["side_by_side"] = run_side_by_side(targets, args, progress)
            cohort_runs = run_cohorts_side_by_side(by_key["a"], cohort_targets, args, progress)
        # What the traffic netns' routes are, read back: the hash their flags word gives, and
        # the client addresses the router noted in zl_clients (hash by client only).
        cohort_routes = {
            name: {
                **decision_cost.stored_flags(target["layout"], ROUTE),
                "clients_noted": decision_cost.clients_noted(
                    target["layout"], target["route_index"]
                ),
            }
            for name, target in cohort_targets.items()
        }
        floor = by_key["e"]
        report["test_runs"] = decision_cost.test_run_costs(
            by_key["b"]["layout"], ROUTE, lab.SERVICE_PORT, floor["floor_pin"]
        )
        progress(
            "cohorts: BPF_PROG_TEST_RUN, %d batches of %d runs" % (args.batches, args.batch_runs)
        )
        # Where the test-run routers live and what they route: the same for each measurement.
        test_run_routers = (stack, bpffs, workdir, objects["router"], ROUTE, lab.SERVICE_PORT)
        report["cohorts"] = {
            "variants": args.cohort_variants,
            "runs": cohort_runs,
            "routes": cohort_routes,
            "test_runs": decision_cost.cohort_test_runs(
                *test_run_routers,
                args.cohort_variants,
                args.batches,
                args.batch_runs,
            ),
        }
        report["lab"]["pin_dirs"] += [
            os.path.join(bpffs, "cohorts-" + variant["name"]) for variant in args.cohort_variants
        ]
        if decision_cost.HASH_CLIENT_VARIANT in [v["name"] for v in args.cohort_variants]:
            progress("new clients of a route that hashes by client: BPF_PROG_TEST_RUN")
            new_clients = decision_cost.new_client_costs(
                *test_run_routers,
                pairs=QUICK_NEW_CLIENT_PAIRS if args.quick else None,
            )
            report["cohorts"]["new_clients"] = new_clients
            report["lab"]["pin_dirs"].append(new_clients["pin_dir"])
    report["host"]["loadavg_after"] = lab.loadavg()
    report["summary"] = summarise(report["runs"], report["side_by_side"])
    report["cohorts"]["summary"] = summarise_cohorts(report["cohorts"])
    report["markdown"] = markdown(report)
    return report, started.strftime("%Y%m%dT%H%M%SZ")


def raise_system_exit(signum, _frame):
    # SystemExit unwinds through the ExitStack: processes, pins, mount and netns go away.
    raise SystemExit(128 + signum)


def main(argv=None):
    args = parse_args(argv)
    if os.geteuid() != 0:
        sys.exit("router_bench.py loads BPF programs and creates network namespaces: run as root")
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, raise_system_exit)
    # Ctrl-C must unwind the clean-up even when started with SIGINT ignored (from a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def progress(text):
        print(text, file=sys.stderr, flush=True)

    try:
        report, stamp = bench(args, progress)
    except KeyboardInterrupt:
        sys.exit("interrupted; the netns, nginx processes, pins and bpffs mount were removed")
    markdown_path, json_path = write_report(report, args.output_dir, stamp)
    print(report["markdown"])
    print("written: %s, %s" % (markdown_path, json_path))


if __name__ == "__main__":
    main()
