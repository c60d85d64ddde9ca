# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see https://www.apache.org/licenses/LICENSE-2.0)
"""Whether a measured split of new connections agrees with the weight that was written.

The router sends each new connection to the engine when the hash of its 4-tuple falls under
the weight, so out of n connections the count sent to the engine is binomial(n, p) with
p = weight / 100. The bounds come from that distribution itself, not from the normal curve:
at a 1 % weight over about a hundred connections the normal curve's tails are far too thin
(6 of 126 to the engine lies 4 normal deviations out, yet happens about once in 560 tries),
and a canary over many nodes would stop on a healthy router.

`sigmas` keeps its familiar meaning: the bounds leave out as much of each tail as a normal
distribution leaves beyond that many standard deviations (4: about 3 in 100,000 per side).
"""

from __future__ import annotations

import math

from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.gates import parse_number

# Probabilities of the counts far out in the tails are left out once they fall under this
# share of the tail being bounded; the sum they leave out is smaller still.
NEGLIGIBLE = 1e-15


def tail_share(sigmas):
    """The share of a normal distribution beyond `sigmas` deviations on one side."""
    return 0.5 * math.erfc(sigmas / math.sqrt(2.0))


def _probabilities(n, p, smallest):
    """{count: P(X = count)} for X ~ binomial(n, p), from the mode outwards until the terms
    fall under `smallest` (beyond that they only shrink, faster than geometrically)."""
    mode = min(n, int((n + 1) * p))
    log_mode = (
        math.lgamma(n + 1)
        - math.lgamma(mode + 1)
        - math.lgamma(n - mode + 1)
        + mode * math.log(p)
        + (n - mode) * math.log1p(-p)
    )
    probabilities = {mode: math.exp(log_mode)}
    ratio_down = (1 - p) / p
    value, count = probabilities[mode], mode
    while count > 0 and value >= smallest:
        value *= count * ratio_down / (n - count + 1)
        count -= 1
        probabilities[count] = value
    value, count = probabilities[mode], mode
    while count < n and value >= smallest:
        value *= (n - count) / (ratio_down * (count + 1))
        count += 1
        probabilities[count] = value
    return probabilities


def count_bounds(connections, weight_pct, sigmas):
    """(low, high): the engine counts out of `connections` that agree with `weight_pct`,
    leaving out at most tail_share(sigmas) of the binomial distribution on each side."""
    n = int(connections)
    p = float(weight_pct) / 100.0
    if n <= 0 or p <= 0.0:
        return 0, 0
    if p >= 1.0:
        return n, n
    tail = tail_share(sigmas)
    probabilities = _probabilities(n, p, tail * NEGLIGIBLE)
    counts = sorted(probabilities)
    low, below = counts[0], 0.0
    for count in counts:
        below += probabilities[count]
        if below > tail:
            low = count
            break
    high, above = counts[-1], 0.0
    for count in reversed(counts):
        above += probabilities[count]
        if above > tail:
            high = count
            break
    return low, high


def _number_in(value, field, low, high, allowed):
    number = parse_number(value, field)
    if not low <= number <= high:
        raise FleetError("%s must be %s; got %r" % (field, allowed, value), {"field": field})
    return number


def split_verdict(to_engine, connections, weight_pct, sigmas, floor_pct):
    """The measured split against the weight: a dict with `ok`, `measured_pct`, and the
    agreeing range `low_pct`-`high_pct` (the binomial bounds, never narrower than
    weight +/- floor_pct). No connections at all never agrees."""
    n = int(_number_in(connections, "connections", 0, math.inf, "a count >= 0"))
    k = int(_number_in(to_engine, "to_engine", 0, n, "a count between 0 and connections (%d)" % n))
    weight = _number_in(weight_pct, "weight_pct", 0, 100, "a percentage between 0 and 100")
    deviations = _number_in(sigmas, "sigmas", 1e-9, math.inf, "a number > 0")
    floor = _number_in(floor_pct, "floor_pct", 0, 100, "a percentage between 0 and 100")
    if n == 0:
        return {"ok": False, "measured_pct": None, "low_pct": None, "high_pct": None}
    low, high = count_bounds(n, weight, deviations)
    measured = 100.0 * k / n
    return {
        "ok": low <= k <= high or abs(measured - weight) <= floor,
        "measured_pct": round(measured, 3),
        "low_pct": round(max(0.0, min(100.0 * low / n, weight - floor)), 3),
        "high_pct": round(min(100.0, max(100.0 * high / n, weight + floor)), 3),
    }
