# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Canary gates: definitions, one evaluation, and the stage's decision.

Pure logic, no Ansible: the module, playbooks' progress display and tests all
call these functions.

An evaluation has three outcomes (the verdict):
  pass  every gate passed (or had no data and does not require it),
  fail  at least one gate measured a value on the wrong side of its threshold,
  hold  nothing failed, but some gate could not tell: no data, too few samples,
        NaN, or Prometheus errored, timed out or was unreachable.
Missing telemetry is never a failure. The decision says what the rollout does now:
  continue  keep holding and evaluate again,
  complete  the hold time (extended by the time spent in `hold`) is over and the
            latest evaluation passed,
  rollback  a failure limit (consecutive or cumulative within the stage) was hit,
  pause     evaluations stayed inconclusive beyond the limit: a person decides.
Rollback and pause latch: later evaluations of the same stage keep that decision
until the history is reset.
"""

from __future__ import annotations

import copy
import datetime
import math
import operator
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_timestamp,
    seconds_between,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.numbers import parse_number

COMPARISONS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
VERDICTS = ("pass", "fail", "hold")
DECISIONS = ("continue", "complete", "rollback", "pause")
GATE_KEYS = (
    "name",
    "query",
    "comparison",
    "threshold",
    "min_samples_query",
    "min_samples",
    "require_data",
    "description",
)
PLACEHOLDERS = ("stage_start", "stage_elapsed", "stage_nodes", "window")
PLACEHOLDER_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
GATE_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HISTORY_FORMAT = 1
HISTORY_KEEP = 200
UNREACHABLE_KINDS = ("unreachable", "timeout")


# ---------------------------------------------------------------- definitions


def _require_query(value, field):
    if not isinstance(value, str) or not value.strip():
        raise FleetError(
            "%s must be a non-empty PromQL expression; got %r" % (field, value), {"field": field}
        )
    for name in PLACEHOLDER_PATTERN.findall(value):
        if name not in PLACEHOLDERS:
            raise FleetError(
                "%s uses ${%s}; the placeholders are %s"
                % (field, name, ", ".join("${%s}" % known for known in PLACEHOLDERS)),
                {"field": field},
            )
    return value.strip()


class Gate:
    """One gate: `query` <comparison> `threshold` must hold for every series."""

    def __init__(
        self,
        name,
        query,
        comparison,
        threshold,
        min_samples_query=None,
        min_samples=None,
        require_data=True,
        description=None,
    ):
        self.name = name
        self.query = query
        self.comparison = comparison
        self.threshold = threshold
        self.min_samples_query = min_samples_query
        self.min_samples = min_samples
        self.require_data = require_data
        self.description = description

    def passes(self, value):
        return COMPARISONS[self.comparison](value, self.threshold)

    def worst(self, samples):
        """The sample closest to failing: the largest for < and <=, the smallest for > and >=."""
        pick = max if self.comparison in ("<", "<=") else min
        return pick(samples, key=lambda sample: sample.value)

    def as_dict(self):
        data = {
            "name": self.name,
            "query": self.query,
            "comparison": self.comparison,
            "threshold": self.threshold,
            "require_data": self.require_data,
        }
        if self.min_samples_query is not None:
            data["min_samples_query"] = self.min_samples_query
            data["min_samples"] = self.min_samples
        if self.description is not None:
            data["description"] = self.description
        return data


def validate_gate(definition, field):
    """A Gate from one definition (a dict); every error names the field."""
    if not isinstance(definition, dict):
        raise FleetError(
            "%s must be a dict with the keys %s; got %r"
            % (field, ", ".join(GATE_KEYS), definition),
            {"field": field},
        )
    unknown = sorted(set(definition) - set(GATE_KEYS))
    if unknown:
        raise FleetError(
            "%s has unknown key(s) %s; allowed keys: %s"
            % (field, ", ".join(unknown), ", ".join(GATE_KEYS)),
            {"field": field},
        )
    name = definition.get("name")
    if not isinstance(name, str) or not GATE_NAME_PATTERN.match(name):
        raise FleetError(
            "%s.name must be 1-64 characters of letters, digits, '.', '_' or '-', starting "
            "with a letter or digit; got %r" % (field, name),
            {"field": field + ".name"},
        )
    query = _require_query(definition.get("query"), field + ".query")
    comparison = definition.get("comparison")
    if comparison not in COMPARISONS:
        raise FleetError(
            "%s.comparison must be one of %s; got %r"
            % (field, ", ".join(repr(c) for c in COMPARISONS), comparison),
            {"field": field + ".comparison"},
        )
    if "threshold" not in definition:
        raise FleetError(
            "%s.threshold is required (a number)" % field, {"field": field + ".threshold"}
        )
    threshold = parse_number(definition["threshold"], field + ".threshold")
    min_samples_query = definition.get("min_samples_query")
    min_samples = definition.get("min_samples")
    if min_samples_query is not None or min_samples is not None:
        if min_samples_query is None or min_samples is None:
            missing = field + (".min_samples" if min_samples is None else ".min_samples_query")
            raise FleetError(
                "%s is required with %s: min_samples_query (PromQL counting samples) and "
                "min_samples (the smallest count that decides) go together"
                % (missing, "min_samples_query" if min_samples is None else "min_samples"),
                {"field": missing},
            )
        min_samples_query = _require_query(min_samples_query, field + ".min_samples_query")
        min_samples = parse_number(min_samples, field + ".min_samples")
        if min_samples < 0:
            raise FleetError(
                "%s.min_samples must be a number >= 0; got %r" % (field, definition["min_samples"]),
                {"field": field + ".min_samples"},
            )
    require_data = definition.get("require_data", True)
    if not isinstance(require_data, bool):
        raise FleetError(
            "%s.require_data must be true or false; got %r" % (field, require_data),
            {"field": field + ".require_data"},
        )
    description = definition.get("description")
    if description is not None and not isinstance(description, str):
        raise FleetError(
            "%s.description must be a string; got %r" % (field, description),
            {"field": field + ".description"},
        )
    return Gate(
        name,
        query,
        comparison,
        threshold,
        min_samples_query,
        min_samples,
        require_data,
        description,
    )


def validate_gates(definitions, field="gates"):
    """Gates from a non-empty list of definitions with unique names."""
    if not isinstance(definitions, (list, tuple)) or not definitions:
        raise FleetError(
            "%s must be a non-empty list of gate definitions (keys: %s)"
            % (field, ", ".join(GATE_KEYS)),
            {"field": field},
        )
    gates = []
    seen = set()
    for index, definition in enumerate(definitions):
        gate = validate_gate(definition, "%s[%d]" % (field, index))
        if gate.name in seen:
            raise FleetError(
                "%s[%d].name %r is used twice; gate names must be unique"
                % (field, index, gate.name),
                {"field": "%s[%d].name" % (field, index)},
            )
        seen.add(gate.name)
        gates.append(gate)
    return gates


def render_query(text, values, field="query"):
    """Replace ${stage_start}, ${stage_elapsed} and ${window} with their values."""

    def substitute(match):
        name = match.group(1)
        value = values.get(name)
        if value is None:
            raise FleetError(
                "%s uses ${%s} but no value is known for it (stage_start and stage_elapsed "
                "need the hold start)" % (field, name),
                {"field": field},
            )
        return str(value)

    return PLACEHOLDER_PATTERN.sub(substitute, text)


WINDOW_PATTERN = re.compile(r"^(\d+(ms|[smhdwy]))+$")


def validate_window(value, field="window"):
    """A PromQL duration such as 5m, 90s or 1h30m."""
    if not isinstance(value, str) or not WINDOW_PATTERN.match(value.strip()):
        raise FleetError(
            "%s must be a PromQL duration such as 30s, 5m or 1h30m (units ms, s, m, h, d, w, y); "
            "got %r" % (field, value),
            {"field": field},
        )
    return value.strip()


def check_placeholders(gates, values):
    """Render every query once, so a missing value fails before the first query is sent."""
    for gate in gates:
        render_query(gate.query, values, "gate %s query" % gate.name)
        if gate.min_samples_query is not None:
            render_query(gate.min_samples_query, values, "gate %s min_samples_query" % gate.name)


# ${stage_nodes} when the caller does not say which nodes the stage changed: every node.
EVERY_NODE = ".*"
# RE2's metacharacters: escaped so that a node name matches only itself.
_REGEX_SPECIAL = frozenset(".+*?()|[]{}^$")


def stage_nodes_pattern(nodes, field="stage_nodes"):
    """The nodes a stage changed, as the value of ${stage_nodes}.

    The result goes inside a double-quoted PromQL string of a regex matcher,
    `node=~"${stage_nodes}"`: the names joined with `|` (sorted, each once), every RE2
    metacharacter escaped with a backslash that is itself doubled for the PromQL string.
    None (the caller did not say) matches every node.
    """
    if nodes is None:
        return EVERY_NODE
    if isinstance(nodes, (str, bytes)) or not isinstance(nodes, (list, tuple)) or not nodes:
        raise FleetError(
            "%s must be a non-empty list of node names (the nodes whose weight the stage "
            "changed); got %r" % (field, nodes),
            {"field": field},
        )
    names = set()
    for index, node in enumerate(nodes):
        if (
            not isinstance(node, str)
            or not node
            or not node.isprintable()
            or '"' in node
            or "\\" in node
        ):
            raise FleetError(
                "%s[%d] must be a node name: a non-empty string of printable characters "
                "without '\"' or '\\'; got %r" % (field, index, node),
                {"field": "%s[%d]" % (field, index)},
            )
        names.add("".join("\\\\" + char if char in _REGEX_SPECIAL else char for char in node))
    return "|".join(sorted(names))


def placeholder_values(hold_started_at, now, window, stage_nodes=None):
    """Values for render_query: Unix seconds of the hold start, elapsed as a PromQL range,
    and the stage's nodes as a regex (stage_nodes_pattern; every node when None)."""
    values = {"window": window, "stage_nodes": stage_nodes_pattern(stage_nodes)}
    if hold_started_at is not None:
        values["stage_start"] = "%d" % int(hold_started_at.timestamp())
        values["stage_elapsed"] = "%ds" % max(1, int(seconds_between(hold_started_at, now)))
    return values


# ---------------------------------------------------------------- evaluation


def format_value(value):
    return "%.6g" % value


def _gate_result(gate, verdict, reason, query, value=None, worst=None, series=0, samples=None):
    return {
        "name": gate.name,
        "verdict": verdict,
        "reason": reason,
        "value": value,
        "worst_series": worst,
        "series": series,
        "samples": samples,
        "min_samples": gate.min_samples,
        "comparison": gate.comparison,
        "threshold": gate.threshold,
        "require_data": gate.require_data,
        "query": query,
    }


def _missing(gate, why, query, **extra):
    """No usable data: hold, unless the gate does not require data."""
    if gate.require_data:
        return _gate_result(gate, "hold", why, query, **extra)
    return _gate_result(gate, "pass", "%s, not required" % why, query, **extra)


def _count_samples(gate, query_fn, values):
    """The smallest count among the series of min_samples_query (0 with no series)."""
    samples_query = render_query(
        gate.min_samples_query, values, "gate %s min_samples_query" % gate.name
    )
    series = query_fn(samples_query)
    counts = [sample.value for sample in series if not math.isnan(sample.value)]
    return min(counts) if counts else 0.0


def evaluate_gate(gate, query_fn, values):
    """One gate's result dict. query_fn(promql) returns Samples or raises FleetError."""
    query = render_query(gate.query, values, "gate %s query" % gate.name)
    try:
        samples = None
        if gate.min_samples_query is not None:
            samples = _count_samples(gate, query_fn, values)
            if samples < gate.min_samples:
                why = "too few samples: %s < %s" % (
                    format_value(samples),
                    format_value(gate.min_samples),
                )
                return _missing(gate, why, query, samples=samples)
        series = query_fn(query)
    except FleetError as error:
        result = _gate_result(gate, "hold", error.message, query)
        result["error_kind"] = error.details.get("kind", "query")
        return result
    if not series:
        return _missing(gate, "no data", query, samples=samples)
    numbers = [sample for sample in series if not math.isnan(sample.value)]
    failing = [sample for sample in numbers if not gate.passes(sample.value)]
    if failing:
        worst = gate.worst(failing)
        reason = "%s is not %s %s at %s (%d of %d series fail)" % (
            format_value(worst.value),
            gate.comparison,
            format_value(gate.threshold),
            worst.label_text(),
            len(failing),
            len(series),
        )
        return _gate_result(
            gate, "fail", reason, query, worst.value, worst.labels, len(series), samples
        )
    if len(numbers) < len(series):
        nan = next(sample for sample in series if math.isnan(sample.value))
        return _missing(
            gate,
            "NaN at %s" % nan.label_text(),
            query,
            series=len(series),
            samples=samples,
            worst=nan.labels,
        )
    worst = gate.worst(numbers)
    reason = "%s %s %s" % (format_value(worst.value), gate.comparison, format_value(gate.threshold))
    if len(series) > 1:
        reason += " (worst of %d series, at %s)" % (len(series), worst.label_text())
    return _gate_result(
        gate, "pass", reason, query, worst.value, worst.labels, len(series), samples
    )


def _unreachable_result(gate, error_result, values):
    query = render_query(gate.query, values, "gate %s query" % gate.name)
    result = _gate_result(gate, "hold", error_result["reason"], query)
    result["error_kind"] = error_result["error_kind"]
    return result


def evaluate_gates(gates, query_fn, values):
    """Evaluate every gate once: {"verdict", "reason", "gates": [result, ...]}.

    Once Prometheus is unreachable or times out, the remaining gates hold with the
    same cause instead of each waiting for its own timeout.
    """
    check_placeholders(gates, values)
    results = []
    down = None
    for gate in gates:
        if down is not None:
            results.append(_unreachable_result(gate, down, values))
            continue
        result = evaluate_gate(gate, query_fn, values)
        if result.get("error_kind") in UNREACHABLE_KINDS:
            down = result
        results.append(result)
    return {
        "verdict": overall_verdict(results),
        "reason": overall_reason(results),
        "gates": results,
    }


def overall_verdict(results):
    verdicts = {result["verdict"] for result in results}
    if "fail" in verdicts:
        return "fail"
    if "hold" in verdicts:
        return "hold"
    return "pass"


def overall_reason(results):
    verdict = overall_verdict(results)
    if verdict == "pass":
        return "all %d gates passed" % len(results)
    return "; ".join(
        "%s %s: %s" % (result["name"], "failed" if verdict == "fail" else "holds", result["reason"])
        for result in results
        if result["verdict"] == verdict
    )


# ---------------------------------------------------------------- stage decision


def whole_number(value, field, smallest):
    """value, when it is a whole number (not a bool) of at least smallest; else the error
    naming field."""
    if isinstance(value, bool) or not isinstance(value, int) or value < smallest:
        raise FleetError(
            "%s must be a whole number >= %d; got %r" % (field, smallest, value),
            {"field": field},
        )
    return value


class Limits:
    """When a stage stops: failure limits (rollback) and inconclusive limits (pause)."""

    def __init__(
        self, consecutive_failure_limit=3, failure_limit=5, max_holds=60, max_hold_extension_s=7200
    ):
        self.consecutive_failure_limit = whole_number(
            consecutive_failure_limit, "consecutive_failure_limit", 1
        )
        self.failure_limit = whole_number(failure_limit, "failure_limit", 1)
        self.max_holds = whole_number(max_holds, "max_holds", 0)
        self.max_hold_extension_s = whole_number(max_hold_extension_s, "max_hold_extension", 0)


def most_evaluations(hold_s, interval_s, max_holds, failure_limit):
    """How many evaluations a hold's loop may take before the gates must have decided.

    The hold's own (hold_s / interval_s), two for each inconclusive evaluation max_holds
    allows (each extends the stage by the time it held), every failure below failure_limit,
    and ten more for evaluations the store or Prometheus left undecided. A pause or a
    rollback ends the loop long before in practice; this only bounds it.
    """
    hold_s = whole_number(hold_s, "hold", 0)
    interval_s = whole_number(interval_s, "interval", 1)
    max_holds = whole_number(max_holds, "max_holds", 0)
    failure_limit = whole_number(failure_limit, "failure_limit", 0)
    return hold_s // interval_s + 2 * max_holds + failure_limit + 10


def new_history(rollout_id, stage, decided_at=None):
    return {
        "format": HISTORY_FORMAT,
        "rollout_id": rollout_id,
        "stage": stage,
        # The person's decision (resume, promote) this history began after, if any.
        "decided_at": decided_at,
        "first_evaluated_at": None,
        "last_evaluated_at": None,
        "evaluations": 0,
        "consecutive_failures": 0,
        "failures": 0,
        "holds": 0,
        "hold_extension_s": 0.0,
        "unwatched_s": 0.0,
        "latched": None,
        "recent": [],
    }


def history_for_stage(stored, rollout_id, stage, decided_at=None):
    """(history, replaced): the stored history when it belongs to this rollout and stage and
    began after the person's latest decision (decided_at, from the record), else a fresh one:
    a resume or promote gives the stage a new budget, whoever made it."""
    if (
        isinstance(stored, dict)
        and stored.get("format") == HISTORY_FORMAT
        and stored.get("rollout_id") == rollout_id
        and stored.get("stage") == stage
        and stored.get("decided_at") == decided_at
    ):
        return copy.deepcopy(stored), False
    return new_history(rollout_id, stage, decided_at), stored is not None


def _count_evaluation(history, verdict, now, hold_started_at, watch_interval_s=None):
    watched_before = _watched_so_far(history)
    if history["first_evaluated_at"] is None:
        history["first_evaluated_at"] = format_timestamp(now)
    # The evidence behind a verdict covers the time since the previous evaluation (or the
    # hold start): when it is inconclusive, that time did not count towards the hold.
    previous = history["last_evaluated_at"]
    since = parse_timestamp(previous, "last_evaluated_at") if previous else hold_started_at
    interval = seconds_between(since, now) if since is not None else 0.0
    history["evaluations"] += 1
    history["last_evaluated_at"] = format_timestamp(now)
    # Time nobody watched is no hold: a runner that was dead, or a controller that slept,
    # moves the hold's end by the part of the gap beyond two gate intervals. Only that part:
    # a loaded controller whose every evaluation takes a little over two intervals must still
    # see its hold end, not moved by each whole gap.
    if watch_interval_s and interval > 2 * watch_interval_s:
        history["unwatched_s"] = history.get("unwatched_s", 0.0) + interval - 2 * watch_interval_s
    # The hold counts the time watched, summed one gap at a time, never the difference of two
    # timestamps: a runner resumed on another controller measures its first gap against the
    # first controller's clock, and only that gap can be off, by at most two intervals; a
    # clock behind (a negative gap) counts nothing instead of holding the stage for as long
    # as the clocks differ, a clock ahead no more than two intervals.
    credited = max(0.0, interval)
    if watch_interval_s:
        credited = min(credited, 2 * watch_interval_s)
    history["watched_s"] = watched_before + credited
    if verdict == "fail":
        history["consecutive_failures"] += 1
        history["failures"] += 1
    elif verdict == "pass":
        history["consecutive_failures"] = 0
    # A hold is no evidence either way: it neither breaks nor extends a failure streak.
    if verdict == "hold":
        history["holds"] += 1
        history["hold_extension_s"] += max(0.0, interval)


def _watched_so_far(history):
    """The hold time a stage history has counted; a history written before it kept
    watched_s has counted the time between its first and last evaluation, less unwatched."""
    if "watched_s" in history:
        return history["watched_s"]
    first, last = history.get("first_evaluated_at"), history.get("last_evaluated_at")
    if not first or not last:
        return 0.0
    span = seconds_between(
        parse_timestamp(first, "first_evaluated_at"), parse_timestamp(last, "last_evaluated_at")
    )
    return max(0.0, span - history.get("unwatched_s", 0.0))


def _decide(history, verdict, now, hold_over, limits):
    if history["latched"] is not None:
        latched = history["latched"]
        return latched["decision"], "%s decided at %s: %s" % (
            latched["decision"],
            latched["at"],
            latched["reason"],
        )
    if verdict == "fail" and history["consecutive_failures"] >= limits.consecutive_failure_limit:
        return "rollback", "%d consecutive failed evaluations (consecutive_failure_limit %d)" % (
            history["consecutive_failures"],
            limits.consecutive_failure_limit,
        )
    if verdict == "fail" and history["failures"] >= limits.failure_limit:
        return "rollback", "%d failed evaluations in this stage (failure_limit %d)" % (
            history["failures"],
            limits.failure_limit,
        )
    if verdict == "hold" and history["holds"] > limits.max_holds:
        return (
            "pause",
            "telemetry inconclusive in %d evaluations (max_holds %d): a person must "
            "decide to resume, promote or roll back" % (history["holds"], limits.max_holds),
        )
    if verdict == "hold" and history["hold_extension_s"] > limits.max_hold_extension_s:
        return (
            "pause",
            "telemetry inconclusive for %ds (max_hold_extension %ds): a person must "
            "decide to resume, promote or roll back"
            % (history["hold_extension_s"], limits.max_hold_extension_s),
        )
    if verdict == "pass" and hold_over:
        return "complete", "hold time over and the latest evaluation passed"
    if verdict == "pass":
        return "continue", "passing; hold time not over yet"
    if verdict == "fail":
        return "continue", "failed, below the failure limits"
    return "continue", "inconclusive; the stage is extended by the time spent holding"


def record_evaluation(
    history,
    verdict,
    now,
    hold_s,
    hold_started_at,
    limits,
    gate_verdicts=None,
    watch_interval_s=None,
):
    """Add one evaluation to a stage history and decide; returns (history, outcome).

    The history given is not changed. hold_started_at may be None: the stage's first
    evaluation then stands for the hold start. With watch_interval_s (the gate interval),
    a gap of more than two intervals since the previous evaluation does not count as hold.
    """
    if verdict not in VERDICTS:
        raise FleetError(
            "verdict must be one of %s; got %r" % (", ".join(VERDICTS), verdict),
            {"field": "verdict"},
        )
    history = copy.deepcopy(history)
    _count_evaluation(history, verdict, now, hold_started_at, watch_interval_s)
    start = hold_started_at or parse_timestamp(history["first_evaluated_at"], "first_evaluated_at")
    extension = min(history["hold_extension_s"], limits.max_hold_extension_s)
    unwatched = history.get("unwatched_s", 0.0)
    watched = history["watched_s"]
    remaining = max(0.0, hold_s + extension - watched)
    # Told on this controller's clock: now plus what is left to watch.
    hold_ends_at = now + datetime.timedelta(seconds=remaining)
    decision, reason = _decide(history, verdict, now, remaining <= 0, limits)
    if decision in ("rollback", "pause") and history["latched"] is None:
        history["latched"] = {"decision": decision, "reason": reason, "at": format_timestamp(now)}
    history["recent"].append(
        {
            "at": format_timestamp(now),
            "verdict": verdict,
            "decision": decision,
            "gates": dict(gate_verdicts or {}),
        }
    )
    del history["recent"][:-HISTORY_KEEP]
    outcome = {
        "verdict": verdict,
        "decision": decision,
        "decision_reason": reason,
        "evaluations": history["evaluations"],
        "consecutive_failures": history["consecutive_failures"],
        "failures": history["failures"],
        "holds": history["holds"],
        "hold_s": hold_s,
        "hold_extension_s": round(extension, 3),
        "unwatched_s": round(unwatched, 3),
        "hold_started_at": format_timestamp(start),
        "hold_ends_at": format_timestamp(hold_ends_at),
        "elapsed_s": round(watched, 3),
        "hold_remaining_s": round(remaining, 3),
    }
    return history, outcome
