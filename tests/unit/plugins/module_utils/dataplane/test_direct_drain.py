"""The direct drain's close decision (the engines' rule) and the node's marker writer, which
must write what that rule reads."""

import importlib.util
import json
import os
from pathlib import Path

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import direct_drain
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import PinLayout

RULE_FILE = (
    Path(__file__).resolve().parents[5] / "roles/model_engine/files/zerolayer_direct_drain.py"
)
PORT = 8000
T = 1_800_000_000.0


def load_rule():
    spec = importlib.util.spec_from_file_location("zerolayer_direct_drain_under_test", RULE_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rule = load_rule()


def everything_at(since, epoch=3):
    return {"version": 1, "all": {"since_unix": since, "epoch": epoch, "reason": "r"}, "ports": {}}


def port_entry(since, updated, weight_bp, epoch=4):
    return {
        "since_unix": since,
        "updated_unix": updated,
        "weight_bp": weight_bp,
        "epoch": epoch,
        "reason": "r",
    }


# -- the rule ------------------------------------------------------------------------------


def test_no_marker_sends_nothing_away():
    assert rule.must_leave({}, PORT, T) is False
    assert rule.governing_entry({"version": 1, "ports": {}}, PORT) is None


@pytest.mark.parametrize("first_seen", [T - 100, T + 0.5, T + 1000])
def test_at_weight_0_every_direct_connection_leaves_whenever_it_came(first_seen):
    assert rule.must_leave(everything_at(T), PORT, first_seen) is True


def test_a_lowering_above_0_sends_away_the_connections_from_before_it_and_the_accept_queue():
    marker = {"version": 1, "ports": {str(PORT): port_entry(T, T, 2000)}}
    assert rule.must_leave(marker, PORT, T - 60) is True
    assert rule.must_leave(marker, PORT, T + rule.ACCEPT_SLACK_S - 0.01) is True
    assert rule.must_leave(marker, PORT, T + rule.ACCEPT_SLACK_S + 0.01) is False


def test_a_lowering_of_one_port_leaves_other_ports_alone():
    marker = {"version": 1, "ports": {str(PORT): port_entry(T, T, 0)}}
    assert rule.must_leave(marker, PORT + 1, T - 60) is False


def test_a_raise_after_a_rollback_governs_and_keeps_connections_made_after_it():
    raised = T + 0.2
    marker = everything_at(T)
    marker["ports"][str(PORT)] = port_entry(T, raised, 500)
    entry = rule.governing_entry(marker, PORT)
    assert entry["weight_bp"] == 500 and entry["epoch"] == 4
    assert rule.must_leave(marker, PORT, T - 1) is True
    assert rule.must_leave(marker, PORT, raised + 0.01) is False, "no slack past the raise"


def test_a_rollback_after_a_raise_governs_again():
    marker = everything_at(T + 10, epoch=5)
    marker["ports"][str(PORT)] = port_entry(T, T + 5, 10000)
    assert rule.governing_entry(marker, PORT)["epoch"] == 5
    assert rule.must_leave(marker, PORT, T + 9) is True


@pytest.mark.parametrize(
    ("in_flight", "idle_s", "expected"),
    [(0, 0.6, True), (0, 0.4, False), (1, 10.0, False)],
)
def test_an_idle_close_needs_nothing_in_flight_and_the_grace(in_flight, idle_s, expected):
    marker = everything_at(T)
    assert rule.close_idle_now(marker, PORT, T - 1, in_flight, idle_s, 0.5) is expected


@pytest.mark.parametrize(
    "text", ['{"version": 1, "all": {"since_un', '{"version": 2, "all": {}}', "[]", ""]
)
def test_a_torn_or_foreign_marker_is_empty(text):
    assert rule.parse_marker(text) == {}


def test_the_marker_file_is_read_again_when_it_changes(tmp_path):
    path = tmp_path / "marker.json"
    now = [0.0]
    reader = rule.MarkerFile(str(path), clock=lambda: now[0])
    assert reader.current() == {}
    path.write_text(json.dumps(everything_at(T)))
    assert reader.current() == {}, "looked at again only after RECHECK_S"
    now[0] += rule.RECHECK_S
    assert reader.current()["all"]["since_unix"] == T
    os.unlink(path)
    now[0] += rule.RECHECK_S
    assert reader.current() == {}


# -- the writer writes what the rule reads -------------------------------------------------


@pytest.fixture
def layout(tmp_path):
    fence = tmp_path / "fence.json"
    fence.write_text(json.dumps({"epoch": 9}))
    return PinLayout("/sys/fs/bpf/zerolayer-unit", fence_file=str(fence))


def read_as_engines_do(layout):
    return rule.parse_marker(Path(layout.direct_drain_file).read_text())


def test_the_marker_lies_beside_a_non_default_fence_file_and_in_run_by_default(layout):
    assert layout.direct_drain_file == os.path.join(
        os.path.dirname(layout.fence_file), "direct-drain.json"
    )
    assert PinLayout().direct_drain_file == "/run/zerolayer/direct-drain.json"


def test_every_route_at_0_sends_every_direct_connection_away(layout):
    assert direct_drain.note_all_zero(layout, "fast rollback") is True
    marker = read_as_engines_do(layout)
    assert marker["all"]["epoch"] == 9 and marker["all"]["reason"] == "fast rollback"
    assert rule.must_leave(marker, PORT, T * 2) is True
    assert os.stat(layout.direct_drain_file).st_mode & 0o777 == 0o644, "engines read it"


def test_a_lowering_then_a_raise_ends_the_closing(layout):
    direct_drain.note_weight(layout, PORT, 10000, 2000, "step down", epoch=11)
    lowered = read_as_engines_do(layout)["ports"][str(PORT)]
    assert lowered["weight_bp"] == 2000 and lowered["epoch"] == 11
    assert lowered["since_unix"] == lowered["updated_unix"]
    direct_drain.note_weight(layout, PORT, 2000, 5000, "step up", epoch=11)
    raised = read_as_engines_do(layout)["ports"][str(PORT)]
    assert raised["since_unix"] == lowered["since_unix"], "a raise moves nothing"
    marker = read_as_engines_do(layout)
    assert rule.must_leave(marker, PORT, raised["updated_unix"] + 0.01) is False
    assert rule.must_leave(marker, PORT, lowered["since_unix"] - 1) is True


def test_a_raise_after_every_route_went_to_0_keeps_the_rollbacks_moment(layout):
    direct_drain.note_all_zero(layout, "fast rollback")
    since = read_as_engines_do(layout)["all"]["since_unix"]
    direct_drain.note_weight(layout, PORT, 0, 100, "canary 1%")
    marker = read_as_engines_do(layout)
    assert marker["ports"][str(PORT)]["since_unix"] == since
    assert rule.governing_entry(marker, PORT)["weight_bp"] == 100


def test_an_unchanged_weight_writes_nothing(layout):
    assert direct_drain.note_weight(layout, PORT, 500, 500, "same") is None
    assert not os.path.exists(layout.direct_drain_file)


def test_a_marker_that_cannot_be_written_is_reported_not_raised(tmp_path):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    layout = PinLayout("/sys/fs/bpf/zerolayer-unit", fence_file=str(blocker / "fence.json"))
    assert direct_drain.note_all_zero(layout, "fast rollback", epoch=1) is False


def test_an_engine_replaced_in_its_slot_sends_the_old_connections_to_be_decided_again(layout):
    direct_drain.note_weight(layout, PORT, 0, 10000, "canary 100%")
    assert direct_drain.note_engine_replaced(layout, PORT, 10000, "upgrade swap") is True
    marker = read_as_engines_do(layout)
    entry = marker["ports"][str(PORT)]
    assert entry["weight_bp"] == 10000, "the weight stays"
    assert rule.must_leave(marker, PORT, entry["since_unix"] - 5) is True
    assert rule.must_leave(marker, PORT, entry["since_unix"] + rule.ACCEPT_SLACK_S + 0.1) is False
