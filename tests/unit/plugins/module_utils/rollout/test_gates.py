"""Canary gates: definitions, one evaluation, and the stage decision (pure logic)."""

import datetime
import io
import json
import math
import socket
from urllib.error import HTTPError, URLError

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.zerolayer.fleet.plugins.filter.gate_evaluations import gate_evaluations
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import clock
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import gates as g
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry.prometheus_api import (
    PrometheusClient,
    Sample,
    parse_query_response,
    parse_range_response,
)

T0 = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)


def at(seconds):
    return T0 + datetime.timedelta(seconds=seconds)


def gate(**overrides):
    definition = {"name": "p99", "query": "q", "comparison": "<", "threshold": 5}
    definition.update(overrides)
    return definition


class FakePrometheus:
    """Answers queries from a dict: promql -> list of Samples, or a FleetError to raise."""

    def __init__(self, answers):
        self.answers = answers
        self.asked = []

    def __call__(self, promql):
        self.asked.append(promql)
        answer = self.answers.get(promql, [])
        if isinstance(answer, FleetError):
            raise answer
        return answer


def series(*values, label="instance"):
    return [Sample({label: "n%d" % index}, value) for index, value in enumerate(values)]


# ---------------------------------------------------------------- definitions


@pytest.mark.parametrize(
    ("definitions", "field", "names"),
    [
        ("not a list", "gates", "non-empty list"),
        ([], "gates", "non-empty list"),
        (["p99"], "gates[0]", "name, query, comparison, threshold"),
        ([gate(colour="red")], "gates[0]", "allowed keys: name, query"),
        ([gate(name="")], "gates[0].name", "letters, digits"),
        ([gate(name="bad name")], "gates[0].name", "letters, digits"),
        ([gate(query="  ")], "gates[0].query", "non-empty PromQL"),
        (
            [gate(query="x[${range}]")],
            "gates[0].query",
            "${stage_start}, ${stage_elapsed}, ${stage_nodes}, ${window}",
        ),
        ([gate(comparison="==")], "gates[0].comparison", "'<', '<=', '>', '>='"),
        ([gate(comparison=None)], "gates[0].comparison", "'<', '<=', '>', '>='"),
        ([{"name": "a", "query": "q", "comparison": "<"}], "gates[0].threshold", "a number"),
        ([gate(threshold="fast")], "gates[0].threshold", "finite number"),
        ([gate(threshold=True)], "gates[0].threshold", "finite number"),
        ([gate(threshold=float("nan"))], "gates[0].threshold", "finite number"),
        ([gate(min_samples=10)], "gates[0].min_samples_query", "go together"),
        ([gate(min_samples_query="count")], "gates[0].min_samples", "go together"),
        ([gate(min_samples_query="c", min_samples=-1)], "gates[0].min_samples", ">= 0"),
        (
            [gate(min_samples_query="c", min_samples="many")],
            "gates[0].min_samples",
            "finite number",
        ),
        ([gate(require_data="yes")], "gates[0].require_data", "true or false"),
        ([gate(description=3)], "gates[0].description", "string"),
        ([gate(), gate(query="other")], "gates[1].name", "unique"),
    ],
)
def test_bad_gate_definitions_name_the_field_and_allowed_values(definitions, field, names):
    with pytest.raises(FleetError) as caught:
        g.validate_gates(definitions)
    assert caught.value.details["field"] == field
    assert field in caught.value.message
    assert names in caught.value.message


def test_valid_definitions_are_normalised():
    (parsed,) = g.validate_gates(
        [gate(threshold="0.9995", comparison=">=", min_samples_query=" c ", min_samples="100")]
    )
    assert parsed.threshold == pytest.approx(0.9995)
    assert parsed.min_samples == 100.0
    assert parsed.min_samples_query == "c"
    assert parsed.require_data is True
    assert parsed.as_dict()["min_samples"] == 100.0


# ---------------------------------------------------------------- one gate


def evaluate(definition, answers, values=None):
    (parsed,) = g.validate_gates([definition])
    prometheus = FakePrometheus(answers)
    return g.evaluate_gate(parsed, prometheus, values or {"window": "5m"}), prometheus


def test_value_below_threshold_passes():
    result, _asked = evaluate(gate(), {"q": [Sample({}, 3.0)]})
    assert result["verdict"] == "pass"
    assert result["value"] == 3.0


@pytest.mark.parametrize(
    ("comparison", "value", "verdict"),
    [
        ("<", 5.0, "fail"),
        ("<=", 5.0, "pass"),
        (">", 5.0, "fail"),
        (">=", 5.0, "pass"),
        (">", 6.0, "pass"),
        ("<", float("inf"), "fail"),
    ],
)
def test_comparisons_at_and_beyond_the_threshold(comparison, value, verdict):
    result, _asked = evaluate(gate(comparison=comparison), {"q": [Sample({}, value)]})
    assert result["verdict"] == verdict


def test_every_series_must_pass_and_the_worst_failing_one_is_reported():
    result, _asked = evaluate(gate(), {"q": series(1.0, 7.0, 9.0, 2.0)})
    assert result["verdict"] == "fail"
    assert result["value"] == 9.0
    assert result["worst_series"] == {"instance": "n2"}
    assert "2 of 4 series fail" in result["reason"]
    assert 'instance="n2"' in result["reason"]


def test_passing_vector_reports_the_series_closest_to_failing():
    result, _asked = evaluate(
        gate(comparison=">=", threshold=0.99), {"q": series(0.999, 0.995, 1.0)}
    )
    assert result["verdict"] == "pass"
    assert result["value"] == 0.995
    assert result["worst_series"] == {"instance": "n1"}


def test_no_data_holds_when_required():
    result, _asked = evaluate(gate(), {})
    assert result["verdict"] == "hold"
    assert result["reason"] == "no data"


def test_no_data_passes_marked_not_required():
    result, _asked = evaluate(gate(require_data=False), {})
    assert result["verdict"] == "pass"
    assert result["reason"] == "no data, not required"


def test_nan_holds():
    result, _asked = evaluate(gate(), {"q": series(1.0, float("nan"))})
    assert result["verdict"] == "hold"
    assert "NaN" in result["reason"]


def test_a_real_failure_wins_over_nan_in_another_series():
    result, _asked = evaluate(gate(), {"q": series(float("nan"), 8.0)})
    assert result["verdict"] == "fail"


def test_too_few_samples_holds_without_asking_the_main_query():
    definition = gate(min_samples_query="count", min_samples=100)
    result, prometheus = evaluate(
        definition, {"count": [Sample({}, 12.0)], "q": [Sample({}, 99.0)]}
    )
    assert result["verdict"] == "hold"
    assert result["reason"] == "too few samples: 12 < 100"
    assert result["samples"] == 12.0
    assert prometheus.asked == ["count"]


def test_the_smallest_series_of_the_samples_query_decides():
    definition = gate(min_samples_query="count", min_samples=100)
    answers = {"count": series(500.0, 40.0), "q": [Sample({}, 1.0)]}
    result, _asked = evaluate(definition, answers)
    assert result["verdict"] == "hold"
    assert result["samples"] == 40.0


def test_enough_samples_lets_the_gate_decide():
    definition = gate(min_samples_query="count", min_samples=100)
    result, _asked = evaluate(definition, {"count": [Sample({}, 100.0)], "q": [Sample({}, 9.0)]})
    assert result["verdict"] == "fail"
    assert result["samples"] == 100.0


def test_no_samples_series_counts_as_zero():
    definition = gate(min_samples_query="count", min_samples=1)
    result, _asked = evaluate(definition, {"q": [Sample({}, 1.0)]})
    assert result["verdict"] == "hold"
    assert result["samples"] == 0.0


def test_too_few_samples_passes_when_data_not_required():
    definition = gate(min_samples_query="count", min_samples=10, require_data=False)
    result, _asked = evaluate(definition, {"count": [Sample({}, 1.0)]})
    assert result["verdict"] == "pass"
    assert result["reason"] == "too few samples: 1 < 10, not required"


@pytest.mark.parametrize("kind", ["query", "unreachable", "timeout"])
def test_prometheus_errors_hold_with_the_cause_never_fail(kind):
    result, _asked = evaluate(
        gate(), {"q": FleetError("Prometheus broke: %s" % kind, {"kind": kind})}
    )
    assert result["verdict"] == "hold"
    assert result["reason"] == "Prometheus broke: %s" % kind
    assert result["error_kind"] == kind


def test_placeholders_are_replaced_in_both_queries():
    definition = gate(
        query="max_over_time(m[${stage_elapsed}]) / max_over_time(m[${window}] @ ${stage_start})",
        min_samples_query="count_over_time(m[${window}])",
        min_samples=1,
    )
    values = g.placeholder_values(at(0), at(3600), "5m")
    answers = {
        "count_over_time(m[5m])": [Sample({}, 3.0)],
        "max_over_time(m[3600s]) / max_over_time(m[5m] @ %d)" % int(T0.timestamp()): [
            Sample({}, 1.0)
        ],
    }
    result, prometheus = evaluate(definition, answers, values)
    assert result["verdict"] == "pass"
    assert len(prometheus.asked) == 2


def test_stage_placeholders_without_a_hold_start_fail_before_any_query():
    (parsed,) = g.validate_gates([gate(query="m @ ${stage_start}")])
    prometheus = FakePrometheus({})
    with pytest.raises(FleetError) as caught:
        g.evaluate_gates([parsed], prometheus, g.placeholder_values(None, at(0), "5m"))
    assert "${stage_start}" in caught.value.message
    assert prometheus.asked == []


def test_stage_nodes_become_one_literal_regex_for_a_promql_string():
    # Sorted, each once; a dot matches only a dot: escaped for RE2, the escape doubled for
    # the double-quoted PromQL string it goes into.
    pattern = g.stage_nodes_pattern(["gpu-2", "gpu-1.rack-a", "gpu-2"])
    assert pattern == "gpu-1\\\\.rack-a|gpu-2"


def test_every_regex_metacharacter_in_a_node_name_is_escaped():
    pattern = g.stage_nodes_pattern(["a.b+c*d?e(f)g[h]i{j}k|l^m$n"])
    assert pattern == "a" + "".join(
        "\\\\" + char + letter for char, letter in zip(".+*?()[]{}|^$", "bcdefghijklmn")
    )


def test_without_stage_nodes_every_node_is_the_stage():
    assert g.stage_nodes_pattern(None) == ".*"
    assert g.placeholder_values(None, at(0), "5m")["stage_nodes"] == ".*"


@pytest.mark.parametrize(
    ("nodes", "field"),
    [
        ([], "stage_nodes"),
        ("gpu-1", "stage_nodes"),
        ({"gpu-1": 1}, "stage_nodes"),
        ([""], "stage_nodes[0]"),
        (["gpu-1", 7], "stage_nodes[1]"),
        (["gpu-1", None], "stage_nodes[1]"),
        (['gpu"1'], "stage_nodes[0]"),
        (["gpu\\1"], "stage_nodes[0]"),
        (["gpu\n1"], "stage_nodes[0]"),
    ],
)
def test_bad_stage_nodes_are_refused_naming_the_field(nodes, field):
    with pytest.raises(FleetError) as caught:
        g.stage_nodes_pattern(nodes)
    assert caught.value.details["field"] == field
    assert field in caught.value.message


def test_stage_nodes_placeholder_selects_the_stage_and_the_other_nodes():
    definition = gate(
        query='max(m{node=~"${stage_nodes}"}) / max(m{node!~"${stage_nodes}"})',
        min_samples_query='count(m{node=~"${stage_nodes}"})',
        min_samples=1,
    )
    values = g.placeholder_values(at(0), at(60), "5m", ["n1.a", "n2"])
    answers = {
        'count(m{node=~"n1\\\\.a|n2"})': [Sample({}, 2.0)],
        'max(m{node=~"n1\\\\.a|n2"}) / max(m{node!~"n1\\\\.a|n2"})': [Sample({}, 1.0)],
    }
    result, prometheus = evaluate(definition, answers, values)
    assert result["verdict"] == "pass", result["reason"]
    assert len(prometheus.asked) == 2


def test_stage_nodes_is_a_known_placeholder():
    (parsed,) = g.validate_gates([gate(query='m{node=~"${stage_nodes}"}')])
    assert "${stage_nodes}" in parsed.query
    with pytest.raises(FleetError) as caught:
        g.validate_gates([gate(query='m{node=~"${stage_node}"}')])
    assert "${stage_nodes}" in caught.value.message


@pytest.mark.parametrize("window", ["5m", "90s", "1h30m", "500ms"])
def test_windows_accepted(window):
    assert g.validate_window(window) == window


@pytest.mark.parametrize("window", ["", "5 minutes", "m5", 5, None])
def test_bad_windows_refused(window):
    with pytest.raises(FleetError) as caught:
        g.validate_window(window)
    assert caught.value.details["field"] == "window"


# ---------------------------------------------------------------- all gates


def two_gates():
    return g.validate_gates([gate(name="a", query="qa"), gate(name="b", query="qb")])


def test_overall_fail_wins_over_hold():
    evaluation = g.evaluate_gates(two_gates(), FakePrometheus({"qa": [Sample({}, 9.0)]}), {})
    assert [r["verdict"] for r in evaluation["gates"]] == ["fail", "hold"]
    assert evaluation["verdict"] == "fail"
    assert evaluation["reason"].startswith("a failed: 9 is not < 5")


def test_overall_hold_when_nothing_failed():
    evaluation = g.evaluate_gates(two_gates(), FakePrometheus({"qa": [Sample({}, 1.0)]}), {})
    assert evaluation["verdict"] == "hold"
    assert evaluation["reason"] == "b holds: no data"


def test_overall_pass():
    answers = {"qa": [Sample({}, 1.0)], "qb": [Sample({}, 2.0)]}
    evaluation = g.evaluate_gates(two_gates(), FakePrometheus(answers), {})
    assert evaluation["verdict"] == "pass"


def test_unreachable_server_is_asked_once_and_every_gate_holds():
    down = FleetError("Prometheus at http://x is unreachable: refused", {"kind": "unreachable"})
    prometheus = FakePrometheus({"qa": down, "qb": down})
    evaluation = g.evaluate_gates(two_gates(), prometheus, {})
    assert evaluation["verdict"] == "hold"
    assert prometheus.asked == ["qa"]
    assert {r["reason"] for r in evaluation["gates"]} == {down.message}


# ---------------------------------------------------------------- Prometheus replies


def test_vector_and_special_values_are_parsed():
    payload = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"instance": "a"}, "value": [1, "0.5"]},
                {"metric": {"instance": "b"}, "value": [1, "NaN"]},
                {"metric": {"instance": "c"}, "value": [1, "+Inf"]},
            ],
        },
    }
    samples = parse_query_response(payload)
    assert samples[0].value == 0.5
    assert math.isnan(samples[1].value)
    assert samples[2].value == float("inf")
    assert samples[2].label_text() == '{instance="c"}'


def test_scalar_is_one_sample_without_labels():
    samples = parse_query_response(
        {"status": "success", "data": {"resultType": "scalar", "result": [1, "2"]}}
    )
    assert [(s.labels, s.value) for s in samples] == [({}, 2.0)]


def test_range_vector_is_refused_as_a_query_error():
    payload = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    with pytest.raises(FleetError) as caught:
        parse_query_response(payload)
    assert caught.value.details["kind"] == "query"
    assert "instant vector" in caught.value.message


@pytest.mark.parametrize(
    ("result_type", "result"),
    [
        ("vector", [["not", "a", "series"]]),
        ("vector", [{"metric": {}}]),
        ("vector", [{"metric": {}, "value": []}]),
        ("vector", None),
        ("scalar", None),
        ("scalar", [1]),
    ],
)
def test_a_reply_of_an_unexpected_shape_is_a_query_error_and_the_gate_holds(result_type, result):
    payload = {"status": "success", "data": {"resultType": result_type, "result": result}}
    with pytest.raises(FleetError) as caught:
        parse_query_response(payload)
    assert caught.value.details["kind"] == "query"
    assert "unexpected shape" in caught.value.message

    def query(_promql):
        return parse_query_response(payload)

    (parsed,) = g.validate_gates([gate()])
    result = g.evaluate_gate(parsed, query, {"window": "5m"})
    assert result["verdict"] == "hold" and result["error_kind"] == "query"


def test_a_range_reply_of_an_unexpected_shape_is_a_query_error():
    payload = {"status": "success", "data": {"resultType": "matrix", "result": [{"values": [1]}]}}
    with pytest.raises(FleetError) as caught:
        parse_range_response(payload)
    assert caught.value.details["kind"] == "query"


class FakeResponse(io.BytesIO):
    pass


def opener_returning(payload, seen):
    def opener(url, **kwargs):
        seen.append((url, kwargs))
        return FakeResponse(json.dumps(payload).encode())

    return opener


def opener_raising(error):
    def opener(url, **kwargs):
        raise error

    return opener


def test_client_posts_the_query_with_the_token_and_tls_settings():
    seen = []
    payload = {"status": "success", "data": {"resultType": "vector", "result": []}}
    client = PrometheusClient(
        "https://prom:9090/",
        timeout=3,
        bearer_token="s3cret",  # noqa: S106 - a made-up token
        validate_certs=False,
        ca_path="/ca.pem",
        opener=opener_returning(payload, seen),
    )
    assert client.query("up == 1") == []
    url, kwargs = seen[0]
    assert url == "https://prom:9090/api/v1/query"
    assert kwargs["method"] == "POST"
    assert kwargs["data"] == "query=up+%3D%3D+1"
    assert kwargs["headers"]["Authorization"] == "Bearer s3cret"
    assert (kwargs["timeout"], kwargs["validate_certs"], kwargs["ca_path"]) == (3, False, "/ca.pem")


def test_prometheus_error_reply_names_its_error():
    body = json.dumps({"status": "error", "errorType": "bad_data", "error": "parse error"}).encode()
    error = HTTPError("http://p/api/v1/query", 400, "Bad Request", {}, io.BytesIO(body))
    client = PrometheusClient("http://p", opener=opener_raising(error))
    with pytest.raises(FleetError) as caught:
        client.query("sum(")
    assert caught.value.details["kind"] == "query"
    assert "bad_data: parse error" in caught.value.message


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (URLError(ConnectionRefusedError(111, "Connection refused")), "unreachable"),
        (URLError(socket.timeout("timed out")), "timeout"),
        (socket.timeout("timed out"), "timeout"),
        (HTTPError("http://p", 503, "Service Unavailable", {}, io.BytesIO(b"down")), "unreachable"),
    ],
)
def test_transport_failures_are_classified(error, kind):
    client = PrometheusClient("http://p", opener=opener_raising(error))
    with pytest.raises(FleetError) as caught:
        client.query("up")
    assert caught.value.details["kind"] == kind


def test_client_refuses_a_url_without_scheme():
    with pytest.raises(FleetError) as caught:
        PrometheusClient("prometheus:9090")
    assert caught.value.details["field"] == "prometheus_url"


# ---------------------------------------------------------------- stage decision


def limits(**overrides):
    values = {
        "consecutive_failure_limit": 3,
        "failure_limit": 5,
        "max_holds": 4,
        "max_hold_extension_s": 600,
    }
    values.update(overrides)
    return g.Limits(**values)


def run_stage(verdicts, hold_s=3600, step=60, lim=None, start=0):
    """Feed verdicts one per `step` seconds from the hold start; returns every outcome."""
    history = g.new_history("r1", 0)
    outcomes = []
    for number, verdict in enumerate(verdicts, start=1):
        history, outcome = g.record_evaluation(
            history, verdict, at(start + number * step), hold_s, at(0), lim or limits()
        )
        outcomes.append(outcome)
    return history, outcomes


def test_passing_before_the_hold_ends_continues_then_completes():
    _history, outcomes = run_stage(["pass"] * 3, hold_s=120, step=60)
    assert [o["decision"] for o in outcomes] == ["continue", "complete", "complete"]
    assert outcomes[0]["hold_remaining_s"] == 60
    assert outcomes[1]["hold_remaining_s"] == 0


def test_hold_time_over_but_last_evaluation_failed_does_not_complete():
    _history, outcomes = run_stage(["pass", "fail"], hold_s=60)
    assert outcomes[-1]["decision"] == "continue"


def test_consecutive_failures_roll_back_at_the_limit():
    _history, outcomes = run_stage(["fail", "fail", "fail"])
    assert [o["decision"] for o in outcomes] == ["continue", "continue", "rollback"]
    assert outcomes[-1]["consecutive_failures"] == 3
    assert "consecutive_failure_limit 3" in outcomes[-1]["decision_reason"]


def test_a_pass_resets_the_streak_but_a_hold_does_not():
    _history, outcomes = run_stage(
        ["fail", "fail", "pass", "fail", "hold", "fail"], lim=limits(failure_limit=9)
    )
    assert [o["consecutive_failures"] for o in outcomes] == [1, 2, 0, 1, 1, 2]
    assert outcomes[-1]["decision"] == "continue"
    _history, outcomes = run_stage(["fail", "fail", "hold", "fail"], lim=limits(failure_limit=9))
    assert outcomes[-1]["decision"] == "rollback"


def test_cumulative_failures_roll_back_at_the_failure_limit():
    verdicts = ["fail", "pass", "fail", "pass", "fail"]
    _history, outcomes = run_stage(verdicts, lim=limits(failure_limit=3))
    assert [o["decision"] for o in outcomes] == ["continue"] * 4 + ["rollback"]
    assert "failure_limit 3" in outcomes[-1]["decision_reason"]


def test_holds_extend_the_stage_by_the_time_spent_holding():
    _history, outcomes = run_stage(["pass", "hold", "hold", "pass"], hold_s=180, step=60)
    assert outcomes[2]["hold_extension_s"] == 120
    assert outcomes[2]["hold_ends_at"] == clock.format_timestamp(at(300))
    # At 240 s the plain hold (180 s) is over, but two minutes of it were inconclusive.
    assert outcomes[3]["decision"] == "continue"
    assert outcomes[3]["hold_remaining_s"] == 60


def test_more_holds_than_max_holds_pause_for_a_person():
    _history, outcomes = run_stage(["hold"] * 5, step=10, lim=limits(max_holds=4))
    assert [o["decision"] for o in outcomes] == ["continue"] * 4 + ["pause"]
    assert "a person must decide" in outcomes[-1]["decision_reason"]


def test_hold_extension_beyond_the_limit_pauses_never_fails():
    _history, outcomes = run_stage(
        ["hold"] * 4, step=200, lim=limits(max_holds=99, max_hold_extension_s=500)
    )
    assert [o["decision"] for o in outcomes] == ["continue", "continue", "pause", "pause"]
    assert all(o["verdict"] == "hold" for o in outcomes)
    assert outcomes[-1]["hold_extension_s"] == 500


def test_rollback_latches_for_the_rest_of_the_stage():
    history, outcomes = run_stage(["fail"] * 3 + ["pass"], hold_s=0)
    assert outcomes[-1]["decision"] == "rollback"
    assert "rollback decided at" in outcomes[-1]["decision_reason"]
    assert history["latched"]["decision"] == "rollback"


def test_pause_latches_until_the_history_is_reset():
    _history, outcomes = run_stage(["hold", "hold", "pass"], hold_s=0, lim=limits(max_holds=1))
    assert [o["decision"] for o in outcomes] == ["continue", "pause", "pause"]
    fresh = g.new_history("r1", 0)
    _history, outcome = g.record_evaluation(fresh, "pass", at(1000), 0, at(0), limits(max_holds=1))
    assert outcome["decision"] == "complete"


def test_recording_does_not_change_the_history_given():
    history = g.new_history("r1", 0)
    before = json.dumps(history, sort_keys=True)
    g.record_evaluation(history, "fail", at(1), 60, at(0), limits())
    assert json.dumps(history, sort_keys=True) == before


def test_without_a_hold_start_the_first_evaluation_starts_the_hold():
    history, outcome = g.record_evaluation(
        g.new_history(None, 0), "pass", at(50), 100, None, limits()
    )
    assert outcome["hold_started_at"] == clock.format_timestamp(at(50))
    assert outcome["hold_remaining_s"] == 100
    _history, outcome = g.record_evaluation(history, "pass", at(150), 100, None, limits())
    assert outcome["decision"] == "complete"


def test_history_of_another_stage_or_rollout_starts_afresh():
    history, _outcomes = run_stage(["fail"])
    same, replaced = g.history_for_stage(history, "r1", 0)
    assert (same["failures"], replaced) == (1, False)
    other_stage, replaced = g.history_for_stage(history, "r1", 1)
    assert (other_stage["failures"], replaced) == (0, True)
    other_rollout, replaced = g.history_for_stage(history, "r2", 0)
    assert (other_rollout["failures"], replaced) == (0, True)
    _history, replaced = g.history_for_stage(None, "r1", 0)
    assert replaced is False


def test_a_persons_decision_after_the_history_began_starts_it_afresh():
    """The record's latest resume or promote (decided_at) is part of the history's identity:
    the same decision keeps it, a later one gives the stage a fresh budget and no latch."""
    history, outcomes = run_stage(["hold", "hold"], hold_s=0, lim=limits(max_holds=1))
    assert outcomes[-1]["decision"] == "pause" and history["decided_at"] is None
    kept, replaced = g.history_for_stage(history, "r1", 0, decided_at=None)
    assert (kept["latched"]["decision"], replaced) == ("pause", False)
    resumed_at = clock.format_timestamp(at(900))
    fresh, replaced = g.history_for_stage(history, "r1", 0, decided_at=resumed_at)
    assert (fresh["latched"], fresh["holds"], fresh["decided_at"], replaced) == (
        None,
        0,
        resumed_at,
        True,
    )
    again, replaced = g.history_for_stage(fresh, "r1", 0, decided_at=resumed_at)
    assert (again["decided_at"], replaced) == (resumed_at, False)


def test_a_history_written_before_decided_at_was_kept_is_reused_without_a_decision():
    history, _outcomes = run_stage(["fail"])
    del history["decided_at"]
    kept, replaced = g.history_for_stage(history, "r1", 0)
    assert (kept["failures"], replaced) == (1, False)


def test_history_survives_a_json_round_trip():
    history, _outcomes = run_stage(["hold", "fail"])
    restored = json.loads(json.dumps(history))
    _history, outcome = g.record_evaluation(restored, "fail", at(500), 3600, at(0), limits())
    assert (outcome["failures"], outcome["consecutive_failures"], outcome["holds"]) == (2, 2, 1)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("consecutive_failure_limit", 0),
        ("failure_limit", -1),
        ("max_holds", -1),
        ("max_hold_extension_s", 1.5),
        ("failure_limit", True),
    ],
)
def test_bad_limits_are_refused(field, value):
    with pytest.raises(FleetError) as caught:
        limits(**{field: value})
    assert caught.value.details["field"] == field.removesuffix("_s")


@pytest.mark.parametrize(
    "value",
    [
        "2025-03-01T12:00:00Z",
        "2025-03-01T12:00:00+00:00",
        "2025-03-01T13:00:00+01:00",
        "2025-03-01T12:00:00",
        T0.timestamp(),
        str(int(T0.timestamp())),
    ],
)
def test_timestamps_in_every_accepted_form(value):
    assert clock.parse_timestamp(value, "hold_started_at") == T0


@pytest.mark.parametrize("value", ["yesterday", "", True, float("nan"), [1]])
def test_bad_timestamps_name_the_field(value):
    with pytest.raises(FleetError) as caught:
        clock.parse_timestamp(value, "hold_started_at")
    assert caught.value.details["field"] == "hold_started_at"
    assert "ISO 8601" in caught.value.message


# ---------------------------------------------------------------- watched time


def test_a_stretch_nobody_watched_does_not_count_as_hold():
    """A runner dead for 9 h does not finish an 8 h stage on one passing window."""
    history = g.new_history("chat:wave", 2)
    history, outcome = g.record_evaluation(
        history, "pass", at(60), 8 * 3600, at(0), limits(), watch_interval_s=60
    )
    assert outcome["decision"] == "continue" and outcome["unwatched_s"] == 0
    history, outcome = g.record_evaluation(
        history, "pass", at(60 + 9 * 3600), 8 * 3600, at(0), limits(), watch_interval_s=60
    )
    assert outcome["decision"] == "continue", outcome
    # The gap beyond two intervals (120 s) is left out of the hold.
    assert outcome["unwatched_s"] == 9 * 3600 - 120
    assert outcome["hold_remaining_s"] == pytest.approx(8 * 3600 - 180, abs=1)


def test_evaluations_a_little_slower_than_two_intervals_still_end_the_hold():
    """A loaded controller: every evaluation 5 s after the previous one, with a 2 s interval.
    Only 1 s of each gap is left out, so a 20 s hold ends after 25 s, not never."""
    history = g.new_history("chat:wave", 0)
    seconds = 0
    outcome = {"decision": "continue"}
    while outcome["decision"] == "continue" and seconds < 120:
        seconds += 5
        history, outcome = g.record_evaluation(
            history, "pass", at(seconds), 20, at(0), limits(), watch_interval_s=2
        )
    assert outcome["decision"] == "complete", outcome
    assert seconds == 25 and outcome["unwatched_s"] == 5


def test_gaps_up_to_two_intervals_still_count():
    history = g.new_history("chat:wave", 0)
    for seconds in (60, 180, 300):  # 120 s apart: two intervals, still watched
        history, outcome = g.record_evaluation(
            history, "pass", at(seconds), 300, at(0), limits(), watch_interval_s=60
        )
    assert outcome["unwatched_s"] == 0 and outcome["decision"] == "complete"


def test_without_an_interval_every_gap_counts_as_before():
    history = g.new_history("chat:wave", 0)
    _history, outcome = g.record_evaluation(history, "pass", at(9 * 3600), 3600, at(0), limits())
    assert outcome["decision"] == "complete" and outcome["unwatched_s"] == 0


def resumed_elsewhere(skew_s, hold_s=600, interval=60):
    """A stage held on controller A for 5 minutes, then evaluated every interval by controller
    B, whose clock is skew_s ahead of A's (behind when negative); (seconds of real time B
    watched when the hold completed, B's outcomes)."""
    history = g.new_history("chat:wave", 1)
    for seconds in range(interval, 301, interval):
        history, outcome = g.record_evaluation(
            history, "pass", at(seconds), hold_s, at(0), limits(), watch_interval_s=interval
        )
    real = 300
    outcomes = []
    while real < 3 * hold_s:
        real += interval
        history, outcome = g.record_evaluation(
            history, "pass", at(real + skew_s), hold_s, at(0), limits(), watch_interval_s=interval
        )
        outcomes.append(outcome)
        if outcome["decision"] == "complete":
            return real, outcomes
    return None, outcomes


@pytest.mark.parametrize("skew_s", [0, 3600, -3600, 90, -90])
def test_a_hold_resumed_on_a_controller_with_another_clock_lasts_its_time(skew_s):
    """The hold is the time watched, summed gap by gap: a clock an hour ahead ends it no
    sooner than two intervals early, a clock an hour behind does not hold it an hour more."""
    completed_at, outcomes = resumed_elsewhere(skew_s)
    assert completed_at is not None, outcomes[-1]
    assert 600 - 2 * 60 <= completed_at <= 600 + 60, (completed_at, outcomes[-1])
    assert all(0 <= o["hold_remaining_s"] <= 600 for o in outcomes)


def test_a_history_kept_before_watched_time_goes_on_from_what_it_counted():
    history = g.new_history("chat:wave", 0)
    history, _outcome = g.record_evaluation(
        history, "pass", at(60), 600, at(0), limits(), watch_interval_s=60
    )
    history, _outcome = g.record_evaluation(
        history, "pass", at(120), 600, at(0), limits(), watch_interval_s=60
    )
    del history["watched_s"]  # as a runner of the version before kept it
    _history, outcome = g.record_evaluation(
        history, "pass", at(180), 600, at(0), limits(), watch_interval_s=60
    )
    # first..last evaluation (60 s) plus this gap (60 s); the first gap is not known any more.
    assert outcome["elapsed_s"] == 120 and outcome["hold_remaining_s"] == 480


# ------------------------------------------------ how many evaluations a hold's loop may take


def test_a_holds_loop_allows_its_own_evaluations_the_extensions_the_failures_and_ten_more():
    # 30 min at one a minute, 60 inconclusive ones counted twice, 5 failures, 10 to spare.
    assert g.most_evaluations(1800, 60, 60, 5) == 30 + 120 + 5 + 10
    # A hold shorter than one interval still has its limits and the spare.
    assert g.most_evaluations(0, 60, 0, 1) == 11


@pytest.mark.parametrize(
    ("args", "field"),
    [((1800, 0, 60, 5), "interval"), ((-1, 60, 60, 5), "hold"), ((1800, 60, "60", 5), "max_holds"),
     ((1800, 60, 60, True), "failure_limit")],
)  # fmt: skip
def test_a_bad_bound_names_its_field(args, field):
    with pytest.raises(FleetError) as caught:
        g.most_evaluations(*args)
    assert caught.value.details["field"] == field


def test_the_filter_takes_the_settings_as_the_inventory_gives_them():
    assert gate_evaluations("1800", "60", "60", "5") == 165
    with pytest.raises(AnsibleFilterError, match="gate_evaluations: interval must be"):
        gate_evaluations(1800, "1m", 60, 5)
    with pytest.raises(AnsibleFilterError, match="interval must be a whole number >= 1"):
        gate_evaluations(1800, 0, 60, 5)
