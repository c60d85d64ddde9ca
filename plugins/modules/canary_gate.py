#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: canary_gate
short_description: Evaluate canary gates once against Prometheus and decide the rollout's next step
description:
  - "Runs every gate in O(gates) once as an instant query against Prometheus' HTTP API
    (C(/api/v1/query)) and compares each series with the gate's threshold. Run it on the
    controller (C(delegate_to: localhost), C(run_once: true))."
  - "The evaluation's RV(verdict) is one of three: V(pass) (every gate passed), V(fail) (a gate
    measured a value on the wrong side of its threshold), V(hold) (nothing failed but some gate
    could not tell: no data, too few samples, NaN, or Prometheus errored, timed out or was
    unreachable). Missing telemetry is never a failure."
  - A gate with O(gates[].require_data=false) passes when it has no data or too few samples,
    marked C(not required) in its reason.
  - A query returning several series passes only when every series passes; the result names the
    worst one.
  - The stage's evaluation history is kept in O(state_file) (JSON, replaced atomically). It holds
    the counts the limits read; it starts afresh when O(rollout_id) or O(stage) differ from the
    stored ones, when the rollout's record names a resume or promote made after it began, or
    with O(reset_history=true).
  - "The RV(decision) says what the rollout does now: V(continue) (evaluate again later),
    V(complete) (the hold, extended by the time spent in V(hold), is over and this evaluation
    passed), V(rollback) (a failure limit was hit), V(pause) (evaluations stayed inconclusive
    beyond O(max_holds) or O(max_hold_extension): a person must decide). V(rollback) and
    V(pause) stay the decision of the stage until its history starts afresh (a person's resume
    or promote)."
  - "Queries may use placeholders: C(${window}) (O(window)), C(${stage_start}) (Unix seconds of
    the hold start, for the C(@) modifier), C(${stage_elapsed}) (seconds since the hold start,
    as a range such as C(3600s)) and C(${stage_nodes}) (O(stage_nodes) as a regular expression
    for a label matcher such as C(node=~\"${stage_nodes}\"), every node without it)."
  - Invalid input fails naming the field and the allowed values, before any query or write.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  prometheus_url:
    description: Base URL of the Prometheus server, for example V(http://127.0.0.1:9090).
    type: str
    required: true
  timeout:
    description:
      - Seconds to wait for each query. A timeout makes the evaluation V(hold), never V(fail).
    type: int
    default: 10
  bearer_token:
    description: Token sent in the C(Authorization) header as C(Bearer <token>).
    type: str
  validate_certs:
    description: Whether to verify the server's TLS certificate.
    type: bool
    default: true
  ca_path:
    description: PEM file of the certificate authorities to trust for HTTPS.
    type: path
  gates:
    description: The gates to evaluate; names must be unique.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Gate name, 1-64 characters of letters, digits, C(.), C(_) or C(-).
        type: str
        required: true
      query:
        description: PromQL expression returning an instant vector or a scalar.
        type: str
        required: true
      comparison:
        description: How the value must compare with O(gates[].threshold) to pass.
        type: str
        required: true
        choices: ['<', '<=', '>', '>=']
      threshold:
        description: The number each series is compared with.
        type: raw
        required: true
      min_samples_query:
        description:
          - PromQL expression counting the samples behind the gate. The smallest value among its
            series must reach O(gates[].min_samples), else the gate holds (low traffic at a small
            weight holds instead of failing).
          - Goes together with O(gates[].min_samples).
        type: str
      min_samples:
        description: Smallest sample count that lets the gate decide.
        type: raw
      require_data:
        description: When false, no data (or too few samples, or NaN) passes instead of holding.
        type: bool
        default: true
      description:
        description: Free text for people.
        type: str
  window:
    description: Value of the C(${window}) placeholder, a PromQL duration such as V(5m) or V(1h30m).
    type: str
    default: 5m
  state_file:
    description: JSON file with the stage's evaluation history. Created when missing.
    type: path
    required: true
  rollout_id:
    description: Identifier of the rollout; the history belongs to one rollout and stage.
    type: str
  stage:
    description: Index of the stage being evaluated.
    type: int
    default: 0
  weight:
    description: The stage's weight in percent; reported back for progress displays.
    type: raw
  hold:
    description: The stage's hold time, whole seconds or a string such as V(2h), V(30m), V(90s).
    type: raw
    default: 0
  stage_nodes:
    description:
      - The nodes whose weight the stage changed (the wave's hosts), the value of
        C(${stage_nodes}). Each name is matched literally; they are joined into one regular
        expression, written for the inside of a double-quoted PromQL string, so that
        C(node=~"${stage_nodes}") selects the stage's nodes and C(node!~"${stage_nodes}") the
        others.
      - Without it C(${stage_nodes}) is V(.*), every node (and C(!~) none).
      - Names must be non-empty and printable, without a double quote or a backslash.
    type: list
    elements: str
  hold_started_at:
    description:
      - When the stage's hold began (its weight confirmed on every node), ISO 8601 (UTC when no
        offset) or Unix seconds. Defaults to the time of the stage's first evaluation.
      - Required by queries that use C(${stage_start}) or C(${stage_elapsed}).
    type: raw
    aliases: [stage_started_at]
  consecutive_failure_limit:
    description:
      - This many failed evaluations in a row decide V(rollback).
      - A V(pass) resets the count; a V(hold) does not.
    type: int
    default: 3
  failure_limit:
    description: This many failed evaluations within the stage decide V(rollback).
    type: int
    default: 5
  max_holds:
    description: More inconclusive evaluations than this within the stage decide V(pause).
    type: int
    default: 60
  max_hold_extension:
    description:
      - The most the hold may be extended by time spent in V(hold).
      - Beyond it the decision is V(pause).
      - Whole seconds or a string such as V(2h).
    type: raw
    default: 2h
  reset_history:
    description:
      - Start the stage's history afresh.
      - Not needed after a person's decision recorded in the rollout's record (O(record_key) or
        O(record_path)). A resume or promote made after the stored history began, from any shell
        or controller, starts it afresh by itself.
    type: bool
    default: false
  interval:
    description:
      - Seconds between evaluations (the playbook's gate interval). Of a gap of more than twice
        this since the previous evaluation (a runner that was dead, a controller that slept), the
        part beyond two intervals does not count towards the hold; RV(unwatched_s) says how much
        was left out.
    type: int
  record_path:
    description:
      - The rollout's record (M(zerolayer.fleet.rollout_state)), read before every evaluation. When
        it says paused (a person paused it from elsewhere) or finished, no gate is evaluated and
        RV(decision) is V(paused) or V(stopped).
    type: path
  record_key:
    description:
      - With a rollout store (O(endpoints)), the rollout's record there, V(<rollout_id>/<wave>),
        read before every evaluation instead of O(record_path).
    type: str
  epoch:
    description:
      - The fence epoch this runner took at its start. Before every evaluation the fleet's fence is
        read from the rollout store (O(endpoints)); when it rose above O(epoch) (a rollback or an
        abort since), RV(decision) is V(fenced) and no gate is evaluated.
      - When the store cannot be reached, no gate is evaluated and RV(decision) stays V(continue),
        so the hold cannot end while nobody can see the fence (RV(store_reachable) is false).
    type: int
  owner_scope:
    description:
      - The rollout scope this runner took (M(zerolayer.fleet.rollout_owner)), with O(owner_lease).
        Before every evaluation the runner's lease is checked in the rollout store; when it no
        longer holds the scope (its heartbeat could not renew the lease for its TTL, and another
        runner may have taken it), RV(decision) is V(owner_lost), no gate is evaluated, and the
        runner writes nothing more.
    type: str
  owner_lease:
    description: The lease M(zerolayer.fleet.rollout_owner) returned for O(owner_scope).
    type: int
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying
      target.
    support: full
    details: Queries Prometheus and decides, but does not write O(state_file).
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in
      check_mode), when in diff mode.
    support: full
    details: Shows the history's counters before and after.
extends_documentation_fragment:
  - zerolayer.fleet.store.optional
seealso:
  - module: zerolayer.fleet.rollout_state
"""

EXAMPLES = r"""
# canary_gates: the default gates of the role zerolayer.fleet.rollout_settings
- name: Load the settings and the default canary gates
  ansible.builtin.import_role:
    name: zerolayer.fleet.rollout_settings

- name: Evaluate the gates of the current stage
  zerolayer.fleet.canary_gate:
    prometheus_url: http://prometheus.example.internal:9090
    gates: "{{ canary_gates }}"
    state_file: /var/lib/zerolayer/canary/chat-2025-03-01.gates.json
    rollout_id: chat-2025-03-01
    stage: "{{ plan.resume.stage }}"
    weight: "{{ plan.resume.weight }}"
    hold: "{{ plan.resume.hold_s }}"
    hold_started_at: "{{ hold.record.stage.hold_started_at }}"
    stage_nodes: "{{ groups['wave_canary'] }}"
  delegate_to: localhost
  run_once: true
  register: gate

- name: Evaluate one ad hoc gate with a bearer token over HTTPS
  zerolayer.fleet.canary_gate:
    prometheus_url: https://prometheus.example.internal
    bearer_token: "{{ vault_prometheus_token }}"
    ca_path: /etc/pki/zerolayer/ca.pem
    state_file: /tmp/drill.gates.json
    hold: 10m
    consecutive_failure_limit: 2
    gates:
      - name: success_rate
        query: >-
          sum(rate(http_requests_total{status!="5xx"}[${window}]))
          / sum(rate(http_requests_total[${window}]))
        comparison: ">="
        threshold: 0.9995
        min_samples_query: sum(increase(http_requests_total[${window}]))
        min_samples: 2000
  delegate_to: localhost
"""

RETURN = r"""
event:
  description:
    - The V(gate_verdicts_changed) event this evaluation stored (with O(record_key) and a store)
      and handed to the sender of notifications, null when no gate's verdict changed.
    - V(stored) false and V(error) when the store could not take it; V(notifications) is the
      hand-off to the sender.
  returned: when O(record_key) is given with a store
  type: dict
verdict:
  description: This evaluation's outcome, V(pass), V(fail) or V(hold).
  returned: always
  type: str
  sample: hold
reason:
  description: Why, naming the gates that failed or held.
  returned: always
  type: str
  sample: "success_rate holds: too few samples: 120 < 2000"
unwatched_s:
  description: Seconds of this stage's hold that nobody watched and that therefore did not count.
  returned: after an evaluation
  type: float
store_reachable:
  description: False when the rollout store could not be read, so nothing was evaluated.
  returned: when O(endpoints) and O(epoch) are set and nothing else stopped the hold first
  type: bool
decision:
  description:
    - What the rollout does now, V(continue), V(complete), V(rollback) or V(pause); or, without
      a gate evaluation, V(paused) (someone paused the record), V(stopped) (the record is
      finished), V(fenced) (the fleet's fence rose above O(epoch)), V(moved) (another actor
      moved the record on) or V(owner_lost) (this runner no longer holds O(owner_scope)).
  returned: always
  type: str
  sample: continue
decision_reason:
  description: Why the decision was taken, naming the limit that was hit if any.
  returned: always
  type: str
  sample: "3 consecutive failed evaluations (consecutive_failure_limit 3)"
gates:
  description: One result per gate, in the order given.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Gate name.
      type: str
    verdict:
      description: V(pass), V(fail) or V(hold).
      type: str
    reason:
      description: The comparison made, or why it could not be made.
      type: str
    value:
      description:
        - The worst series' value (closest to failing, or failing most); null without data.
      type: float
    worst_series:
      description: Labels of the worst series.
      type: dict
    series:
      description: Number of series the query returned.
      type: int
    samples:
      description: The smallest count of O(gates[].min_samples_query), null without that query.
      type: float
    query:
      description: The query as sent, placeholders replaced.
      type: str
  sample:
    - name: route_decision_p99
      verdict: pass
      reason: "3.1e-06 < 5e-06"
      value: 0.0000031
      series: 1
rollout_id:
  description: The rollout the history belongs to.
  returned: always
  type: str
stage:
  description: The stage index evaluated.
  returned: always
  type: int
weight:
  description: The stage's weight in percent, as given.
  returned: always
  type: raw
evaluated_at:
  description: UTC time of this evaluation.
  returned: always
  type: str
  sample: "2025-03-01T12:34:56.789000Z"
evaluations:
  description: Evaluations of this stage so far, this one included.
  returned: always
  type: int
consecutive_failures:
  description: Failed evaluations in a row, ending with this one.
  returned: always
  type: int
failures:
  description: Failed evaluations in this stage.
  returned: always
  type: int
holds:
  description: Inconclusive evaluations in this stage.
  returned: always
  type: int
hold_s:
  description: The stage's hold time in seconds.
  returned: always
  type: int
hold_extension_s:
  description:
    - Seconds the hold was extended by inconclusive evaluations (at most O(max_hold_extension)).
  returned: always
  type: float
hold_started_at:
  description: The hold start used.
  returned: always
  type: str
hold_ends_at:
  description:
    - When the hold ends, extension included, on this controller's clock (now plus what is left
      to watch).
    - The hold counts the time watched, summed from one evaluation to the next, so a runner
      resumed on a controller whose clock differs from the first one's still holds for the hold's
      time, give or take two intervals.
  returned: always
  type: str
hold_remaining_s:
  description: Seconds until the hold ends (0 once over).
  returned: always
  type: float
elapsed_s:
  description: Seconds of the hold counted so far (watched, extension not included).
  returned: always
  type: float
history_reset:
  description:
    - True when a stored history of another rollout or stage (or O(reset_history)) was replaced.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import hold_evaluation
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_options,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            prometheus_url=dict(type="str", required=True),
            timeout=dict(type="int", default=10),
            bearer_token=dict(type="str", no_log=True),
            validate_certs=dict(type="bool", default=True),
            ca_path=dict(type="path"),
            gates=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    name=dict(type="str", required=True),
                    query=dict(type="str", required=True),
                    comparison=dict(type="str", required=True, choices=["<", "<=", ">", ">="]),
                    threshold=dict(type="raw", required=True),
                    min_samples_query=dict(type="str"),
                    min_samples=dict(type="raw"),
                    require_data=dict(type="bool", default=True),
                    description=dict(type="str"),
                ),
            ),
            window=dict(type="str", default="5m"),
            state_file=dict(type="path", required=True),
            rollout_id=dict(type="str"),
            stage=dict(type="int", default=0),
            weight=dict(type="raw"),
            hold=dict(type="raw", default=0),
            stage_nodes=dict(type="list", elements="str"),
            hold_started_at=dict(type="raw", aliases=["stage_started_at"]),
            consecutive_failure_limit=dict(type="int", default=3),
            failure_limit=dict(type="int", default=5),
            max_holds=dict(type="int", default=60),
            max_hold_extension=dict(type="raw", default="2h"),
            reset_history=dict(type="bool", default=False),
            interval=dict(type="int"),
            record_path=dict(type="path"),
            record_key=dict(type="str", no_log=False),
            epoch=dict(type="int"),
            owner_scope=dict(type="str"),
            owner_lease=dict(type="int"),
            **store_options(required=False),
        ),
        required_together=[("owner_scope", "owner_lease")],
        supports_check_mode=True,
    )
    params = dict(module.params)
    # Suboption defaults fill unset keys with None; the gate validator wants them absent.
    params["gates"] = [
        {key: value for key, value in gate.items() if value is not None} for gate in params["gates"]
    ]
    try:
        result = hold_evaluation.run(params, module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    diff = result.pop("_diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
