"""`zerolayer rollout status` of a wave whose schedule starts with a cohort stage (weight 0:
only the clients of its source CIDRs go direct): the stage named by its cohort, the schedule
beside it, the cohort's connections per node; and a record from before cohort stages shown
as it always was. The rows are the store's status rows (rollout_ops, which carry each wave's
schedule and current cohort from the record it reads) of records made with the rollout
module's own actions."""

import datetime
import json

from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout_ops

T0 = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
ME = "runner@ctl"
PLAIN = [{"weight": 1, "hold": "1h"}, {"weight": 5, "hold": "2h"}, {"weight": 20, "hold": "8h"},
         {"weight": 50, "hold": "8h"}, {"weight": 100}]  # fmt: skip
COHORT = ["10.1.0.0/16", "192.0.2.7/32"]
# As the rollout module normalises {cohort: [...], hold: 30m} before 1 %: every stage has a
# "cohort" list, [] where it names none.
COHORT_SCHEDULE = [
    {"weight": 0, "weight_bp": 0, "hold_s": 1800, "cohort": COHORT},
    {"weight": 1, "weight_bp": 100, "hold_s": 3600, "cohort": []},
    {"weight": 5, "weight_bp": 500, "hold_s": 7200, "cohort": []},
    {"weight": 20, "weight_bp": 2000, "hold_s": 28800, "cohort": []},
    {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
]


def at(minutes):
    return T0 + datetime.timedelta(minutes=minutes)


def act(record, action, minutes, **params):
    return r.apply(record, action, params, at(minutes), ME)[0]


def cohort_split(opt_in, to_engine=0):
    return {"ok": to_engine == 0, "cohort": True, "opt_in": opt_in, "connections": opt_in + 40,
            "to_engine": to_engine, "weight_pct": 0.0, "measured_pct": 0.0, "low_pct": 0.0,
            "high_pct": 0.0, "addresses": 0}  # fmt: skip


def at_cohort_stage(splits):
    """chat-9's canary wave holding its cohort stage, its split measured on every node."""
    record = r.plan(None, "chat-9:wave_canary", PLAIN, None, False, at(0), ME)[0]
    record["schedule"] = [dict(stage) for stage in COHORT_SCHEDULE]
    record = act(record, "stage_started", 1, stage=0)
    read_back = {"weight": 0, "generation": 3}
    record = act(record, "weight_confirmed", 2, nodes={node: read_back for node in splits})
    record = act(record, "split_measured", 3, splits=splits)
    return act(record, "hold_started", 3)


def report_of(records):
    """rollout_ops.status's report of {"<rollout_id>/<wave>": record}, nothing live."""
    fence = {"epoch": 0}
    rollouts = {}
    for name, record in records.items():
        rollout_id, wave = name.split("/", 1)
        row = rollout_ops._wave_status(record, fence, at(10), owned=True)
        rollouts.setdefault(rollout_id, {})[wave] = row
    return {"fence": fence, "owners": {}, "rollouts": rollouts}


def test_a_cohort_stage_is_named_with_its_prefixes_and_the_schedule_shows_it():
    record = at_cohort_stage({"zl-node-01": cohort_split(200), "zl-node-02": cohort_split(212)})
    records = {"chat-9/wave_canary": record}
    report = report_of(records)
    row = report["rollouts"]["chat-9"]["wave_canary"]
    assert (row["cohort"], row["schedule"]) == (COHORT, COHORT_SCHEDULE)
    lines = rollout_cli.render_status(report).split("\n")
    header, line = lines[1], lines[2]
    assert line.split()[:5] == ["chat-9", "wave_canary", "running", "1/5", "cohort"]
    # Under WEIGHT, right-aligned as the percents are.
    assert line.index("cohort") + len("cohort") == header.index("WEIGHT") + len("WEIGHT")
    assert "zl-node-01 0% (opt-in 200 conn.), zl-node-02 0% (opt-in 212 conn.)" in line
    assert lines[3].strip() == (
        "stage 1/5 cohort (2 prefixes: 10.1.0.0/16, 192.0.2.7/32) at weight 0"
    )
    assert lines[4].strip() == "schedule: cohort (2 prefixes) 30m, 1% 1h, 5% 2h, 20% 8h, 100%"
    # The JSON (-o json) carries the same: the schedule and the current stage's cohort.
    assert json.loads(json.dumps(report))["rollouts"]["chat-9"]["wave_canary"]["cohort"] == COHORT


def test_a_node_whose_weight_sent_connections_direct_at_the_cohort_stage_is_off():
    record = at_cohort_stage({"n1": cohort_split(90), "n2": cohort_split(80, to_engine=3)})
    records = {"chat-9/wave_canary": record}
    text = rollout_cli.render_status(report_of(records))
    assert "n1 0% (opt-in 90 conn.), n2 0% (opt-in 80 conn., 3 by weight OFF)" in text


def test_a_long_cohort_is_listed_short():
    cohort = ["10.%d.0.0/16" % n for n in range(6)]
    record = at_cohort_stage({"n1": cohort_split(5)})
    record["schedule"][0]["cohort"] = cohort
    records = {"chat-9/wave_canary": record}
    text = rollout_cli.render_status(report_of(records))
    assert (
        "stage 1/5 cohort (6 prefixes: 10.0.0.0/16, 10.1.0.0/16, 10.2.0.0/16 +3 more) at weight 0"
        in text
    )
    assert "schedule: cohort (6 prefixes) 30m, 1% 1h" in text


def test_past_the_cohort_stage_the_weight_shows_and_the_schedule_still_names_the_cohort():
    record = at_cohort_stage({"n1": cohort_split(5)})
    record = act(record, "stage_completed", 33)
    record = act(record, "stage_started", 34, stage=1)
    records = {"chat-9/wave_canary": record}
    report = report_of(records)
    assert report["rollouts"]["chat-9"]["wave_canary"]["cohort"] == []
    lines = rollout_cli.render_status(report).split("\n")
    assert lines[2].split()[3:5] == ["2/5", "1"]
    assert [line.strip() for line in lines[3:]] == [
        "schedule: cohort (2 prefixes) 30m, 1% 1h, 5% 2h, 20% 8h, 100%"
    ]


def test_a_record_from_before_cohort_stages_shows_as_it_always_did():
    record = r.plan(None, "chat-3:wave_canary", PLAIN, None, False, at(0), ME)[0]
    record = act(act(record, "stage_started", 1, stage=0), "hold_started", 2)
    records = {"chat-3/wave_canary": record}
    report = report_of(records)
    assert report["rollouts"]["chat-3"]["wave_canary"]["cohort"] == []
    text = rollout_cli.render_status(report)
    assert "cohort" not in text and "schedule" not in text
    assert text.split("\n")[2].split()[3:5] == ["1/5", "1"]


def test_the_list_names_a_rollout_at_its_cohort_stage_and_a_plain_one_by_its_weight():
    holding = report_of({"chat-9/wave_canary": at_cohort_stage({"n1": cohort_split(90)})})
    waves = holding["rollouts"]["chat-9"]
    cohort_row = rollout_ops.rollout_row("chat-9", waves, "2026-12-01T10:00:00Z")
    assert (cohort_row["weight"], cohort_row["cohort"]) == (0, True)
    plain = r.plan(None, "chat-8:wave_canary", PLAIN, None, False, at(0), ME)[0]
    plain = act(plain, "stage_started", 1, stage=0)
    plain_waves = report_of({"chat-8/wave_canary": plain})["rollouts"]["chat-8"]
    plain_row = rollout_ops.rollout_row("chat-8", plain_waves, "2026-12-01T09:00:00Z")
    assert plain_row["cohort"] is False
    lines = rollout_cli.render_list({"rollouts": [cohort_row, plain_row], "total": 2}).split("\n")
    header = lines[0]
    cells = {line.split()[0]: line[: header.index("WEIGHT") + len("WEIGHT")].split()[-1]
             for line in lines[1:]}  # fmt: skip
    assert cells["chat-9"] == "cohort"
    assert cells["chat-8"] == str(plain_row["weight"])
