#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: drill_report
short_description: Judge a rollback drill and write its JSON, JUnit XML and PNG report
description:
  - Reads what a rollback drill left behind (the load client's summary, the canary record,
    the fast and the deep rollback reports) and the drill's own event times, asks Prometheus
    for the router's counters over each stage, and decides whether the drill passed.
  - 'Checks: no request lost, streaming requests completed, the split measured by the client
    and by the router inside the binomial range of each stage''s weight, the fast
    rollback''s wall time from trigger until every node confirmed weight 0 and the client
    saw no new direct-path connection, the deep rollback''s wall time, every node confirmed
    in both.'
  - 'A canary record whose schedule has a cohort stage (weight 0, its source CIDRs on the
    direct path; the drill names its own load client''s address) is judged against 100 % there
    instead of the weight: C(cohort_stage_direct_client) (every request the client made
    during the stage''s hold went direct) and C(cohort_stage_direct_router) (the router''s
    share of new connections within the split floor of 100 %) take the place of that stage''s
    C(split_client_stage_N) and C(split_router_stage_N); C(cohort_stage_confirmed) needs the
    record''s split of the stage to show every node ok, measured as a cohort stage, with
    cohort connections handed to an engine (opt_in above 0) and none sent direct by the weight
    (to_engine 0). A record without a cohort stage gets none of these.'
  - Writes C(report.json), C(report.junit.xml) (one test case per check) and C(report.png) (weight
    written, split seen by the client and by the router, error rate, rollback moments) under
    O(output_dir). The module does not fail when a check fails; the playbook decides with
    RV(passed).
  - Used by C(playbooks/drill.yml).
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  drill_id:
    description: Name of the drill, used in the report and as the JUnit class name.
    type: str
    required: true
  output_dir:
    description: Directory the report files are written to (created if missing).
    type: path
    required: true
  started_at:
    description: Unix time the drill started.
    type: float
    required: true
  finished_at:
    description: Unix time the drill finished.
    type: float
    required: true
  load_summary:
    description: The load client's summary (JSON).
    type: path
    required: true
  pooled_load_summary:
    description:
      - The summary of a second load client that keeps its keep-alive connections
        (C(files/load/zerolayer_load.py --connection-mode pooled)). Its failed requests count
        against O(max_failed_requests), and its last direct-path answer must come within
        O(pooled_direct_budget_s) of the fast rollback's trigger.
      - Omitted, the drill has no such client and neither check runs.
    type: path
  pooled_direct_budget_s:
    description: Seconds from the fast rollback's trigger within which the pooled client's last
      direct-path answer must come.
    type: float
    default: 2
  canary_records:
    description: Controller rollout records of the drill's canary (one per wave).
    type: list
    elements: path
    default: []
  rollback_reports:
    description: Rollback reports written by C(playbooks/rollback.yml), by mode.
    type: dict
    default: {}
    suboptions:
      fast:
        description: Report of the fast rollback.
        type: path
      deep:
        description: Report of the deep rollback.
        type: path
  events:
    description: The drill's moments as Unix times, by name (C(fast_rollback_started),
      C(deep_rollback_started), C(restored), ...); each is marked on the plot.
    type: dict
    required: true
  stage_weight:
    description: Weight of the stage the canary was to reach and hold (percent).
    type: float
    required: true
  max_failed_requests:
    description: Failed requests allowed. A drill allows none.
    type: int
    default: 0
  fast_budget_s:
    description: Budget of the fast rollback in seconds.
    type: float
    default: 30
  deep_budget_s:
    description: Budget of the deep rollback in seconds.
    type: float
    default: 300
  split_sigmas:
    description:
      - How far a stage's measured split may be off its weight, in normal standard deviations.
      - The range itself is binomial (see the C(zerolayer.fleet.split_verdict) filter).
    type: float
    default: 4
  split_floor_pct:
    description: The least half-width of the agreeing range, in percentage points.
    type: float
    default: 2
  prometheus_url:
    description: Prometheus holding the router's counters; empty leaves the router's split
      out of the report (and out of the checks).
    type: str
    default: ''
  prometheus_timeout:
    description: Seconds to wait for each Prometheus query.
    type: int
    default: 10
  router_selector:
    description: Label matchers selecting the router's series, without braces.
    type: str
    default: job="zerolayer-router"
  plot:
    description: Write the PNG plot (needs matplotlib on the controller).
    type: bool
    default: true
attributes:
  check_mode:
    description: Can run in check_mode and return changed status prediction without modifying
      target.
    support: full
    details: The report is worked out and returned; no file is written.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode),
      when in diff mode.
    support: none
seealso:
  - module: zerolayer.fleet.rollout_state
"""

EXAMPLES = r"""
- name: Judge the drill and write its report
  zerolayer.fleet.drill_report:
    drill_id: drill-20261130T120000Z
    output_dir: /var/tmp/zerolayer-drill
    started_at: "{{ drill_started_at }}"
    finished_at: "{{ now().timestamp() }}"
    load_summary: /var/tmp/zerolayer-drill/load.json
    canary_records:
      - ~/.local/state/zerolayer/rollouts/drill-20261130T120000Z/gpu_nodes.json
    rollback_reports:
      fast: /var/tmp/zerolayer-drill/fast-rollback.json
      deep: /var/tmp/zerolayer-drill/deep-rollback.json
    events:
      fast_rollback_started: 1796040000.2
      deep_rollback_started: 1796040030.9
    stage_weight: 20
    prometheus_url: http://prometheus.example:9090
  register: drill
"""

RETURN = r"""
passed:
  description: Whether every check passed.
  returned: always
  type: bool
report:
  description: The report written to C(report.json) - checks, requests, stages, stage_rows (the
    rows of RV(table)), rollbacks, events.
  returned: always
  type: dict
table:
  description:
    - One line per wave and stage of the canary, a header first, as the progress callback
      prints it at the end of the run, with the weight, the split the client saw with its
      agreeing range, the gate verdicts, the time in the stage and how it ended.
    - Its rows are C(stage_rows) in RV(report).
  returned: always
  type: str
  sample: |-
    WAVE       STAGE  WEIGHT  SPLIT   RANGE         VERDICTS           TIME  END
    gpu_nodes  1/4        1%  1.00%   0.00-3.00%    pass 4 -> complete 60s   completed
failed_checks:
  description: Names of the checks that failed, with what was measured and expected.
  returned: always
  type: list
  elements: str
files:
  description: Paths of the files written (none in check mode).
  returned: always
  type: dict
  sample:
    json: /var/tmp/zerolayer-drill/report.json
    junit: /var/tmp/zerolayer-drill/report.junit.xml
    png: /var/tmp/zerolayer-drill/report.png
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports.drill import run


def main():
    module = AnsibleModule(
        argument_spec=dict(
            drill_id=dict(type="str", required=True),
            output_dir=dict(type="path", required=True),
            started_at=dict(type="float", required=True),
            finished_at=dict(type="float", required=True),
            load_summary=dict(type="path", required=True),
            pooled_load_summary=dict(type="path"),
            pooled_direct_budget_s=dict(type="float", default=2),
            canary_records=dict(type="list", elements="path", default=[]),
            rollback_reports=dict(
                type="dict",
                default={},
                options=dict(fast=dict(type="path"), deep=dict(type="path")),
            ),
            events=dict(type="dict", required=True),
            stage_weight=dict(type="float", required=True),
            max_failed_requests=dict(type="int", default=0),
            fast_budget_s=dict(type="float", default=30),
            deep_budget_s=dict(type="float", default=300),
            split_sigmas=dict(type="float", default=4),
            split_floor_pct=dict(type="float", default=2),
            prometheus_url=dict(type="str", default=""),
            prometheus_timeout=dict(type="int", default=10),
            router_selector=dict(type="str", default='job="zerolayer-router"'),
            plot=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    try:
        result = run(module.params, module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
