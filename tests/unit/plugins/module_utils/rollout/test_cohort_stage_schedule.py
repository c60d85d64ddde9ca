"""A cohort stage in the canary's schedule (module_utils/rollout/rollout.py validate_schedule): the
first stage at weight 0 where only the cohort's clients take the direct path, and every
stage after it clearing the cohort; bad cohort stages refused naming the field."""

import datetime

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

T0 = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.timezone.utc)
ME = "sre@controller"
WITH_COHORT = [
    {"cohort": ["10.20.0.0/16", "192.0.2.7"], "hold": "30m"},
    {"weight": 1, "hold": "2h"},
    {"weight": 100},
]


def test_a_cohort_stage_runs_at_weight_0_and_the_stages_after_it_clear_the_cohort():
    schedule = r.validate_schedule(WITH_COHORT)
    assert schedule == [
        {"weight": 0, "weight_bp": 0, "hold_s": 1800, "cohort": ["10.20.0.0/16", "192.0.2.7/32"]},
        {"weight": 1, "weight_bp": 100, "hold_s": 7200, "cohort": []},
        {"weight": 100, "weight_bp": 10000, "hold_s": 0, "cohort": []},
    ]


def test_a_cohort_stage_may_say_weight_0_and_holds_ipv6_networks():
    schedule = r.validate_schedule(
        [{"cohort": ["2001:db8::/48"], "weight": 0, "hold": 60}, {"weight": 100}]
    )
    assert schedule[0]["cohort"] == ["2001:db8::/48"]
    assert schedule[0]["weight_bp"] == 0


def test_a_schedule_without_a_cohort_stage_leaves_the_cohort_alone():
    assert all("cohort" not in stage for stage in r.validate_schedule(r.DEFAULT_SCHEDULE))


@pytest.mark.parametrize(
    ("schedule", "field", "allowed"),
    [
        (
            [{"weight": 1}, {"cohort": ["10.0.0.0/8"]}, {"weight": 100}],
            "schedule[1].cohort",
            "only the first stage",
        ),
        ([{"cohort": ["10.0.0.0/8"], "weight": 5}, {"weight": 100}], "schedule[0].weight", "0"),
        ([{"cohort": []}, {"weight": 100}], "schedule[0].cohort", "at least one client network"),
        ([{"cohort": ["10.0.0.1/8"]}, {"weight": 100}], "schedule[0].cohort", "no host bits"),
        ([{"cohort": ["ten"]}, {"weight": 100}], "schedule[0].cohort", "CIDR notation"),
        ([{"cohort": "10.0.0.0/8"}, {"weight": 100}], "schedule[0].cohort", "a list of"),
        ([{"cohort": ["10.0.0.0/8"]}], "schedule[0].weight", "must be 100"),
        (
            [{"cohort": ["10.0.0.0/8"]}, {"weight": 0}, {"weight": 100}],
            "schedule[1].weight",
            "above 0",
        ),
    ],
)
def test_bad_cohort_stages_name_the_field_and_allowed_values(schedule, field, allowed):
    with pytest.raises(FleetError) as caught:
        r.validate_schedule(schedule)
    assert caught.value.details["field"] == field
    assert field in caught.value.message
    assert allowed in caught.value.message


def test_a_cohort_stage_with_more_prefixes_than_the_router_holds_is_refused():
    too_many = ["10.%d.%d.0/24" % (i // 256, i % 256) for i in range(1025)]
    with pytest.raises(FleetError) as caught:
        r.validate_schedule([{"cohort": too_many}, {"weight": 100}])
    assert caught.value.details["field"] == "schedule[0].cohort"
    assert "at most 1024" in caught.value.message


def test_resuming_with_another_cohort_is_refused_as_another_schedule():
    record, _changed, _note = r.plan(None, "chat-1", WITH_COHORT, None, False, T0, ME)
    same, changed, note = r.plan(record, "chat-1", WITH_COHORT, None, False, T0, ME)
    assert (changed, note) == (False, "resumed")
    assert same["schedule"] == record["schedule"]
    other = [dict(WITH_COHORT[0], cohort=["10.30.0.0/16"]), *WITH_COHORT[1:]]
    with pytest.raises(FleetError) as caught:
        r.plan(record, "chat-1", other, None, False, T0, ME)
    assert caught.value.details["field"] == "schedule"
