# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The canary's report at the end of a run: what stopped it, each wave's outcome, the rows.

canary.yml writes it next to the records (report-<rollout_id>.json) and shows its summary,
the one line a person reads first: the stop's own message when something stopped the run
(a pause, a failed gate, a lagging node), else each wave's outcome and weight. The rows are
the stage table's (rollout/stage_table.py), from the controller's copies of the records.
"""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.stage_table import (
    rollout_rows,
)


def summary_line(rollout_id, stopped, waves):
    """stopped: the run's halt ({} when nothing stopped it); waves: each wave's summary with
    its name under "wave", in the order the run went through them."""
    if stopped:
        return stopped["message"]
    outcomes = "; ".join(
        "wave %s %s at %s%%" % (wave["wave"], wave["outcome"], wave["weight"]) for wave in waves
    )
    return "Rollout %s: %s." % (rollout_id, outcomes)


def canary_report(rollout_id, stopped, waves, records, now):
    """The report: {rollout_id, stopped, waves, stages (one row per wave and stage), summary}.

    records: the rollout's records, {wave: record}; now: the Unix time the rows end at.
    """
    stopped = stopped or {}
    if not isinstance(stopped, dict) or (stopped and "message" not in stopped):
        raise FleetError(
            "stopped must be the run's halt, a dict with its message, or {}; got %r" % (stopped,),
            {"field": "stopped"},
        )
    return {
        "rollout_id": rollout_id,
        "stopped": stopped,
        "waves": list(waves),
        "stages": rollout_rows(records, now),
        "summary": summary_line(rollout_id, stopped, waves),
    }
