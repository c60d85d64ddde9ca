# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A rollout's timeline from its records: the series, and a PNG of them.

`timeline(records, now)` turns the records of one rollout ({wave: record}, as the rollout
store keeps them) into plot series, Unix times throughout; `draw_png` draws them with
matplotlib (Agg backend, a file, no display). What each series comes from:

- weight written, a step line per wave: 0 from the plan, the stage's weight at each
  stage_started, 0 at an abort or a rollback (the fence the abort raises makes every node's
  watcher write 0 at once) and at epoch_taken (the nodes of a rollout resumed under a newer
  fence were zeroed by it, at a moment this record does not hold), the stage's weight again
  at a weight_confirmed after that;
- weight confirmed: each weight_confirmed transition, at its stage's weight, with the nodes
  it named; and a node whose last read-back (record["nodes"], only the latest per node is
  kept) is not its stage's weight;
- gate verdicts: every recorded evaluation (the last rollout.KEEP_VERDICTS per wave), as
  pass, fail, hold or no data (a hold where every holding gate had no series at all);
- pauses: from each pause to the resume, promote, abort, rollback or completion that ended
  it (a pause still on runs to the end of the picture);
- stops: the abort and the rollback (labelled fast or deep from the rollback's details);
- cohort stages: the spans a wave held a cohort stage (weight 0, its cohort's clients
  direct), hatched along the bottom of the weight panel.

- measured split: each node's share of new connections sent to the engine at each
  split_measured transition (the canary's count after a weight is confirmed), drawn at its
  stage's time with its agreeing range; a node off its range is drawn hollow.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import parse_timestamp
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports.drill import (
    load_pyplot,
    mark_moment,
    save_png,
    style_weight_axis,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout import FINISHED
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.stage_table import (
    VERDICT_KINDS,
    pause_spans,
    rollback_label,
    unix,
    verdict_kind,
)

# Wave colours stay clear of the verdict colours, so a marker never reads as a wave.
WAVE_COLOURS = ("#1f77b4", "#9467bd", "#8c564b", "#17becf", "#e377c2", "#bcbd22")
VERDICT_COLOURS = {"pass": "#2ca02c", "fail": "#d62728", "hold": "#ff7f0e", "no_data": "#7f7f7f"}
FIGURE_SIZE = (11, 6.5)
DPI = 100
# Time units for the x axis: the first whose span limit the rollout fits in.
TIME_UNITS = ((180, 1, "seconds"), (3 * 3600, 60, "minutes"), (float("inf"), 3600, "hours"))


def wave_colour(position):
    return WAVE_COLOURS[position % len(WAVE_COLOURS)]


def time_unit(span_s):
    """(seconds per unit, unit name) for a picture spanning span_s seconds."""
    for limit, size, name in TIME_UNITS:
        if span_s <= limit:
            return size, name
    return TIME_UNITS[-1][1:]


def whole_seconds(at):
    """UTC ISO 8601 to the second, for an axis label."""
    return parse_timestamp(at, "at").strftime("%Y-%m-%dT%H:%M:%SZ")


# The transitions after which every node of the wave is at weight 0: the abort's fence, a
# rollback, a resume under a newer fence (epoch_taken).
ZEROING_ACTIONS = ("abort", "rolled_back", "epoch_taken")


def _stage_weight(record, index):
    return float(record["schedule"][index]["weight"])


def weight_steps(record, until):
    """[[Unix time, weight written]] of one wave, ending at until."""
    steps = [[unix(record["created_at"], "created_at"), 0.0]]

    def step(at, weight):
        if weight != steps[-1][1]:
            steps.append([at, weight])

    for transition in record.get("transitions", []):
        at = unix(transition["at"], "transitions[].at")
        action = transition["action"]
        if action == "stage_started":
            step(at, float(transition.get("weight", _stage_weight(record, transition["stage"]))))
        elif action == "weight_confirmed":
            step(at, _stage_weight(record, transition["stage"]))
        elif action in ZEROING_ACTIONS:
            step(at, 0.0)
    steps.append([max(until, steps[-1][0]), steps[-1][1]])
    return steps


def cohort_spans(record, until):
    """Each time the wave held a cohort stage (weight 0, its cohort's clients direct):
    {from, to, prefixes}, from its stage_started to the next stage's, a stop, or until."""
    spans = []
    started_at, prefixes = None, 0
    for transition in record.get("transitions", []):
        action = transition["action"]
        if action != "stage_started" and action not in ZEROING_ACTIONS:
            continue
        at = unix(transition["at"], "transitions[].at")
        if started_at is not None:
            spans.append({"from": started_at, "to": at, "prefixes": prefixes})
            started_at = None
        cohort = (
            record["schedule"][transition["stage"]].get("cohort")
            if action == "stage_started"
            else None
        )
        if cohort:
            started_at, prefixes = at, len(cohort)
    if started_at is not None:
        spans.append({"from": started_at, "to": max(until, started_at), "prefixes": prefixes})
    return spans


def confirmations(record):
    """Each weight_confirmed transition: {at, stage, weight, nodes}."""
    return [
        {
            "at": unix(transition["at"], "transitions[].at"),
            "stage": transition["stage"],
            "weight": _stage_weight(record, transition["stage"]),
            "nodes": list(transition.get("nodes") or []),
        }
        for transition in record.get("transitions", [])
        if transition["action"] == "weight_confirmed"
    ]


def readbacks_off(record):
    """Nodes whose last read-back weight is not the weight of the stage it was read at."""
    off = []
    for node, entry in sorted((record.get("nodes") or {}).items()):
        stage = entry.get("stage")
        if stage is None or not entry.get("confirmed_at"):
            continue
        if entry.get("weight_bp") != record["schedule"][stage]["weight_bp"]:
            off.append(
                {
                    "at": unix(entry["confirmed_at"], "nodes[].confirmed_at"),
                    "node": node,
                    "stage": stage,
                    "weight": float(entry["weight"]),
                }
            )
    return off


def measured_splits(record):
    """Each node's measured split as the record kept it: {at, stage, node, pct, low, high, ok}."""
    found = []
    times = [
        (transition["stage"], unix(transition["at"], "transitions[].at"))
        for transition in record.get("transitions", [])
        if transition["action"] == "split_measured"
    ]
    for stage_text, nodes in sorted((record.get("splits") or {}).items()):
        stage = int(stage_text)
        at = max((when for index, when in times if index == stage), default=None)
        if at is None:
            continue
        for node, split in sorted(nodes.items()):
            if split.get("measured_pct") is None:
                continue
            found.append(
                {
                    "at": at,
                    "stage": stage,
                    "node": node,
                    "pct": float(split["measured_pct"]),
                    "low": float(split.get("low_pct") or split["measured_pct"]),
                    "high": float(split.get("high_pct") or split["measured_pct"]),
                    "ok": bool(split.get("ok")),
                }
            )
    return found


def verdict_points(record):
    return [
        {
            "at": unix(entry["at"], "verdicts[].at"),
            "stage": entry.get("stage"),
            "kind": verdict_kind(entry),
            "decision": entry.get("decision"),
        }
        for entry in record.get("verdicts", [])
    ]


def stops(record):
    """The abort and the rollback of a wave: {at, kind (abort, fast, deep, rollback), label}."""
    found = []
    for transition in record.get("transitions", []):
        at = unix(transition["at"], "transitions[].at")
        if transition["action"] == "abort":
            found.append({"at": at, "kind": "abort", "label": "abort"})
        elif transition["action"] == "rolled_back":
            kind = rollback_label(record)
            label = kind if kind == "rollback" else "%s rollback" % kind
            found.append({"at": at, "kind": kind, "label": label})
    return found


def _wave_until(record, now):
    """The last moment of a wave: its last change once finished, else now."""
    last = unix(record["updated_at"], "updated_at")
    return last if record["outcome"] in FINISHED else max(now, last)


def timeline(records, now):
    """The series of every wave of a rollout ({wave: record}), waves in plan order.

    now (Unix) is where a wave still in progress (or a pause still on) ends.
    """
    ordered = sorted(records.items(), key=lambda item: (item[1].get("created_at", ""), item[0]))
    waves = []
    for wave, record in ordered:
        until = _wave_until(record, now)
        waves.append(
            {
                "wave": wave,
                "outcome": record["outcome"],
                "weight_steps": weight_steps(record, until),
                "cohort_stages": cohort_spans(record, until),
                "confirmed": confirmations(record),
                "readback_off": readbacks_off(record),
                "splits": measured_splits(record),
                "verdicts": verdict_points(record),
                "pauses": [
                    {"from": start, "to": end, "reason": reason}
                    for start, end, reason in pause_spans(record, until)
                ],
                "stops": stops(record),
            }
        )
    origin = min((wave["weight_steps"][0][0] for wave in waves), default=now)
    until = max((wave["weight_steps"][-1][0] for wave in waves), default=now)
    return {"origin": origin, "until": until, "waves": waves}


def stop_marks(series, near_s):
    """One labelled line per moment: the same stop of several waves (a rollback marks every
    wave's record within a second or so), and stops closer than near_s (an abort and the
    rollback it starts), drawn as one line naming them all; a label names its waves when
    not every wave recorded it."""
    every = [wave["wave"] for wave in series["waves"]]
    found = sorted(
        (stop["at"], stop["label"], wave["wave"])
        for wave in series["waves"]
        for stop in wave["stops"]
    )
    marks = []
    for at, label, wave in found:
        if not marks or at - marks[-1]["at"] > near_s:
            marks.append({"at": at, "labels": {}})
        marks[-1]["labels"].setdefault(label, []).append(wave)
    for mark in marks:
        mark["label"] = " + ".join(
            label if sorted(waves) == sorted(every) else "%s (%s)" % (label, ", ".join(waves))
            for label, waves in mark.pop("labels").items()
        )
    return marks


def draw_png(series, path, title, field="png"):
    """Draw the series to a PNG at path: weights and confirmations above, one lane of gate
    verdicts per wave below, pauses shaded, stops as labelled vertical lines."""
    plt = load_pyplot("the rollout picture", field)
    origin = series["origin"]
    size, unit = time_unit(series["until"] - origin)

    def x(at):
        return (at - origin) / size

    figure, (top, lanes) = plt.subplots(
        2, 1, figsize=FIGURE_SIZE, sharex=True, gridspec_kw={"height_ratios": [3, 1]}
    )
    confirmed_label = "weight confirmed (read back)"
    split_label = "split measured, with its agreeing range"
    off_label = "read back off its weight"
    for position, wave in enumerate(series["waves"]):
        colour = wave_colour(position)
        steps = wave["weight_steps"]
        top.step(
            [x(at) for at, _weight in steps],
            [weight for _at, weight in steps],
            where="post",
            color=colour,
            lw=2.5,
            label="%s: weight written (%s)" % (wave["wave"], wave["outcome"]),
        )
        if wave["confirmed"]:
            top.scatter(
                [x(point["at"]) for point in wave["confirmed"]],
                [point["weight"] for point in wave["confirmed"]],
                s=36,
                color=colour,
                edgecolors="black",
                zorder=3,
                label=confirmed_label,
            )
            confirmed_label = None
        if wave["readback_off"]:
            top.scatter(
                [x(point["at"]) for point in wave["readback_off"]],
                [point["weight"] for point in wave["readback_off"]],
                marker="x",
                color=colour,
                zorder=3,
                label=off_label,
            )
            off_label = None
        for point in wave["splits"]:
            top.errorbar(
                [x(point["at"])],
                [point["pct"]],
                yerr=[[point["pct"] - point["low"]], [point["high"] - point["pct"]]],
                fmt="D",
                ms=5,
                color=colour,
                mfc=colour if point["ok"] else "white",
                capsize=3,
                zorder=4,
                label=split_label,
            )
            split_label = None
        # At weight 0 the line says nothing of the cohort the stage sent direct: hatch it.
        for number, span in enumerate(wave["cohort_stages"]):
            top.axvspan(
                x(span["from"]),
                x(span["to"]),
                ymax=0.12,
                facecolor="none",
                edgecolor=colour,
                hatch="//",
                label="%s: cohort stage (%d prefixes direct)" % (wave["wave"], span["prefixes"])
                if number == 0
                else None,
            )
        for number, pause in enumerate(wave["pauses"]):
            for axis in (top, lanes):
                axis.axvspan(
                    x(pause["from"]),
                    x(pause["to"]),
                    color=colour,
                    alpha=0.15,
                    label="%s: paused" % wave["wave"] if axis is top and number == 0 else None,
                )
        for kind in VERDICT_KINDS:
            points = [point for point in wave["verdicts"] if point["kind"] == kind]
            if points:
                lanes.scatter(
                    [x(point["at"]) for point in points],
                    [position] * len(points),
                    color=VERDICT_COLOURS[kind],
                    s=28,
                    zorder=3,
                    label=kind.replace("_", " "),
                )
    # Closer than 2 % of the picture, two lines would print their labels over each other.
    for mark in stop_marks(series, 0.02 * (series["until"] - origin)):
        mark_moment((top, lanes), x(mark["at"]), mark["label"], color="black", ls="--")
    style_weight_axis(top)
    top.legend(loc="upper left", fontsize=8)
    lanes.set_yticks(range(len(series["waves"])))
    lanes.set_yticklabels([wave["wave"] for wave in series["waves"]])
    # Room above the top lane for the legend.
    lanes.set_ylim(-0.5, len(series["waves"]) + 0.2)
    lanes.set_ylabel("gate verdicts")
    # One legend entry per verdict kind, whichever wave drew it first.
    handles, labels = lanes.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    if unique:
        lanes.legend(unique.values(), unique.keys(), loc="upper left", fontsize=8, ncol=4)
    lanes.set_xlabel("%s since %s (the plan)" % (unit, whole_seconds(origin)))
    lanes.set_xlim(left=0, right=max(x(series["until"]), 1e-6) * 1.02)
    figure.suptitle(title)
    figure.tight_layout()
    save_png(plt, figure, path, field=field, dpi=DPI)
    return {"path": path, "width": int(FIGURE_SIZE[0] * DPI), "height": int(FIGURE_SIZE[1] * DPI)}


def picture_title(rollout_id, series):
    return "Rollout %s: %s" % (
        rollout_id,
        ", ".join("%s %s" % (wave["wave"], wave["outcome"]) for wave in series["waves"]) or "-",
    )
