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

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.numbers import parse_number

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


# ---------------------------------------------------------------- a stage's measured split

COUNTER_FIELDS = ("lookups", "to_engine", "to_engine_opt_in", "to_proxy_opt_out")


def _route_counts(before, after):
    """{field: new count} of one route between two route_info reads (a counter that went
    down was reset with its route: all of after's count is new)."""
    old = (before or {}).get("counters") or {}
    new = after.get("counters") or {}
    counts = {}
    for field in COUNTER_FIELDS:
        now, then = int(new.get(field) or 0), int(old.get(field) or 0)
        counts[field] = now - then if now >= then else now
    return counts


def stage_counts(before_routes, after_routes):
    """What a stage's routes saw between the read-back (before) and now (after), both
    route_info route lists of the canary's routes.

    Connections of a cohort do not follow the weight: `opt_in` (always_direct, handed to an
    engine) and `opt_out` (never_direct, left to the proxy) are counted apart, and the
    weight's draws `n` and its hits `k` leave them out. A route that hashes by connection
    gives a draw per new connection; one that hashes by client a draw per client address the
    weight decided at this weight (route_info's `clients`), so the sum stays binomial.
    """
    before_by_name = {route["name"]: route for route in before_routes or []}
    totals = {"connections": 0, "by_weight": 0, "opt_in": 0, "opt_out": 0, "addresses": 0}
    n = k = 0
    for route in after_routes or []:
        counts = _route_counts(before_by_name.get(route["name"]), route)
        opt_in, opt_out = counts["to_engine_opt_in"], counts["to_proxy_opt_out"]
        by_weight = max(0, counts["lookups"] - opt_in - opt_out)
        totals["connections"] += counts["lookups"]
        totals["by_weight"] += by_weight
        totals["opt_in"] += opt_in
        totals["opt_out"] += opt_out
        if route.get("hash") == "client":
            clients = route.get("clients") or {}
            addresses = int(clients.get("to_engine") or 0) + int(clients.get("to_proxy") or 0)
            totals["addresses"] += addresses
            n += addresses
            k += int(clients.get("to_engine") or 0)
        else:
            n += by_weight
            k += max(0, counts["to_engine"] - opt_in)
    totals.update(n=n, k=k)
    return totals


def stage_split(
    before_routes,
    after_routes,
    weight_pct,
    cohort_stage=False,
    min_connections=0,
    sigmas=4,
    floor_pct=0.5,
):
    """A node's measured split at a stage, with `ok`, a one-line `detail`, and `sample`: the
    count the stage waits for before judging (the cohort's connections handed to an engine at
    a cohort stage, else the new connections the weight decided).

    A weight stage: the weight's hits among its draws, inside the binomial range of the
    weight, over at least min_connections new connections the weight decided. A cohort stage
    (weight 0): at least min_connections of the cohort's connections reached an engine, and
    the weight sent none direct (at weight 0 it cannot: one is a router that ignores it).
    """
    counts = stage_counts(before_routes, after_routes)
    least = int(_number_in(min_connections, "min_connections", 0, math.inf, "a count >= 0"))
    n, k = counts["n"], counts["k"]
    if cohort_stage:
        measured = round(100.0 * k / n, 3) if n else 0.0
        verdict = {
            "ok": counts["opt_in"] >= least and k == 0,
            "cohort": True,
            "measured_pct": measured,
            "low_pct": 0.0,
            "high_pct": 0.0,
            "weight_pct": 0.0,
        }
        detail = (
            "%d connections of the cohort reached an engine (at least %d wanted), %d of %d "
            "others were sent direct by the weight (0 wanted)" % (counts["opt_in"], least, k, n)
        )
    else:
        verdict = split_verdict(k, n, weight_pct, sigmas, floor_pct)
        verdict["weight_pct"] = float(weight_pct)
        if counts["by_weight"] < least:
            verdict["ok"] = False
        detail = "%s%% of %d connections%s (agreeing range %s-%s%%), %d wanted at least" % (
            verdict["measured_pct"],
            counts["by_weight"],
            " (hash: client routes counted by their %d client addresses)" % counts["addresses"]
            if counts["addresses"]
            else "",
            verdict["low_pct"],
            verdict["high_pct"],
            least,
        )
    verdict.update(
        connections=counts["by_weight"] if not cohort_stage else counts["connections"],
        addresses=counts["addresses"],
        to_engine=k,
        opt_in=counts["opt_in"],
        opt_out=counts["opt_out"],
        sample=counts["opt_in"] if cohort_stage else counts["by_weight"],
        detail=detail,
    )
    return verdict
