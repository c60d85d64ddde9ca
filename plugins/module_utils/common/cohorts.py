# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A stage's cohort: the source CIDRs whose clients a cohort stage (weight 0) sends to the
engine on the direct path, as a rollout record's schedule holds them, and named for people.

The rollout's events (the cohort in an event's detail, "cohort (N prefixes)" in its line),
the final reports' table, the drill and the progress callback read and name a cohort
with these same helpers. Plain data, no imports: every layer can use them.
"""

from __future__ import annotations

# A cohort's prefixes named in full up to this many; the rest counted ("+2 more").
COHORT_PREFIXES_SHOWN = 3


def stage_cohort(planned):
    """The source CIDRs of a schedule stage's cohort; [] for a stage by weight, and for the
    stages of a record from before cohort stages (no "cohort" key)."""
    if not isinstance(planned, dict):
        return []
    return [str(prefix) for prefix in planned.get("cohort") or []]


def schedule_cohort(schedule, index):
    """stage_cohort of schedule[index]; [] where the index is not the schedule's."""
    schedule = schedule or []
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(schedule):
        return []
    return stage_cohort(schedule[index])


def format_prefixes(prefixes, shown=COHORT_PREFIXES_SHOWN):
    """'10.1.0.0/16, 192.0.2.7/32', or the first `shown` of them and '+N more'."""
    prefixes = list(prefixes or [])
    text = ", ".join(prefixes[:shown])
    if len(prefixes) > shown:
        text += " +%d more" % (len(prefixes) - shown)
    return text


def format_cohort(prefixes, listed=False):
    """'cohort (2 prefixes)', with listed 'cohort (2 prefixes: 10.1.0.0/16, 192.0.2.7/32)'."""
    count = len(prefixes or [])
    text = "%d %s" % (count, "prefix" if count == 1 else "prefixes")
    if listed and count:
        text += ": " + format_prefixes(prefixes)
    return "cohort (%s)" % text
