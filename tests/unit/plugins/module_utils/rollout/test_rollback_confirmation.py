"""Each node's line in a rollback report (rollback_confirmation.py): watcher, push, or nothing."""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollback_confirmation import (
    NO_RESULT,
    by_fast_push,
    by_watcher,
    direct_drains,
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


# What `raw: zerolayer-routectl rollback` registers on a node it reached.
ROUTECTL_LINE = (
    '{"elapsed_ms": 3.2, "fence_epoch": 9, "rolled_back": true,'
    ' "routes": [{"route": "chat", "weight_before": 2000, "weight": 0}]}'
)
PUSHED = {"rc": 0, "stdout": "warming up\r\n" + ROUTECTL_LINE + "\r\n", "stderr": ""}


def test_a_fast_push_that_rolled_back_is_a_confirmed_line_from_the_last_json_line():
    assert by_fast_push("n2", PUSHED) == {
        "node": "n2",
        "reached": True,
        "confirmed": True,
        "confirmed_by": "push",
        "routes": [{"route": "chat", "weight_before": 2000, "weight": 0}],
        "fence_epoch": 9,
        "node_elapsed_ms": 3.2,
        "error": None,
    }


@pytest.mark.parametrize(
    "result, reached, error",
    [
        # routectl refused (a weight write fenced, a map missing): its own words.
        ({"rc": 1, "stdout": '{"rolled_back": false}', "stderr": " map gone \n"}, True, "map gone"),
        # It exited 0 but did not say every route is at 0.
        ({"rc": 0, "stdout": '{"rolled_back": false}', "stderr": ""}, True, "exit status 0"),
        # No JSON at all, or a line that only looks like it.
        ({"rc": 0, "stdout": "{not json", "stderr": ""}, True, "exit status 0"),
        ({"rc": 127, "stdout": "", "stderr": "", "msg": "non-zero return code"}, True,
         "non-zero return code"),
        ({"unreachable": True, "msg": "ssh: connect to host n2 port 22: refused"}, False,
         "ssh: connect to host n2 port 22: refused"),
        ({"unreachable": True}, False, "exit status none"),
    ],
)  # fmt: skip
def test_a_fast_push_that_did_not_roll_back_says_why(result, reached, error):
    entry = by_fast_push("n2", result)
    assert (entry["reached"], entry["confirmed"], entry["error"]) == (reached, False, error)
    assert entry["confirmed_by"] == "push"


@pytest.mark.parametrize("result", [None, {"skipped": True, "changed": False}, "text"])
def test_a_node_the_push_did_not_run_on_has_no_push_line(result):
    assert by_fast_push("n2", result) is None


def test_fast_push_results_fill_the_lines_a_sharded_push_did_not_and_never_an_acked_one():
    failed = {"rc": 1, "stdout": "", "stderr": "fenced"}
    sharded = {"n3": {"node": "n3", "reached": True, "confirmed": True, "confirmed_by": "push"}}
    lines = node_confirmations(
        ["n1", "n2", "n3", "n4", "n5"],
        {"n1": FAST_ACK},
        sharded,
        "fast",
        {"n1": failed, "n2": PUSHED, "n3": failed, "n4": failed},
    )
    assert [(line["node"], line["confirmed"]) for line in lines] == [
        ("n1", True), ("n2", True), ("n3", True), ("n4", False), ("n5", False)
    ]  # fmt: skip
    assert lines[0]["confirmed_by"] == "watcher" and lines[2] is sharded["n3"]
    assert lines[3]["error"] == "fenced" and lines[4]["error"] == NO_RESULT


def test_a_deep_push_line_is_what_deep_push_noted_for_that_node():
    noted = {"node": "n2", "reached": True, "confirmed": True, "confirmed_by": "push"}
    lines = node_confirmations(["n2", "n3"], {}, {}, "deep", {"n2": noted, "n3": {"rc": 0}})
    assert lines[0] is noted
    assert lines[1]["error"] == NO_RESULT, "a result that is no deep note confirms nothing"


# -- how the pooled clients' direct connections left ----------------------------------------

STARTED = 1_796_000_000.0


def watcher_report(drained, left=None, at=STARTED + 0.8):
    return {
        "node": "ignored",
        "epoch": 7,
        "action": "fast",
        "first": {"chat": 3},
        "left": left or {},
        "drained": drained,
        "drained_after_s": 0.4 if drained else None,
        "waited_s": 0.4,
        "at_unix": at,
    }


def test_direct_drains_by_watcher_and_by_push_and_the_nodes_that_said_nothing():
    pushed = {
        "n3": {
            "rc": 1,
            "stdout": '{"drained": false, "first": {"chat": 2}, "left": {"chat": 2}, '
            '"drained_after_s": null, "waited_s": 35.0}\n',
        },
        "n4": {"rc": 0, "stdout": "not json\n"},
    }
    summary = direct_drains(
        ["n1", "n2", "n3", "n4"],
        {"n1": watcher_report(True), "n2": watcher_report(True, at=STARTED + 1.25)},
        pushed,
        STARTED,
    )
    assert summary["nodes"]["n1"] == {
        "by": "watcher",
        "drained": True,
        "first": {"chat": 3},
        "left": {},
        "drained_after_s": 0.4,
        "after_command_start_s": 0.8,
    }
    assert summary["nodes"]["n3"]["by"] == "push"
    assert summary["left"] == {"n3": {"chat": 2}}
    assert summary["unreported"] == ["n4"]
    assert summary["slowest_after_command_start_s"] == 1.25


def test_direct_drains_with_nothing_reported():
    summary = direct_drains(["n1"], {}, {}, STARTED)
    assert summary == {
        "nodes": {},
        "left": {},
        "unreported": ["n1"],
        "slowest_after_command_start_s": None,
    }
