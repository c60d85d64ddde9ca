"""The measured-split check: binomial bounds, checked against the exact distribution.

The exact reference sums binomial probabilities in rational arithmetic, so it shares no code
and no floating-point shortcut with the function under test.
"""

from fractions import Fraction
from math import comb

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.filter.split_verdict import split_verdict
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    traffic_split as ts,
)

FOUR_SIGMA_TAIL = Fraction(ts.tail_share(4))


def exact_pmf(n, weight_pct):
    p = Fraction(weight_pct).limit_denominator(10_000) / 100
    return [comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]


def exact_bounds(n, weight_pct, tail=FOUR_SIGMA_TAIL):
    pmf = exact_pmf(n, weight_pct)
    below = above = Fraction(0)
    low = next(k for k in range(n + 1) if (below := below + pmf[k]) > tail)
    high = next(k for k in range(n, -1, -1) if (above := above + pmf[k]) > tail)
    return low, high


@pytest.mark.parametrize(
    "n, weight",
    [
        (126, 1),
        (100, 1),
        (200, 5),
        (1000, 20),
        (500, 50),
        (1000, 99),
        (10, 1),
        (1, 50),
        (300, 0.01),
    ],
)
def test_bounds_are_the_exact_binomial_ones(n, weight):
    assert ts.count_bounds(n, weight, 4) == exact_bounds(n, weight)


@pytest.mark.parametrize("n, weight", [(126, 1), (400, 5), (1000, 20)])
def test_the_range_leaves_out_at_most_the_tail_on_each_side_and_no_less_than_it_must(n, weight):
    pmf = exact_pmf(n, weight)
    low, high = ts.count_bounds(n, weight, 4)
    assert sum(pmf[:low]) <= FOUR_SIGMA_TAIL
    assert sum(pmf[high + 1 :]) <= FOUR_SIGMA_TAIL
    # One count narrower on either side would leave out more than the tail.
    if low < n:
        assert sum(pmf[: low + 1]) > FOUR_SIGMA_TAIL
    if high > 0:
        assert sum(pmf[high:]) > FOUR_SIGMA_TAIL


def test_a_healthy_one_percent_node_the_normal_curve_would_stop_agrees():
    # 6 of 126 at 1 %: 4.1 normal deviations out, but 1 try in 560 on a healthy router.
    verdict = ts.split_verdict(6, 126, 1, 4, 0.5)
    assert verdict["ok"]
    assert verdict["measured_pct"] == pytest.approx(4.762)
    assert verdict["high_pct"] == pytest.approx(100 * 8 / 126, abs=0.001)
    assert not ts.split_verdict(9, 126, 1, 4, 0.5)["ok"]


def test_large_counts_land_near_the_normal_curve():
    n, p = 1_000_000, 0.2
    low, high = ts.count_bounds(n, 20, 4)
    sigma = (n * p * (1 - p)) ** 0.5
    assert (n * p - low) / sigma == pytest.approx(4, abs=0.05)
    assert (high - n * p) / sigma == pytest.approx(4, abs=0.05)


def test_weights_zero_and_one_hundred_allow_no_stray_connection_without_a_floor():
    assert ts.split_verdict(0, 10_000, 0, 4, 0)["ok"]
    assert not ts.split_verdict(1, 10_000, 0, 4, 0)["ok"]
    assert ts.split_verdict(10_000, 10_000, 100, 4, 0)["ok"]
    assert not ts.split_verdict(9_999, 10_000, 100, 4, 0)["ok"]


def test_the_floor_widens_the_range_and_no_connections_never_agree():
    verdict = ts.split_verdict(0, 1_000_000, 50, 4, 0.5)
    assert (verdict["low_pct"], verdict["high_pct"]) == (49.5, 50.5)
    assert not verdict["ok"]
    assert ts.split_verdict(0, 0, 5, 4, 0.5) == {
        "ok": False,
        "measured_pct": None,
        "low_pct": None,
        "high_pct": None,
    }


@pytest.mark.parametrize(
    "args, field",
    [
        ((250, 126, 1, 4, 0.5), "to_engine"),
        ((6, -1, 1, 4, 0.5), "connections"),
        ((6, 126, 250, 4, 0.5), "weight_pct"),
        ((6, 126, "abc", 4, 0.5), "weight_pct"),
        ((6, 126, 1, 0, 0.5), "sigmas"),
        ((6, 126, 1, 4, -1), "floor_pct"),
        ((True, 126, 1, 4, 0.5), "to_engine"),
    ],
)
def test_bad_input_names_the_field(args, field):
    with pytest.raises(FleetError, match="^%s must be" % field) as raised:
        ts.split_verdict(*args)
    assert raised.value.details["field"] == field


def test_the_filter_takes_the_playbook_defaults_and_names_bad_fields():
    assert split_verdict(6, 126, 1)["ok"]
    assert split_verdict(3, 126, 1, sigmas=1, floor_pct=0)["ok"] is False
    with pytest.raises(AnsibleFilterError, match="split_verdict: weight_pct must be"):
        split_verdict(6, 126, 101)
