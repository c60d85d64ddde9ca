# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Per-route counters and the decision-time histogram, summed over CPUs; the client
addresses a hash-by-client route decided (zl_clients), counted per path."""

from __future__ import annotations

import os

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    CLIENTS_MAP,
    COHORT_COUNTERS_MAP,
    COUNTERS_MAP,
    LATENCY_MAP,
    has_map,
    opened_map,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    CLIENT_KEY,
    CLIENT_SEEN,
    COHORT_COUNTER_FIELDS,
    COHORT_COUNTERS_VALUE,
    COUNTER_FIELDS,
    COUNTERS_VALUE,
    LATENCY_BUCKETS,
    LATENCY_SAMPLE_EVERY,
    LATENCY_VALUE,
    MAX_CLIENTS,
    PORT_KEY,
    weight_word,
)


def _per_cpu_values(fd, key, value_struct, cpus):
    """Values of one per-CPU map slot, one per possible CPU (each padded to 8 bytes)."""
    stride = (value_struct.size + 7) // 8 * 8
    raw = bpf_syscall.map_lookup(fd, key, stride * cpus)
    if raw is None:
        return []
    return [value_struct.unpack_from(raw, cpu * stride) for cpu in range(cpus)]


def sum_counters(per_cpu):
    """Add per-CPU counter tuples into one {field: total}."""
    totals = dict.fromkeys(COUNTER_FIELDS, 0)
    for values in per_cpu:
        for field, value in zip(COUNTER_FIELDS, values):
            totals[field] += value
    return totals


def _route_totals(fd, key, cpus):
    """zl_counters totals of one route key, from an open fd of the map."""
    return sum_counters(_per_cpu_values(fd, key, COUNTERS_VALUE, cpus))


def _cohort_totals(fd, key, cpus):
    """zl_cohort_ctrs totals of one route key, from an open fd of the map."""
    totals = dict.fromkeys(COHORT_COUNTER_FIELDS, 0)
    for values in _per_cpu_values(fd, key, COHORT_COUNTERS_VALUE, cpus):
        for field, value in zip(COHORT_COUNTER_FIELDS, values):
            totals[field] += value
    return totals


def read_counters(layout, route_index):
    """{lookups, to_engine, to_proxy_by_weight, fallback_no_socket, assign_errors} of one route."""
    cpus = bpf_syscall.possible_cpus()
    with opened_map(layout, COUNTERS_MAP, read_only=True) as fd:
        return _route_totals(fd, PORT_KEY.pack(route_index), cpus)


def read_cohort_counters(layout, route_index):
    """{to_engine_opt_in, to_proxy_opt_out} of one route (zl_cohort_ctrs, layout 3;
    None on older pins). to_engine_opt_in is part of to_engine; to_proxy_opt_out is in no
    zl_counters field (lookups = to_engine + to_proxy_by_weight + fallback_no_socket +
    assign_errors + to_proxy_opt_out)."""
    if not has_map(layout, COHORT_COUNTERS_MAP):
        return None
    cpus = bpf_syscall.possible_cpus()
    with opened_map(layout, COHORT_COUNTERS_MAP, read_only=True) as fd:
        return _cohort_totals(fd, PORT_KEY.pack(route_index), cpus)


# The program counts a cohort's connection in two maps, zl_counters first and zl_cohort_ctrs a
# moment later, and a read takes one map at a time: under load, a read of both can count a
# connection in one and not the other, which a cohort stage's split at weight 0 would take for
# a connection the weight sent direct. The pair is read until zl_counters is the same on both
# sides of the cohort read: no connection was counted between, so the cohort counts are those
# of the connections in zl_counters.
CONSISTENT_READ_ATTEMPTS = 8


def consistent_counts(read_route, read_cohort, attempts=CONSISTENT_READ_ATTEMPTS):
    """(route counters, cohort counters) read as one snapshot: read_route, read_cohort,
    read_route again, until both route reads agree (at most `attempts` times; the last pair
    otherwise, which is off by the few connections counted during the read)."""
    counters = read_route()
    for _attempt in range(max(1, attempts)):
        cohort = read_cohort()
        again = read_route()
        if again == counters:
            break
        counters = again
    return counters, cohort


def read_route_counters(layout, route_index):
    """(zl_counters totals, zl_cohort_ctrs totals or None on older pins) of one route, as one
    snapshot (consistent_counts)."""
    if not has_map(layout, COHORT_COUNTERS_MAP):
        return read_counters(layout, route_index), None
    # Both maps opened (and checked) once for all the reads of the snapshot.
    cpus = bpf_syscall.possible_cpus()
    key = PORT_KEY.pack(route_index)
    with opened_map(layout, COUNTERS_MAP, read_only=True) as route_fd:
        with opened_map(layout, COHORT_COUNTERS_MAP, read_only=True) as cohort_fd:
            return consistent_counts(
                lambda: _route_totals(route_fd, key, cpus),
                lambda: _cohort_totals(cohort_fd, key, cpus),
            )


def read_client_entries(layout):
    """Every zl_clients entry as {raw key: (weight word, direct)}; {} on pins without it.

    The program adds entries and the LRU drops them while this walks the map, and a key
    dropped under the walk makes the kernel start again from the first key: each key is
    kept once, and the walk ends after twice the map's capacity of steps whatever happens.
    """
    entries = {}
    if not has_map(layout, CLIENTS_MAP):
        return entries
    with opened_map(layout, CLIENTS_MAP, read_only=True) as fd:
        key = bpf_syscall.map_next_key(fd, None, CLIENT_KEY.size)
        for _step in range(2 * MAX_CLIENTS):
            if key is None:
                break
            if key not in entries:
                raw = bpf_syscall.map_lookup(fd, key, CLIENT_SEEN.size)
                if raw is not None:
                    entries[key] = CLIENT_SEEN.unpack(raw)
            key = bpf_syscall.map_next_key(fd, key, CLIENT_KEY.size)
    return entries


def client_route_index(key):
    """The route index of a zl_clients key."""
    return CLIENT_KEY.unpack_from(key)[0]


def count_client_addresses(entries, routes):
    """{route_index: {to_engine, to_proxy}} of each route: the client addresses it decided
    at its current weight word (read_client_entries), by the path they took.

    An address decided at another weight is noted again, with the new word, at its next
    connection: after a weight change the counts grow with the clients that come. An entry
    of an earlier stretch at the same word counts too: the hash gives an address the same
    path at the same weight.
    """
    words = {route.route_index: weight_word(route.weight_bp, route.opt_in) for route in routes}
    counts = {index: {"to_engine": 0, "to_proxy": 0} for index in words}
    for key, (word, direct) in entries.items():
        index = client_route_index(key)
        if index in words and words[index] == word:
            counts[index]["to_engine" if direct else "to_proxy"] += 1
    return counts


def read_latency_buckets(layout):
    """Timed decisions per log2 bucket: element b counts those of [2^b, 2^(b+1)) ns."""
    cpus = bpf_syscall.possible_cpus()
    buckets = [0] * LATENCY_BUCKETS
    with opened_map(layout, LATENCY_MAP, read_only=True) as fd:
        for bucket in range(LATENCY_BUCKETS):
            for (count,) in _per_cpu_values(fd, PORT_KEY.pack(bucket), LATENCY_VALUE, cpus):
                buckets[bucket] += count
    return buckets


def bucket_upper_bound_ns(bucket):
    return 2 ** (bucket + 1)


def _quantile_position(buckets, quantile):
    """(bucket, rank inside it, its count) of the quantile (0 < q <= 1); None when empty."""
    if not 0 < quantile <= 1:
        raise ValueError("quantile must be in (0, 1]")
    total = sum(buckets)
    if total == 0:
        return None
    rank = quantile * total
    seen = 0
    for bucket, count in enumerate(buckets):
        if count and seen + count >= rank:
            return bucket, rank - seen, count
        seen += count
    return len(buckets) - 1, 1.0, 1


def histogram_percentile(buckets, quantile):
    """Upper bound in ns of the bucket holding the quantile (0 < q <= 1); None when empty.

    A log2 histogram cannot say more than "at most this": the bound errs high by
    less than a factor of two, never low.
    """
    position = _quantile_position(buckets, quantile)
    return None if position is None else bucket_upper_bound_ns(position[0])


def interpolated_percentile(buckets, quantile):
    """The quantile in ns, interpolated linearly inside its bucket; None when empty.

    The same estimate Prometheus' histogram_quantile() makes from the exported
    histogram (and so what the canary gates judge): it assumes the observations
    spread evenly over the bucket, so it can err either way within the bucket.
    """
    position = _quantile_position(buckets, quantile)
    if position is None:
        return None
    bucket, rank_inside, count = position
    lower = 0 if bucket == 0 else 2**bucket
    upper = bucket_upper_bound_ns(bucket)
    return lower + (upper - lower) * rank_inside / count


def latency_summary(buckets):
    """count, p50/p99 (bucket upper bounds, ns) and the non-empty buckets as {le_ns, count}.

    The program times a sample of its decisions (one in sampled_one_in, chosen by the
    4-tuple): count is the number of timed decisions, not of all decisions.
    """
    return {
        "count": sum(buckets),
        "sampled_one_in": LATENCY_SAMPLE_EVERY,
        "p50_ns": histogram_percentile(buckets, 0.50),
        "p99_ns": histogram_percentile(buckets, 0.99),
        "buckets": [
            {"le_ns": bucket_upper_bound_ns(bucket), "count": count}
            for bucket, count in enumerate(buckets)
            if count
        ],
    }


class RunTimeStats:
    """Keeps the kernel's per-program run_time_ns/run_cnt accounting on while open.

    BPF_ENABLE_STATS counts as a holder of the kernel.bpf_stats_enabled switch
    without writing the sysctl; it needs CAP_SYS_ADMIN and costs roughly 20 ns per
    run of every BPF program on the node while any holder keeps it on.
    """

    def __init__(self):
        self.fd = None

    def __enter__(self):
        self.fd = bpf_syscall.enable_run_time_stats()
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
