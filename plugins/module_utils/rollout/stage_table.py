# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The short per-wave, per-stage table of a rollout's final reports.

One row per stage a wave ran: its weight, the measured split with its agreeing range, the
gate verdicts of the stage, the time spent in it (and paused), and how it ended. A cohort
stage (weight 0, only the clients of its source CIDRs on the direct path) shows as
"cohort (N prefixes)" and its split as the cohort's connections handed to an engine. The rows
come from a rollout record (rollout.py), the measured split from what the canary kept in
it (action split_measured), or from whoever measured it otherwise (the drill, from its
load client). The same rows and the same text serve the progress callback's final
report, `zerolayer rollout report` and the drill's report. Pure logic, no Ansible.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_timestamp,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.cohorts import (
    format_cohort,
    stage_cohort,
)

# What a gate evaluation's marker says: its verdict, or "no_data" when it held only because
# no gate had any series (telemetry absent, as opposed to too few samples or an error).
VERDICT_KINDS = ("pass", "fail", "hold", "no_data")
# Transitions that end a pause (finish() and the promotes clear it too).
PAUSE_ENDS = ("resume", "promote", "promote_full", "abort", "rolled_back", "completed")
# Transitions that end the stage in progress without completing it. (epoch_taken does not:
# the run carries on with the same stage and writes its weight again.)
STAGE_STOPS = ("abort", "rolled_back", "promote_full")
COLUMNS = ("WAVE", "STAGE", "WEIGHT", "SPLIT", "RANGE", "VERDICTS", "TIME", "END")


def unix(value, field):
    return parse_timestamp(value, field).timestamp()


def wave_of(rollout_id):
    """canary.yml names each wave's record <rollout>:<wave>."""
    if not rollout_id:
        return "-"
    rollout, _separator, wave = str(rollout_id).rpartition(":")
    return wave if rollout else str(rollout_id)


def format_seconds(value):
    if value is None:
        return "-"
    seconds = round(float(value))
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return "%dh%02dm" % (hours, minutes)
    if minutes:
        return "%dm%02ds" % (minutes, seconds)
    return "%ds" % seconds


def format_weight(value):
    if value is None:
        return "-"
    number = float(value)
    return ("%d%%" % number) if number.is_integer() else ("%s%%" % number)


def format_stage_weight(weight, cohort=None):
    """A stage's weight cell: 'cohort (N prefixes)' for a cohort stage, else the percent."""
    return format_cohort(cohort) if cohort else format_weight(weight)


def format_opt_in(count):
    """The cohort's connections handed to an engine: 'opt-in 412 conn.'."""
    return "opt-in %d conn." % int(count or 0)


def format_hold(seconds):
    """A hold as a schedule writes it: 30m, 2h, 1h30m, 90s -> 1m30s; '' for none."""
    seconds = int(seconds or 0)
    if seconds <= 0:
        return ""
    text = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count:
            text += "%d%s" % (count, unit)
    return text


def format_schedule(schedule):
    """'cohort (2 prefixes) 30m, 1% 2h, 5% 4h, 100%': every stage with its hold."""
    parts = []
    for planned in schedule or []:
        hold = format_hold(planned.get("hold_s"))
        weight = format_stage_weight(planned.get("weight"), stage_cohort(planned))
        parts.append("%s %s" % (weight, hold) if hold else weight)
    return ", ".join(parts)


def verdict_kind(entry):
    """pass, fail, hold or no_data for one recorded gate evaluation."""
    verdict = entry.get("verdict")
    if verdict != "hold":
        return verdict
    # overall_reason() joins "<gate> holds: <why>" for every holding gate.
    parts = [part for part in (entry.get("reason") or "").split("; ") if part]
    if parts and all(part.split(": ", 1)[-1].startswith("no data") for part in parts):
        return "no_data"
    return "hold"


def pause_spans(record, until):
    """[(start, end, reason)] Unix times of each pause; a pause still on ends at until."""
    spans, opened = [], None
    for transition in record.get("transitions", []):
        action = transition["action"]
        if action == "pause" and opened is None:
            opened = (unix(transition["at"], "transitions[].at"), transition.get("reason"))
        elif action in PAUSE_ENDS and opened is not None:
            spans.append((opened[0], unix(transition["at"], "transitions[].at"), opened[1]))
            opened = None
    if opened is not None:
        spans.append((opened[0], max(until, opened[0]), opened[1]))
    return spans


def rollback_label(record):
    """fast or deep (the rollback report's mode), or rollback when the record does not say."""
    details = (record.get("rollback") or {}).get("details") or {}
    return details.get("mode") or "rollback"


def _end_of_unfinished(record, index, started):
    """(Unix time, how) a stage that did not complete was left, or (None, its state)."""
    for transition in record.get("transitions", []):
        at = unix(transition["at"], "transitions[].at")
        if at < started:
            continue
        action = transition["action"]
        if action in STAGE_STOPS or (
            action == "stage_started" and transition.get("stage") != index
        ):
            how = {
                "abort": "aborted",
                "rolled_back": "rolled back (%s)" % rollback_label(record),
                "promote_full": "promoted to 100%",
            }.get(action, "left")
            if action == "abort" and record.get("rollback"):
                how = "aborted, %s rollback" % rollback_label(record)
            return at, how
    if record["stage"]["index"] == index:
        if record.get("paused"):
            return None, "paused"
        return None, {"holding": "holding", "started": "in progress"}.get(
            record["stage"]["status"], record["stage"]["status"]
        )
    return None, "left"


def stage_spans(record):
    """{index: {started_at, ended_at, end}} (Unix times) of every stage the wave ran.

    A completed stage's times are its completed_stages entry; a stage left another way ends
    at the abort, rollback, promote to 100 % or next stage that took over; the stage still
    in progress has no end yet.
    """
    spans = {}
    for done in record.get("completed_stages", []):
        ended = unix(done["completed_at"], "completed_stages[].completed_at")
        spans[done["stage"]] = {
            # promote of a stage that had not started starts it at its completion.
            "started_at": unix(done["started_at"], "completed_stages[].started_at")
            if done.get("started_at")
            else ended,
            "ended_at": ended,
            "end": {"promote": "promoted"}.get(done.get("how"), "completed"),
        }
    for transition in record.get("transitions", []):
        index = transition.get("stage")
        if transition["action"] == "stage_started" and index not in spans:
            started = unix(transition["at"], "transitions[].at")
            ended, how = _end_of_unfinished(record, index, started)
            spans[index] = {"started_at": started, "ended_at": ended, "end": how}
    return dict(sorted(spans.items()))


def _overlap(start, end, spans):
    return sum(max(0.0, min(end, to) - max(start, frm)) for frm, to, _reason in spans)


def split_summary(measured):
    """One row's split from {name: split_verdict result (measured_pct, low_pct, high_pct,
    ok, connections)}: the measured range over the nodes, the agreeing range (the widest
    bounds of the nodes' own ranges), and the nodes that were off.

    A cohort stage's split (entries with cohort true, stage_split's) is the cohort's
    connections handed to an engine, summed over the nodes as opt_in; it has no agreeing
    range (the weight is 0: none of the others may go direct)."""
    entries = {name: entry for name, entry in (measured or {}).items() if isinstance(entry, dict)}
    if not entries:
        return None
    if any(entry.get("cohort") for entry in entries.values()):
        return {
            "nodes": len(entries),
            "cohort": True,
            "opt_in": sum(int(e.get("opt_in") or 0) for e in entries.values()),
            "measured_pct": None,
            "range_pct": None,
            "connections": sum(int(e.get("connections") or 0) for e in entries.values()),
            "off": sorted(name for name, entry in entries.items() if not entry.get("ok", True)),
        }
    values = [e["measured_pct"] for e in entries.values() if e.get("measured_pct") is not None]
    lows = [e["low_pct"] for e in entries.values() if e.get("low_pct") is not None]
    highs = [e["high_pct"] for e in entries.values() if e.get("high_pct") is not None]
    return {
        "nodes": len(entries),
        "measured_pct": [min(values), max(values)] if values else None,
        "range_pct": [min(lows), max(highs)] if lows and highs else None,
        "connections": sum(int(e.get("connections") or 0) for e in entries.values()),
        "off": sorted(name for name, entry in entries.items() if not entry.get("ok", True)),
    }


def record_rows(record, now, wave=None, splits=None):
    """The rows of one wave's record. now (Unix) ends the time of a stage still in progress;
    splits is {stage index: {node: split_verdict result}} where a split was measured (by
    default what the record kept with split_measured)."""
    if splits is None:
        splits = {int(index): nodes for index, nodes in (record.get("splits") or {}).items()}
    wave = wave or wave_of(record.get("rollout_id"))
    until = max(now, unix(record["updated_at"], "updated_at"))
    pauses = pause_spans(record, until)
    rows = []
    for index, span in stage_spans(record).items():
        ended = span["ended_at"] if span["ended_at"] is not None else until
        planned = record["schedule"][index]
        verdicts = [entry for entry in record.get("verdicts", []) if entry.get("stage") == index]
        counts = {}
        for entry in verdicts:
            kind = verdict_kind(entry)
            counts[kind] = counts.get(kind, 0) + 1
        rows.append(
            {
                "wave": wave,
                "stage": index,
                "stage_number": index + 1,
                "stage_count": len(record["schedule"]),
                "weight": planned["weight"],
                # The cohort stage's source CIDRs; [] for a stage by weight.
                "cohort": stage_cohort(planned),
                "hold_s": planned["hold_s"],
                "started_at": format_timestamp(parse_timestamp(span["started_at"], "started_at")),
                "ended_at": None
                if span["ended_at"] is None
                else format_timestamp(parse_timestamp(span["ended_at"], "ended_at")),
                "time_s": round(ended - span["started_at"], 3),
                "paused_s": round(_overlap(span["started_at"], ended, pauses), 3),
                "verdicts": {kind: counts[kind] for kind in VERDICT_KINDS if kind in counts},
                "last_decision": verdicts[-1].get("decision") if verdicts else None,
                "split": split_summary((splits or {}).get(index)),
                "end": span["end"],
            }
        )
    return rows


def rollout_rows(records, now, splits=None):
    """Rows of every wave of a rollout ({wave: record}), the waves in the order they were
    planned; splits is {wave: {stage index: {node: split}}}."""
    ordered = sorted(records.items(), key=lambda item: (item[1].get("created_at", ""), item[0]))
    rows = []
    for wave, record in ordered:
        rows.extend(record_rows(record, now, wave, (splits or {}).get(wave)))
    return rows


def _percent_span(values):
    low, high = values
    if low == high:
        return "%.2f%%" % low
    return "%.2f..%.2f%%" % (low, high)


def _cells(row):
    split = row.get("split") or {}
    measured = split.get("measured_pct")
    split_cell = "-"
    if split.get("cohort"):
        split_cell = format_opt_in(split.get("opt_in"))
    elif measured:
        split_cell = _percent_span(measured)
    if split_cell != "-" and split.get("nodes", 1) > 1:
        split_cell += " (%d nodes)" % split["nodes"]
    if split.get("off"):
        split_cell += " OFF %s" % ",".join(split["off"])
    agreeing = split.get("range_pct")
    verdicts = ", ".join(
        "%s %d" % (kind.replace("_", " "), count) for kind, count in row["verdicts"].items()
    )
    if row.get("last_decision"):
        verdicts = "%s -> %s" % (verdicts, row["last_decision"])
    time = format_seconds(row["time_s"])
    if row.get("paused_s"):
        time += " (paused %s)" % format_seconds(row["paused_s"])
    return (
        row["wave"],
        "%d/%d" % (row["stage_number"], row["stage_count"]),
        format_stage_weight(row["weight"], row.get("cohort")),
        split_cell,
        "%.2f-%.2f%%" % tuple(agreeing) if agreeing else "-",
        verdicts or "-",
        time,
        row["end"],
    )


def render_table(rows):
    """Aligned text lines, a header first; the weight column right-aligned."""
    if not rows:
        return ["no stage has started"]
    table = [COLUMNS] + [_cells(row) for row in rows]
    widths = [max(len(line[column]) for line in table) for column in range(len(COLUMNS))]
    lines = []
    for line in table:
        cells = [
            cell.rjust(width) if column == 2 else cell.ljust(width)
            for column, (cell, width) in enumerate(zip(line, widths))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines
