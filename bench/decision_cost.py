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

import contextlib
import ipaddress
import math
import os
import socket
import statistics
import struct

import lab
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    bpf_syscall,
    router_lifecycle,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (
    find_bpftool,
    load_program,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    count_client_addresses,
    histogram_percentile,
    interpolated_percentile,
    read_client_entries,
    read_cohort_counters,
    read_counters,
    read_latency_buckets,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    ROUTES_MAP,
    PinLayout,
    ensure_pin_dirs,
    opened,
    opened_map,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    HASH_BY_CLIENT,
    HASH_BY_CONNECTION,
    MAX_CLIENTS,
    MAX_COHORT_ENTRIES,
    ROUTE_VALUE,
    decode_route,
    encode_port,
    encode_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    find_route,
    read_routes,
    set_route,
)

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
PASS_SOURCE = os.path.join(BENCH_DIR, "bpf", "sk_lookup_pass.bpf.c")
TEST_RUN_REPEAT = 200000
TEST_RUN_SAMPLES = 7
# Cohort variants: this many batches per variant, taken in turns, of this many runs each.
COHORT_BATCHES = 1000
COHORT_BATCH_RUNS = 1000
# New clients of a hash-by-client route: pairs (a new address, the known one) per phase.
NEW_CLIENT_PAIRS = 10000
NEW_CLIENT_PREFIX = "new-clients-"
# The new clients' addresses count up from here (one per decision, never the client's own).
NEW_CLIENT_FIRST = "10.0.0.0"
# The bench's client: wrk connects from it, and the test runs' made-up connection too.
CLIENT_ADDRESS = "127.0.0.1"
# The variant whose route hashes by client (route option hash: client), no cohorts.
HASH_CLIENT_VARIANT = "hashclient"
# No cohorts, and a route entry without ZL_ROUTE_NO_COHORTS: the trie is looked up, found
# empty, as every route's was before the flag.
TRIE_LOOKUP_VARIANT = "0lookup"
NAMED_VARIANTS = (HASH_CLIENT_VARIANT, TRIE_LOOKUP_VARIANT)


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


def _ipv4_field(address):
    """An IPv4 address as struct bpf_sk_lookup holds it (network order, read natively)."""
    return struct.unpack("=I", socket.inet_aton(address))[0]


def loopback_ctx(remote_port, local_port):
    """struct bpf_sk_lookup of a TCP connection 127.0.0.1:remote_port -> 127.0.0.1:local_port."""
    ctx = bytearray(72)
    address = _ipv4_field(CLIENT_ADDRESS)
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


# Cohorts


def parse_cohort_variants(text):
    """Cohort variants from a comma-separated list: N is N prefixes none of which holds the
    client (N=1: one always_direct; more: alternately always_direct and never_direct), Nin
    is N always_direct prefixes one of which is the client's own /32, hashclient is a route
    without cohorts that hashes by client (hash: client), 0lookup a route without cohorts
    whose entry lacks ZL_ROUTE_NO_COHORTS (the empty trie looked up, as before that flag
    existed). The variant without cohorts (0)
    is always measured: every other one is compared with it."""
    names = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        if item in NAMED_VARIANTS:
            if item not in names:
                names.append(item)
            continue
        holds_client = item.endswith("in")
        count = item[:-2] if holds_client else item
        if not count.isdigit():
            raise ValueError(
                "each cohort variant is a number of prefixes N (none holds the client), Nin "
                "(N always_direct prefixes, one of them the client's /32), %s (no cohorts, "
                "the route hashes by client) or %s (no cohorts, the trie looked up as before "
                "ZL_ROUTE_NO_COHORTS); got %r" % (HASH_CLIENT_VARIANT, TRIE_LOOKUP_VARIANT, item)
            )
        prefixes = int(count)
        if prefixes > MAX_COHORT_ENTRIES or (holds_client and prefixes < 1):
            raise ValueError(
                "cohort variant %r: N must be 0 to %d (1 to %d for Nin)"
                % (item, MAX_COHORT_ENTRIES, MAX_COHORT_ENTRIES)
            )
        name = "%din" % prefixes if holds_client else str(prefixes)
        if name not in names:
            names.append(name)
    if "0" in names:
        names.remove("0")
    return [cohort_variant(name) for name in ["0", *names]]


def _variant_without_cohorts(name, title, hash_mode=HASH_BY_CONNECTION, **extra):
    return {
        "name": name,
        "prefixes": 0,
        "holds_client": False,
        "always_direct": [],
        "never_direct": [],
        "hash_mode": hash_mode,
        "title": title,
        **extra,
    }


def cohort_variant(name):
    """{name, prefixes, holds_client, always_direct, never_direct, hash_mode, title} of
    variant name.

    The prefixes are /32s packed next to the client (127.0.0.2, .3, ...): the client's
    lookup walks as deep into the trie as its entries go, the dearest miss it can have.
    hashclient: no cohorts, the route hashes by client (the client's address alone picks
    the path, and the router notes the address in zl_clients). 0lookup: no cohorts, the
    trie looked up all the same (looks_trie_up).
    """
    if name == TRIE_LOOKUP_VARIANT:
        return _variant_without_cohorts(
            name,
            "none, the empty trie looked up (an entry without ZL_ROUTE_NO_COHORTS)",
            looks_trie_up=True,
        )
    if name == HASH_CLIENT_VARIANT:
        return _variant_without_cohorts(
            name, "none, the route hashes by client (hash: client)", hash_mode=HASH_BY_CLIENT
        )
    holds_client = name.endswith("in")
    prefixes = int(name[:-2] if holds_client else name)
    first = ipaddress.ip_address(CLIENT_ADDRESS) + (0 if holds_client else 1)
    cidrs = ["%s/32" % (first + number) for number in range(prefixes)]
    if holds_client:
        always, never = cidrs, []
    else:
        always, never = cidrs[0::2], cidrs[1::2]
    if prefixes == 0:
        title = "none"
    elif holds_client:
        title = "%d always_direct, client in it" % prefixes
    else:
        title = "%d prefix%s (%d always_direct + %d never_direct), client in none" % (
            prefixes,
            "" if prefixes == 1 else "es",
            len(always),
            len(never),
        )
    return {
        "name": name,
        "prefixes": prefixes,
        "holds_client": holds_client,
        "always_direct": always,
        "never_direct": never,
        "hash_mode": HASH_BY_CONNECTION,
        "title": title,
    }


def set_cohort_route(layout, route, port, weight, variant):
    """Route route at weight with the variant's cohorts and hash, as the router module
    writes them (routes.set_route; a route that hashes by client gets hash_mode=client)."""
    options = {}
    if variant["prefixes"]:
        options.update(always_direct=variant["always_direct"], never_direct=variant["never_direct"])
    if variant.get("hash_mode", HASH_BY_CONNECTION) != HASH_BY_CONNECTION:
        options["hash_mode"] = variant["hash_mode"]
    after = set_route(layout, route, port=port, weight=weight, **options)["after"]
    if variant.get("looks_trie_up"):
        after = write_entry_without_the_skip(layout, after)
    return after


def write_entry_without_the_skip(layout, route):
    """route's stored entry rewritten without ZL_ROUTE_NO_COHORTS, as routes were stored
    before that flag: the program looks the (empty) trie up. The route as written."""
    with opened_map(layout, ROUTES_MAP) as fd:
        key = encode_port(route.port)
        stored = decode_route(bpf_syscall.map_lookup(fd, key, ROUTE_VALUE.size))
        unskipped = stored.replace(cohortless=False)
        bpf_syscall.map_update(fd, key, encode_route(unskipped), bpf_syscall.BPF_EXIST)
    return route.replace(cohortless=False)


def stored_flags(layout, route):
    """{hash_mode, skips_trie} of route as its stored entry's flags word says (read back
    once): ZL_ROUTE_HASH_CLIENT and ZL_ROUTE_NO_COHORTS."""
    stored = find_route(read_routes(layout), route)
    return {"hash_mode": stored.hash_mode, "skips_trie": stored.cohortless}


def clients_noted(layout, route_index):
    """{to_engine, to_proxy}: the client addresses of route_index in zl_clients at its weight,
    by the path the weight gave them (metrics.count_client_addresses, as route_info counts
    them; only a route that hashes by client notes any)."""
    counts = count_client_addresses(read_client_entries(layout), read_routes(layout))
    return counts.get(route_index, {"to_engine": 0, "to_proxy": 0})


def nearest_rank(values, quantile):
    """The quantile of values by nearest rank (one of the values, no interpolation)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(quantile * len(ordered)) - 1)]


def _engine_socket(stack):
    """A listening socket of this process on the client's address: the routers' engine."""
    engine = stack.enter_context(socket.socket())
    engine.bind((CLIENT_ADDRESS, 0))
    engine.listen()
    return engine


def _cohort_router(
    stack, bpffs, workdir, object_path, route, local_port, engine, variant, prefix="cohorts-"
):
    """The router of one variant, loaded on maps of its own (not attached), route at weight
    100 with the variant's cohorts, the engine socket in slot 0; with its two connections.
    Its pins are under bpffs/<prefix><variant>."""
    name = prefix + variant["name"]
    layout = PinLayout(
        os.path.join(bpffs, name), fence_file=os.path.join(workdir, name + "-fence.json")
    )
    ensure_pin_dirs(layout)
    stack.callback(router_lifecycle.remove, layout)
    load_program(object_path, layout.prog, layout, reuse_maps=False)
    entry = set_cohort_route(layout, route, local_port, 100, variant)
    register_engine_socket(
        layout, route, os.getpid(), engine.getsockname()[1], family="inet", timeout=5
    )
    timed, untimed = timed_and_untimed_ctx(layout, local_port)
    return {
        "variant": variant,
        "layout": layout,
        "route_index": entry.route_index,
        **stored_flags(layout, route),
        "timed": timed,
        "untimed": untimed,
    }


def _path_counters(layout, route_index):
    counters = read_counters(layout, route_index)
    counters.update(read_cohort_counters(layout, route_index) or {})
    return counters


def cohort_test_runs(
    stack, bpffs, workdir, object_path, route, local_port, variants, batches=None, runs=None
):
    """ns per decision of each cohort variant under BPF_PROG_TEST_RUN, taken in turns.

    Per batch, every variant in turn (the order reversed every other batch) runs its
    untimed connection `runs` times, then its timed one `runs` times. Untimed: the
    program's own cost, one mean per batch. Timed: every run is timed into the variant's
    own zl_latency, so its histogram holds every single decision (the timed section: from
    after the tuple hash to the end, the route's maps, the trie, the weight and the socket,
    plus one clock read). Run with the kernel's run-time accounting off; run_cnt shows
    whether anyone else held it on meanwhile.
    """
    batches = COHORT_BATCHES if batches is None else batches
    runs = COHORT_BATCH_RUNS if runs is None else runs
    engine = _engine_socket(stack)
    routers = [
        _cohort_router(stack, bpffs, workdir, object_path, route, local_port, engine, variant)
        for variant in variants
    ]
    samples = {router["variant"]["name"]: {"untimed": [], "timed": []} for router in routers}
    before = {}
    with contextlib.ExitStack() as fds:
        for router in routers:
            router["fd"] = fds.enter_context(opened(router["layout"].prog))
            name = router["variant"]["name"]
            before[name] = {
                "buckets": read_latency_buckets(router["layout"]),
                "counters": _path_counters(router["layout"], router["route_index"]),
                "run_cnt": bpf_syscall.prog_info(router["fd"])["run_cnt"],
            }
        for batch in range(batches):
            for router in routers if batch % 2 == 0 else routers[::-1]:
                taken = samples[router["variant"]["name"]]
                for ctx in ("untimed", "timed"):
                    duration = bpf_syscall.prog_test_run(router["fd"], router[ctx], repeat=runs)[2]
                    taken[ctx].append(duration)
        stats_held = {
            router["variant"]["name"]: bpf_syscall.prog_info(router["fd"])["run_cnt"]
            - before[router["variant"]["name"]]["run_cnt"]
            for router in routers
        }
    rows = []
    for router in routers:
        variant = router["variant"]
        name = variant["name"]
        buckets = [
            new - old
            for new, old in zip(read_latency_buckets(router["layout"]), before[name]["buckets"])
        ]
        counters = _path_counters(router["layout"], router["route_index"])
        untimed, timed = samples[name]["untimed"], samples[name]["timed"]
        baseline = samples[routers[0]["variant"]["name"]]["untimed"]
        rows.append(
            {
                "variant": name,
                "title": variant["title"],
                "always_direct": len(variant["always_direct"]),
                "never_direct": len(variant["never_direct"]),
                "holds_client": variant["holds_client"],
                "hash_mode": router["hash_mode"],
                "skips_trie": router["skips_trie"],
                "batch_means_ns": untimed,
                "timed_batch_means_ns": timed,
                "median_batch_mean_ns": statistics.median(untimed),
                "mean_ns": statistics.fmean(untimed),
                "p99_batch_mean_ns": nearest_rank(untimed, 0.99),
                "above_none_ns": statistics.median(
                    mine - theirs for mine, theirs in zip(untimed, baseline)
                ),
                "timed_median_batch_mean_ns": statistics.median(timed),
                "histogram_count": sum(buckets),
                "buckets": {str(2 ** (b + 1)): count for b, count in enumerate(buckets) if count},
                "p50_ns": histogram_percentile(buckets, 0.50),
                "p99_ns": histogram_percentile(buckets, 0.99),
                "p99_interpolated_ns": interpolated_percentile(buckets, 0.99),
                "counters": {
                    field: value - before[name]["counters"].get(field, 0)
                    for field, value in counters.items()
                },
                "clients_noted": clients_noted(router["layout"], router["route_index"]),
                "run_cnt_while_measured": stats_held[name],
            }
        )
    return {
        "batches": batches,
        "runs_per_batch": runs,
        "client": CLIENT_ADDRESS,
        "run_time_stats_held_by_another": any(stats_held.values()),
        "rows": rows,
    }


# New clients of a route that hashes by client


def with_remote_address(ctx, address):
    """ctx (a struct bpf_sk_lookup of IPv4) with its remote address replaced."""
    changed = bytearray(ctx)
    struct.pack_into("=I", changed, 16, _ipv4_field(address))
    return bytes(changed)


def _pair_figures(new, known):
    return {
        "new_median_ns": statistics.median(new),
        "known_median_ns": statistics.median(known),
        "insert_ns": statistics.median(n - k for n, k in zip(new, known)),
        "new_p99_ns": nearest_rank(new, 0.99),
        "known_p99_ns": nearest_rank(known, 0.99),
    }


def new_client_costs(stack, bpffs, workdir, object_path, route, local_port, pairs=None):
    """What a decision costs a hash-by-client route for a client it has never seen (the
    zl_clients insert) against one it knows (one lookup, no write), by BPF_PROG_TEST_RUN.

    One run per call, in pairs: a new address (10.0.0.0 counting up), then the known client
    127.0.0.1; the kernel's duration of one run includes its own timer's overhead, the same
    for both, so the median of the pairs' differences is the insert. Two phases: with the
    table below its bound, then once the new addresses have filled it (MAX_CLIENTS), where
    each insert evicts the least recently seen address. One new address in 16 falls in the
    timed sample (its tuple hash), the known one never: the medians do not see it.
    """
    pairs = NEW_CLIENT_PAIRS if pairs is None else pairs
    engine = _engine_socket(stack)
    router = _cohort_router(
        stack,
        bpffs,
        workdir,
        object_path,
        route,
        local_port,
        engine,
        cohort_variant(HASH_CLIENT_VARIANT),
        prefix=NEW_CLIENT_PREFIX,
    )
    known = router["untimed"]
    first = int(ipaddress.ip_address(NEW_CLIENT_FIRST))
    made = 0

    def new_ctx():
        nonlocal made
        made += 1
        return with_remote_address(known, str(ipaddress.ip_address(first + made - 1)))

    phases = {}
    with opened(router["layout"].prog) as fd:
        bpf_syscall.prog_test_run(fd, known)  # the known client is noted once, here
        for phase, fill_to in (("below_bound", 0), ("at_bound", MAX_CLIENTS)):
            while made < fill_to:
                bpf_syscall.prog_test_run(fd, new_ctx())
            new, same = [], []
            for _pair in range(pairs):
                new.append(bpf_syscall.prog_test_run(fd, new_ctx())[2])
                same.append(bpf_syscall.prog_test_run(fd, known)[2])
            phases[phase] = {
                **_pair_figures(new, same),
                "addresses_before": made - pairs,
                "noted_after": clients_noted(router["layout"], router["route_index"]),
            }
    return {
        "pairs": pairs,
        "bound": MAX_CLIENTS,
        "first_address": NEW_CLIENT_FIRST,
        "known_client": CLIENT_ADDRESS,
        "hash_mode": router["hash_mode"],
        "pin_dir": router["layout"].pin_dir,
        "phases": phases,
    }
