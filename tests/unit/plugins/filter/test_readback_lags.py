"""readback_lags: whether one node's route read-back misses a canary stage, the rule the
read-back's retry and the confirmed step share (rollout_steps.readback_lags)."""

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.filter.readback_lags import readback_lags
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout_steps

COHORT = ["10.0.0.0/24"]


def route(name, weight_bp, always_direct=None):
    return {"name": name, "weight_bp": weight_bp, "always_direct": always_direct or []}


@pytest.mark.parametrize(
    ("read", "weight_bp", "cohort", "lags"),
    [
        # every canary route at the stage; a route that is not the canary's is not looked at
        ([route("chat", 500), route("embed", 500), route("other", 0)], 500, None, False),
        # one route still at the old weight
        ([route("chat", 500), route("embed", 100)], 500, None, True),
        # one of the two routes missing from the read
        ([route("chat", 500)], 500, None, True),
        # nothing read yet (the router not attached)
        ([], 500, None, True),
        # a cohort stage: the weight alone is not enough, the cohort must be there too
        ([route("chat", 0), route("embed", 0)], 0, COHORT, True),
        ([route("chat", 0, COHORT), route("embed", 0, COHORT)], 0, COHORT, False),
        # a stage without a cohort leaves always_direct as it is
        ([route("chat", 500, COHORT), route("embed", 500)], 500, None, False),
    ],
)
def test_a_node_lags_until_every_canary_route_is_at_the_stage(read, weight_bp, cohort, lags):
    assert readback_lags(read, ["chat", "embed"], weight_bp, cohort) is lags
    # The confirmed step decides with the same function.
    assert rollout_steps.readback_lags(read, ["chat", "embed"], weight_bp, cohort) is lags


def test_the_weight_may_come_as_text_from_a_template():
    assert readback_lags([route("chat", 500)], ["chat"], "500") is False


def test_a_read_that_is_not_a_list_of_routes_is_a_filter_error():
    with pytest.raises(AnsibleFilterError, match="readback_lags"):
        readback_lags([None], ["chat"], 500)
    with pytest.raises(AnsibleFilterError, match="readback_lags"):
        readback_lags([route("chat", 500)], ["chat"], "five")
