"""Each node's line in a rollback report (rollback_confirmation.py): watcher, push, or nothing."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollback_confirmation import (
    NO_RESULT,
    by_watcher,
    node_confirmations,
)

FAST_ACK = {
    "epoch": 7,
    "action": "fast",
    "confirmed": True,
    "read_back": {"node_epoch": 7, "weights_bp": {"chat": 0, "batch": 0}},
    "took_ms": 41.5,
    "seen_after_s": 0.062,
}
DEEP_ACK = {
    "epoch": 8,
    "action": "deep",
    "confirmed": True,
    "read_back": {
        "node_epoch": 8,
        "attached": False,
        "mode": "detached",
        "weights_bp": {},
        "proxy_running": True,
        "paths": {"chat": "proxy"},
    },
    "took_ms": 90.0,
    "seen_after_s": 0.2,
}


def test_a_fast_acknowledgement_becomes_a_confirmed_line_with_its_weights():
    entry = by_watcher("n1", FAST_ACK, "fast")
    assert entry == {
        "node": "n1",
        "reached": True,
        "confirmed": True,
        "confirmed_by": "watcher",
        "seen_after_s": 0.062,
        "fence_epoch": 7,
        "node_elapsed_ms": 41.5,
        "error": None,
        "routes": [{"route": "batch", "weight_bp": 0}, {"route": "chat", "weight_bp": 0}],
    }


def test_a_deep_acknowledgement_says_router_proxy_and_paths():
    entry = by_watcher("n1", DEEP_ACK, "deep")
    assert (entry["router_removed"], entry["proxy_running"], entry["paths"]) == (
        True,
        True,
        {"chat": "proxy"},
    )
    assert "routes" not in entry


def test_an_acknowledgement_without_a_read_back_says_the_router_was_not_seen_removed():
    entry = by_watcher("n1", {"epoch": 8, "confirmed": True}, "deep")
    assert entry["router_removed"] is False and entry["paths"] == {}


def test_every_target_gets_one_line_in_order_watcher_first_then_push_then_nothing():
    pushed_entry = {"node": "n2", "reached": True, "confirmed": True, "confirmed_by": "push"}
    lines = node_confirmations(
        ["n3", "n2", "n1", "n4"],
        {"n1": FAST_ACK},
        {"n2": pushed_entry, "n3": None},
        "fast",
    )
    assert [line["node"] for line in lines] == ["n3", "n2", "n1", "n4"]
    assert lines[0] == {"node": "n3", "reached": False, "confirmed": False, "error": NO_RESULT}
    assert lines[1] is pushed_entry
    assert lines[2]["confirmed_by"] == "watcher"
    assert lines[3]["confirmed"] is False, "a node in neither did not answer"


def test_an_acknowledged_node_is_never_taken_from_a_push():
    lines = node_confirmations(["n1"], {"n1": FAST_ACK}, {"n1": {"node": "n1"}}, "fast")
    assert lines[0]["confirmed_by"] == "watcher"


def test_no_store_no_acks_every_line_from_the_push():
    pushed = {"n1": {"node": "n1", "confirmed": True, "confirmed_by": "push"}}
    assert node_confirmations(["n1"], None, pushed, "fast") == [pushed["n1"]]


@pytest.mark.parametrize("mode", ["abort", "", None])
def test_an_unknown_mode_is_refused_naming_the_field(mode):
    with pytest.raises(FleetError) as refused:
        node_confirmations(["n1"], {}, {}, mode)
    assert refused.value.details == {"field": "mode"}
