"""Percentiles from the log2 decision-time histogram; the route and cohort counters read as one
snapshot."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    consistent_counts,
    histogram_percentile,
    interpolated_percentile,
    latency_summary,
    sum_counters,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    LATENCY_BUCKETS,
)


def buckets_with(**counts):
    buckets = [0] * LATENCY_BUCKETS
    for name, count in counts.items():
        buckets[int(name[1:])] = count
    return buckets


def test_empty_histogram_has_no_percentiles():
    assert histogram_percentile([0] * LATENCY_BUCKETS, 0.5) is None
    assert latency_summary([0] * LATENCY_BUCKETS) == {
        "count": 0,
        "sampled_one_in": 16,
        "p50_ns": None,
        "p99_ns": None,
        "buckets": [],
    }


def test_percentile_is_the_upper_bound_of_its_bucket():
    # 90 decisions in [256, 512) ns, 9 in [1024, 2048), 1 in [65536, 131072)
    buckets = buckets_with(b8=90, b10=9, b16=1)
    assert histogram_percentile(buckets, 0.5) == 512
    assert histogram_percentile(buckets, 0.9) == 512
    assert histogram_percentile(buckets, 0.99) == 2048
    assert histogram_percentile(buckets, 1.0) == 131072


def test_summary_lists_non_empty_buckets():
    summary = latency_summary(buckets_with(b0=1, b9=3))
    assert summary["count"] == 4
    assert summary["p50_ns"] == 1024
    assert summary["buckets"] == [{"le_ns": 2, "count": 1}, {"le_ns": 1024, "count": 3}]


@pytest.mark.parametrize("quantile", [0, -0.1, 1.01])
def test_quantile_out_of_range(quantile):
    with pytest.raises(ValueError):
        histogram_percentile(buckets_with(b1=1), quantile)


def test_counters_are_summed_over_cpus():
    totals = sum_counters([(10, 3, 7, 0, 0), (5, 1, 2, 1, 1)])
    assert totals == {
        "lookups": 15,
        "to_engine": 4,
        "to_proxy_by_weight": 9,
        "fallback_no_socket": 1,
        "assign_errors": 1,
    }


def test_interpolated_percentile_spreads_counts_over_the_bucket():
    # 98 decisions in [256, 512) ns, 2 in [512, 1024): p99 is half-way into the second.
    buckets = buckets_with(b8=98, b9=2)
    assert interpolated_percentile(buckets, 0.99) == 768
    assert interpolated_percentile(buckets, 0.49) == 384
    assert interpolated_percentile([0] * LATENCY_BUCKETS, 0.5) is None
    # Bucket 0 covers [0, 2) ns.
    assert interpolated_percentile(buckets_with(b0=4), 0.5) == 1


def scripted(values):
    """A reader that returns the given values in turn."""
    calls = iter(values)
    return lambda: next(calls)


def test_counters_read_as_one_snapshot_when_nothing_was_counted_during_the_read():
    route = scripted([{"to_engine": 5}, {"to_engine": 5}])
    cohort = scripted([{"to_engine_opt_in": 5}])
    assert consistent_counts(route, cohort) == ({"to_engine": 5}, {"to_engine_opt_in": 5})


def test_a_connection_counted_during_the_read_is_read_again_on_both_maps():
    # The cohort read saw a 6th opt-in connection that the first route read had not counted:
    # taken as is, the split would say the weight sent one direct (5 - 6 + 1). The second
    # route read differs, so the pair is read again.
    route = scripted([{"to_engine": 5}, {"to_engine": 6}, {"to_engine": 6}])
    cohort = scripted([{"to_engine_opt_in": 6}, {"to_engine_opt_in": 6}])
    assert consistent_counts(route, cohort) == ({"to_engine": 6}, {"to_engine_opt_in": 6})


def test_a_read_that_never_settles_ends_after_its_attempts_with_the_last_pair():
    route = scripted([{"to_engine": count} for count in range(10)])
    cohort = scripted([{"to_engine_opt_in": count} for count in range(10)])
    assert consistent_counts(route, cohort, attempts=3) == (
        {"to_engine": 3},
        {"to_engine_opt_in": 2},
    )
