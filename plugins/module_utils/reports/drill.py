# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollback drill's report: what the client saw, what the router counted, how long
each rollback took, and whether the drill passed.

Inputs are files the drill already wrote (the load client's summary, the canary record,
the two rollback reports) plus the drill's own event times; the router's counters come
from Prometheus over the drill's window. Outputs: a JSON report, a JUnit XML file (one
test case per check, so any CI shows the drill), a PNG plot over time and the short
per-stage table (stage_table.py: weight, the client's split with its agreeing range, gate
verdicts, time), which the module returns and report.json keeps as stage_rows.

A canary whose schedule starts with a cohort stage (weight 0, only the cohort's source
CIDRs on the direct path) is one the drill runs with its own load client's address as the
cohort: while that stage holds, every request of the client goes direct. Its window is
judged against 100 % (cohort_stage_direct_client, cohort_stage_direct_router instead of
split_*_stage_N), and the record's split of the stage must show every node handing the
cohort to an engine and the weight none (cohort_stage_confirmed). A record without a
cohort stage gets the checks it always got.
Pure logic apart from reading and writing files; the plot needs matplotlib.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import xml.etree.ElementTree as ET

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_text_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import parse_timestamp
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.cohorts import (
    format_prefixes,
    stage_cohort,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.record_codec import (
    write_json_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.stage_table import (
    render_table,
    rollout_rows,
    wave_of,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.traffic_split import (
    split_verdict,
)

REPORT_FORMAT = 1
# Share of new connections the router sent to the engines, fleet-wide, over the drill.
ROUTER_SPLIT_QUERY = (
    'sum(increase(zerolayer_route_decisions_total{outcome="engine",%(selector)s}[%(window)ss]))'
    " / sum(increase(zerolayer_route_decisions_total{%(selector)s}[%(window)ss]))"
)
# mode, when its report's end is, what its wall time runs until
ROLLBACK_MODES = (
    (
        "fast",
        "confirmed_at",
        "trigger to every node confirming weight 0 and the client's last direct-path connection",
    ),
    ("deep", "finished_at", "trigger to every node's router removed and its proxy answering"),
)
# The default schedule's weights, and 50 for a drill's or a wave's own schedule.
WEIGHT_TICKS = (0, 1, 5, 20, 50, 100)
EVENT_LABELS = {
    "fast_rollback_started": "fast rollback",
    "fast_rollback_confirmed": "weight 0 confirmed",
    "deep_rollback_started": "deep rollback",
    "deep_rollback_finished": "router removed",
    "restored": "router restored",
}


def read_json(path, what):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError) as error:
        raise FleetError(
            "cannot read %s %s: %s" % (what, path, error), {"field": what.replace(" ", "_")}
        ) from None


# Stages of the canary


def stage_windows(record):
    """[{stage, weight, cohort, hold_from, hold_to}] from the record's transitions (Unix
    times); cohort is the stage's source CIDRs, [] for a stage by weight.

    A stage's window is its hold: from the first hold start (a resumed run keeps it) to the
    stage's completion, or to the pause or rollback that ended it.
    """
    windows = {}
    order = []
    for transition in record.get("transitions", []):
        index = transition.get("stage")
        at = parse_timestamp(transition["at"], "transitions[].at").timestamp()
        action = transition["action"]
        if action == "stage_started" and index not in windows:
            windows[index] = {
                "stage": index,
                "weight": record["schedule"][index]["weight"],
                "cohort": stage_cohort(record["schedule"][index]),
                "written_at": at,
                "hold_from": None,
                "hold_to": None,
            }
            order.append(index)
        window = windows.get(index)
        if window is None:
            continue
        if action == "hold_started" and window["hold_from"] is None:
            window["hold_from"] = at
        elif action in ("stage_completed", "pause", "rolled_back", "abort") and window["hold_from"]:
            window["hold_to"] = window["hold_to"] or at
    return [windows[index] for index in order]


# The load client's view


def client_counts(summary, start, end):
    """Direct, proxy and failed requests the client began within [start, end) (Unix)."""
    origin = summary["started_unix"]
    counts = {"direct": 0, "proxy": 0, "failed": 0}
    for bucket in summary.get("series", []):
        at = origin + bucket["second"]
        # Whole seconds only: a bucket counts when it lies inside the window.
        if at >= start and at + 1 <= end:
            for key in counts:
                counts[key] += bucket.get(key, 0)
    return counts


# Checks


def check(name, passed, measured, expected, detail=""):
    return {
        "name": name,
        "passed": bool(passed),
        "measured": measured,
        "expected": expected,
        "detail": detail,
    }


def cohort_stages(record):
    """Indexes of the record's cohort stages (the first stage, where there is one)."""
    return [
        index for index, planned in enumerate(record.get("schedule") or []) if stage_cohort(planned)
    ]


def cohort_confirmed_check(record, index):
    """cohort_stage_confirmed: the record's split of its cohort stage, as the canary measured
    it on every node, had the cohort's connections reach an engine (opt_in > 0) and the
    weight send none direct (to_engine 0), agreed (ok) and was a cohort stage's."""
    entries = (record.get("splits") or {}).get(str(index)) or {}
    wrong, names = [], []
    for node, entry in sorted(entries.items()):
        entry = entry if isinstance(entry, dict) else {}
        why = []
        if entry.get("ok") is not True:
            why.append("not ok")
        if entry.get("cohort") is not True:
            why.append("not measured as a cohort stage")
        opt_in = entry.get("opt_in")
        if isinstance(opt_in, bool) or not isinstance(opt_in, int) or opt_in <= 0:
            why.append("opt_in %s" % entry.get("opt_in"))
        if entry.get("to_engine") != 0:
            why.append("to_engine %s" % entry.get("to_engine"))
        if why:
            names.append(node)
            wrong.append("%s: %s" % (node, ", ".join(why)))
    wave = wave_of(record.get("rollout_id"))
    if not entries:
        detail = "wave %s: no node's split of stage %d is in the record" % (wave, index + 1)
    elif wrong:
        detail = "wave %s, stage %d: %s" % (wave, index + 1, "; ".join(wrong))
    else:
        detail = "wave %s, stage %d: every node handed the cohort %s to an engine" % (
            wave,
            index + 1,
            format_prefixes(stage_cohort(record["schedule"][index])),
        )
    measured = "%d/%d nodes" % (len(entries) - len(wrong), len(entries))
    if names:
        measured += " (not confirmed: %s)" % ", ".join(names)
    return check(
        "cohort_stage_confirmed",
        bool(entries) and not wrong,
        measured,
        "every node: ok, cohort, opt_in > 0, to_engine 0",
        detail,
    )


def rollback_facts(report, trigger_at, finished_key):
    """Wall time from the drill's trigger to the rollback report's end, and its nodes."""
    # started_at (ISO) stops at the second: the end rebuilt from it would come up to a
    # second early and a direct request just before the real end would look late.
    try:
        finished = float(report["finished_at_unix"])
    except (KeyError, TypeError, ValueError):
        raise FleetError(
            "rollback report: finished_at_unix must be the Unix time at which every node had "
            "answered (written by rollback_report.yml); got %r" % report.get("finished_at_unix")
        ) from None
    return {
        "triggered_at": trigger_at,
        finished_key: finished,
        "report_wall_time_s": float(report["wall_time_s"]),
        "nodes_total": int(report["nodes_total"]),
        "nodes_confirmed": int(report["nodes_confirmed"]),
        "unreachable": report.get("unreachable", []),
        "not_confirmed": report.get("not_confirmed", []),
    }


def build_report(inputs, router_split=None):
    """The drill's report and its checks. `router_split(start, end)` gives the router's
    measured share of new connections to the engines over a window, or raises FleetError."""
    limits = inputs["limits"]
    summary = inputs["load_summary"]
    events = dict(inputs["events"])
    checks = []

    failed = int(summary["requests_failed"])
    checks.append(
        check(
            "no_request_lost",
            failed <= limits["max_failed_requests"],
            failed,
            "<= %d" % limits["max_failed_requests"],
            "failures by cause: %s" % json.dumps(summary.get("failures_by_cause", {})),
        )
    )
    checks.append(
        check(
            "streams_completed",
            summary.get("streams_completed", 0) > 0,
            summary.get("streams_completed", 0),
            "> 0",
            "streaming requests ran across every change and ended with [DONE]",
        )
    )

    stages = []
    # The client's split per wave and stage, for the report's table.
    client_splits = {}
    for record in inputs["canary_records"]:
        wave_splits = client_splits.setdefault(wave_of(record["rollout_id"]), {})
        for window in stage_windows(record):
            if window["hold_from"] is None or window["hold_to"] is None:
                continue
            counts = client_counts(summary, window["hold_from"], window["hold_to"])
            answered = counts["direct"] + counts["proxy"]
            cohort = window["cohort"]
            # A cohort stage (weight 0) has the client's own address as its cohort: every
            # request of its hold is expected on the direct path, and the router's share of
            # new connections is held to 100 % less the floor (rates, other clients).
            expected_pct = 100 if cohort else window["weight"]
            # One connection per request: the client's count is binomial like the router's.
            verdict = split_verdict(
                counts["direct"],
                answered,
                expected_pct,
                limits["split_sigmas"],
                limits["split_floor_pct"],
            )
            agreeing = "%s%% (%s-%s%%)" % (expected_pct, verdict["low_pct"], verdict["high_pct"])
            stage = dict(window)
            stage.update(
                {
                    "client_requests": answered,
                    "client_direct_pct": verdict["measured_pct"],
                    "agreeing_range_pct": [verdict["low_pct"], verdict["high_pct"]],
                }
            )
            if cohort:
                client_ok = answered > 0 and counts["proxy"] == 0
                wave_splits[window["stage"]] = {
                    "client": dict(
                        verdict, ok=client_ok, cohort=True, opt_in=counts["direct"],
                        connections=answered,
                    )
                }  # fmt: skip
                checks.append(
                    check(
                        "cohort_stage_direct_client",
                        client_ok,
                        stage["client_direct_pct"],
                        "100% (every request direct)",
                        "cohort %s (the load client): %d requests answered during the hold "
                        "of stage %d, %d of them on the proxy"
                        % (format_prefixes(cohort), answered, window["stage"] + 1, counts["proxy"]),
                    )
                )
            else:
                wave_splits[window["stage"]] = {"client": dict(verdict, connections=answered)}
                checks.append(
                    check(
                        "split_client_stage_%d" % (window["stage"] + 1),
                        verdict["ok"],
                        stage["client_direct_pct"],
                        agreeing,
                        "%d requests answered during the hold" % answered,
                    )
                )
            if router_split is not None:
                try:
                    router = router_split(window["hold_from"], window["hold_to"])
                    stage["router_engine_pct"] = None if router is None else round(router * 100, 3)
                    # The router's share comes from rates, not a count: it is held to the
                    # range the client's count allows.
                    router_ok = (
                        router is not None
                        and verdict["low_pct"] is not None
                        and verdict["low_pct"] <= router * 100 <= verdict["high_pct"]
                    )
                    detail = "share of new connections the router sent to the engines"
                    if cohort:
                        detail += " while the cohort %s (the load client) held stage %d" % (
                            format_prefixes(cohort),
                            window["stage"] + 1,
                        )
                except FleetError as error:
                    stage["router_engine_pct"] = None
                    router_ok, detail = False, error.message
                checks.append(
                    check(
                        "cohort_stage_direct_router"
                        if cohort
                        else "split_router_stage_%d" % (window["stage"] + 1),
                        router_ok,
                        stage["router_engine_pct"],
                        agreeing,
                        detail,
                    )
                )
            stages.append(stage)
        for index in cohort_stages(record):
            checks.append(cohort_confirmed_check(record, index))
    checks.append(
        check(
            "canary_reached_its_stage",
            any(stage["weight"] == limits["stage_weight"] for stage in stages),
            [stage["weight"] for stage in stages],
            "a held stage at %s%%" % limits["stage_weight"],
        )
    )

    rollbacks = {}
    last_direct = summary.get("paths", {}).get("direct", {}).get("last_began_unix")
    for mode, finished_key, done_when in ROLLBACK_MODES:
        report = inputs["rollback_reports"].get(mode)
        if report is None:
            continue
        facts = rollback_facts(report, events["%s_rollback_started" % mode], finished_key)
        seen_until = facts[finished_key]
        if mode == "fast":
            # Done when every node confirmed weight 0 AND the client opened no direct-path
            # connection after that: a later direct request means the rollback did not hold.
            seen_until = max(seen_until, last_direct or 0)
            facts["client_last_direct_unix"] = last_direct
        facts["wall_time_s"] = round(seen_until - facts["triggered_at"], 3)
        rollbacks[mode] = facts
        events.setdefault("%s_rollback_%s" % (mode, finished_key[:-3]), facts[finished_key])
        budget = limits["%s_budget_s" % mode]
        checks.append(
            check(
                "%s_rollback_time" % mode,
                facts["wall_time_s"] <= budget,
                facts["wall_time_s"],
                "<= %s s" % budget,
                done_when,
            )
        )
        checks.append(_nodes_check("%s_rollback_nodes" % mode, facts))
    if "fast" in rollbacks:
        confirmed = rollbacks["fast"]["confirmed_at"]
        checks.append(
            check(
                "no_direct_path_after_fast_rollback",
                last_direct is None or last_direct <= confirmed,
                last_direct,
                "<= %s" % round(confirmed, 3),
                "Unix time of the client's last direct-path request",
            )
        )
    for mode in ("fast", "deep"):
        if mode not in rollbacks:
            checks.append(check("%s_rollback_ran" % mode, False, None, "a rollback report"))
    clients = {"per_request": client_facts(summary, rollbacks)}
    pooled = inputs.get("pooled_load_summary")
    if pooled is not None:
        clients["pooled"] = client_facts(pooled, rollbacks)
        checks.extend(pooled_checks(clients["pooled"], limits))

    return {
        "format": REPORT_FORMAT,
        "drill_id": inputs["drill_id"],
        "started_at": inputs["started_at"],
        "finished_at": inputs["finished_at"],
        "passed": all(item["passed"] for item in checks),
        "checks": checks,
        "requests": {
            "ok": summary["requests_ok"],
            "failed": failed,
            "streams_completed": summary.get("streams_completed", 0),
            "paths": summary.get("paths", {}),
            "failures_by_cause": summary.get("failures_by_cause", {}),
            "failure_examples": summary.get("failure_examples", [])[:10],
        },
        "stages": stages,
        "stage_rows": rollout_rows(
            {wave_of(record["rollout_id"]): record for record in inputs["canary_records"]},
            inputs["finished_at"],
            client_splits,
        ),
        "rollbacks": rollbacks,
        "clients": clients,
        "events": events,
    }


def client_facts(summary, rollbacks):
    """What one load client saw: its counts and, after the fast rollback's trigger, how long
    until its last direct-path answer (the weight went to 0 and stayed there: every direct
    answer after it came on a connection made before)."""
    direct = summary.get("paths", {}).get("direct", {})
    last_direct = direct.get("last_ended_unix")
    facts = {
        "connection_mode": summary.get("connection_mode", "per-request"),
        "requests_ok": summary["requests_ok"],
        "requests_failed": int(summary["requests_failed"]),
        "failures_by_cause": summary.get("failures_by_cause", {}),
        "stale_connection_retries": summary.get("stale_connection_retries", 0),
        "last_direct_answer_unix": last_direct,
        "last_direct_answer_after_fast_trigger_s": None,
    }
    if "fast" in rollbacks and last_direct is not None:
        facts["last_direct_answer_after_fast_trigger_s"] = round(
            max(0.0, last_direct - rollbacks["fast"]["triggered_at"]), 3
        )
    return facts


def pooled_checks(facts, limits):
    """The pooled client's checks: no request lost, and off the direct path within the
    budget after the fast rollback (the engines' direct drain)."""
    after = facts["last_direct_answer_after_fast_trigger_s"]
    budget = limits["pooled_direct_budget_s"]
    return [
        check(
            "pooled_no_request_lost",
            facts["requests_failed"] <= limits["max_failed_requests"],
            facts["requests_failed"],
            "<= %d" % limits["max_failed_requests"],
            "failures by cause: %s" % json.dumps(facts["failures_by_cause"]),
        ),
        check(
            "pooled_clients_leave_the_direct_path",
            after is not None and after <= budget,
            after,
            "<= %s s" % budget,
            "seconds from the fast rollback's trigger to the keep-alive client's last "
            "direct-path answer (none at all: the canary never reached it)",
        ),
    ]


def _nodes_check(name, facts):
    return check(
        name,
        facts["nodes_total"] > 0 and facts["nodes_confirmed"] == facts["nodes_total"],
        "%d/%d" % (facts["nodes_confirmed"], facts["nodes_total"]),
        "every node confirmed",
        "unreachable %s, not confirmed %s" % (facts["unreachable"], facts["not_confirmed"]),
    )


# Outputs


def junit_xml(report):
    """One <testcase> per check; a failed check carries its measured and expected values."""
    failures = sum(1 for item in report["checks"] if not item["passed"])
    suite = ET.Element(
        "testsuite",
        {
            "name": "zerolayer.fleet rollback drill",
            "tests": str(len(report["checks"])),
            "failures": str(failures),
            "errors": "0",
            "time": "%.3f" % (report["finished_at"] - report["started_at"]),
        },
    )
    properties = ET.SubElement(suite, "properties")
    ET.SubElement(properties, "property", {"name": "drill_id", "value": report["drill_id"]})
    for item in report["checks"]:
        case = ET.SubElement(
            suite, "testcase", {"classname": "drill.%s" % report["drill_id"], "name": item["name"]}
        )
        text = "measured %s, expected %s. %s" % (item["measured"], item["expected"], item["detail"])
        if item["passed"]:
            ET.SubElement(case, "system-out").text = text
        else:
            ET.SubElement(case, "failure", {"message": text.strip()}).text = text
    tree = ET.ElementTree(suite)
    ET.indent(tree)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode")


def client_series(summary, smooth_s=5):
    """Per second since the drill's start: direct share (%, smoothed) and error rate (%)."""
    buckets = {bucket["second"]: bucket for bucket in summary.get("series", [])}
    if not buckets:
        return [], [], []
    seconds = list(range(0, max(buckets) + 1))
    shares, errors = [], []
    for second in seconds:
        window = [buckets.get(s, {}) for s in range(max(0, second - smooth_s + 1), second + 1)]
        direct = sum(b.get("direct", 0) for b in window)
        answered = direct + sum(b.get("proxy", 0) for b in window)
        shares.append(100.0 * direct / answered if answered else float("nan"))
        here = buckets.get(second, {})
        total = here.get("direct", 0) + here.get("proxy", 0) + here.get("failed", 0)
        errors.append(100.0 * here.get("failed", 0) / total if total else 0.0)
    return seconds, shares, errors


def weight_steps(report):
    """(seconds since start, weight written) steps: each stage, then 0 at the fast rollback."""
    origin = report["started_at"]
    steps = [(0.0, 0.0)]
    for stage in report["stages"]:
        steps.append((stage["written_at"] - origin, float(stage["weight"])))
    fast = report["rollbacks"].get("fast")
    if fast:
        steps.append((fast["triggered_at"] - origin, 0.0))
    steps.append((report["finished_at"] - origin, steps[-1][1]))
    return steps


# Plot plumbing, shared with the rollout timeline (rollout_timeline.py)


def load_pyplot(what, field, remedy=""):
    """matplotlib's pyplot on the Agg backend (files only, no display), or FleetError."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise FleetError(
            "%s needs matplotlib on the controller (requirements.txt)%s" % (what, remedy),
            {"field": field},
        ) from None
    return plt


def style_weight_axis(axis):
    """Percent of new connections on a scale where 1 % and 5 % stay visible beside 100 %."""
    axis.set_ylabel("% of new connections to the engines")
    axis.set_yscale("symlog", linthresh=1)
    axis.set_ylim(0, 110)
    axis.set_yticks(WEIGHT_TICKS, [str(tick) for tick in WEIGHT_TICKS])


def mark_moment(axes, at, label, color="grey", ls=":"):
    """A vertical line at `at` on every axis, its label written up the first one."""
    for axis in axes:
        axis.axvline(at, color=color, ls=ls, lw=1)
    axes[0].annotate(
        label,
        (at, 1.0),
        xycoords=("data", "axes fraction"),
        rotation=90,
        va="top",
        ha="right",
        fontsize=8,
    )


def save_png(plt, figure, path, field="path", dpi=100):
    """Write the figure to path atomically (a temporary file in the same directory, then a
    rename), so a reader never sees half a picture; the figure is closed either way."""
    directory = os.path.dirname(path) or "."
    try:
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=".plot-", suffix=".png")
    except OSError as error:
        plt.close(figure)
        raise FleetError(
            "%s: cannot write the picture %s: %s" % (field, path, error.strerror),
            {"field": field, "path": path},
        ) from None
    os.close(handle)
    try:
        figure.savefig(temporary, dpi=dpi)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    finally:
        plt.close(figure)
        if os.path.exists(temporary):
            os.unlink(temporary)


def plot_png(report, summary, router_points, path):
    plt = load_pyplot("the drill's plot", "plot", "; or set plot=false")
    origin = report["started_at"]
    load_origin = summary["started_unix"] - origin
    seconds, shares, errors = client_series(summary)
    figure, (top, bottom) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    steps = weight_steps(report)
    top.step(
        [moment for moment, _weight in steps],
        [weight for _moment, weight in steps],
        where="post",
        label="weight written",
        lw=2,
    )
    top.plot(
        [load_origin + s for s in seconds], shares, label="direct share seen by the client (5 s)"
    )
    if router_points:
        top.plot(
            [moment - origin for moment, _share in router_points],
            [share * 100 for _moment, share in router_points],
            label="direct share counted by the router",
            ls="--",
        )
    bottom.plot([load_origin + s for s in seconds], errors, color="tab:red", label="failed %")
    for name, at in sorted(report["events"].items(), key=lambda item: item[1]):
        mark_moment((top, bottom), at - origin, EVENT_LABELS.get(name, name))
    style_weight_axis(top)
    top.legend(loc="upper left", fontsize=8)
    bottom.set_ylabel("failed requests %")
    bottom.set_xlabel("seconds since the drill started")
    bottom.set_ylim(bottom=0)
    figure.suptitle(
        "Rollback drill %s: %s" % (report["drill_id"], "passed" if report["passed"] else "FAILED")
    )
    figure.tight_layout()
    save_png(plt, figure, path, field="output_dir")


def router_split_function(client, selector, step_s):
    """router_split(start, end) and the series for the plot, both from Prometheus."""

    def share_over(start, end):
        window = max(1, int(end - start))
        samples = client.query_range(
            ROUTER_SPLIT_QUERY % {"selector": selector, "window": window}, end, end, step_s
        )
        values = [value for points in samples.values() for _moment, value in points]
        return values[-1] if values and not math.isnan(values[-1]) else None

    def series(start, end):
        samples = client.query_range(
            ROUTER_SPLIT_QUERY % {"selector": selector, "window": max(2 * step_s, 10)},
            start,
            end,
            step_s,
        )
        points = [point for values in samples.values() for point in values]
        return [(at, value) for at, value in points if not math.isnan(value)]

    return share_over, series


# The module's entry point


def _event_times(events):
    times = {}
    for name, value in (events or {}).items():
        try:
            times[name] = float(value)
        except (TypeError, ValueError):
            raise FleetError(
                "events.%s must be a Unix time in seconds; got %r" % (name, value),
                {"field": "events"},
            ) from None
    return times


def run(params, check_mode, client_factory=None):
    """Read the drill's files, judge it, write report.json, report.junit.xml and report.png."""
    events = _event_times(params["events"])
    reports = {
        mode: read_json(path, "%s rollback report" % mode)
        for mode, path in (params["rollback_reports"] or {}).items()
        if path
    }
    for mode in reports:
        if "%s_rollback_started" % mode not in events:
            raise FleetError(
                "events must hold %s_rollback_started for the %s rollback report" % (mode, mode),
                {"field": "events"},
            )
    for name in ("max_failed_requests",):
        if params[name] < 0:
            raise FleetError("%s must be 0 or more" % name, {"field": name})
    if params.get("pooled_direct_budget_s", 2.0) <= 0:
        raise FleetError(
            "pooled_direct_budget_s must be seconds above 0; got %s"
            % params["pooled_direct_budget_s"],
            {"field": "pooled_direct_budget_s"},
        )
    inputs = {
        "drill_id": params["drill_id"],
        "started_at": params["started_at"],
        "finished_at": params["finished_at"],
        "load_summary": read_json(params["load_summary"], "load summary"),
        "pooled_load_summary": read_json(params["pooled_load_summary"], "pooled load summary")
        if params.get("pooled_load_summary")
        else None,
        "canary_records": [read_json(path, "canary record") for path in params["canary_records"]],
        "rollback_reports": reports,
        "events": events,
        "limits": {
            "max_failed_requests": params["max_failed_requests"],
            "fast_budget_s": params["fast_budget_s"],
            "pooled_direct_budget_s": params.get("pooled_direct_budget_s", 2.0),
            "deep_budget_s": params["deep_budget_s"],
            "split_sigmas": params["split_sigmas"],
            "split_floor_pct": params["split_floor_pct"],
            "stage_weight": params["stage_weight"],
        },
    }
    share_over = series = None
    if params["prometheus_url"]:
        if client_factory is None:
            from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import (
                prometheus_api,
            )

            client_factory = prometheus_api.PrometheusClient
        client = client_factory(params["prometheus_url"], timeout=params["prometheus_timeout"])
        share_over, series = router_split_function(client, params["router_selector"], 2)
    report = build_report(inputs, share_over)
    router_points = []
    if series is not None:
        try:
            router_points = series(params["started_at"], params["finished_at"])
        except FleetError as error:
            report["router_series_error"] = error.message
    files = {}
    if not check_mode:
        directory = params["output_dir"]
        files = {
            "json": os.path.join(directory, "report.json"),
            "junit": os.path.join(directory, "report.junit.xml"),
        }
        write_json_atomic(files["json"], report)
        write_text_atomic(files["junit"], junit_xml(report) + "\n")
        if params["plot"]:
            files["png"] = os.path.join(directory, "report.png")
            plot_png(report, inputs["load_summary"], router_points, files["png"])
    failed = [
        "%s: measured %s, expected %s" % (item["name"], item["measured"], item["expected"])
        for item in report["checks"]
        if not item["passed"]
    ]
    return {
        "changed": not check_mode,
        "passed": report["passed"],
        "report": report,
        "table": "\n".join(render_table(report["stage_rows"])),
        "failed_checks": failed,
        "files": files,
    }
