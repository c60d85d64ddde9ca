"""The pre-release rollback drill (playbooks/drill.yml) on the sandbox fleet: the release gate,
run through ansible-runner as an automation platform runs it.

It shares the session's fleet (conftest.py) and runs after test_canary_playbooks.py, which
leaves the router restored at weight 0. The report goes to $ZEROLAYER_DRILL_REPORT_DIR when
set (CI keeps it), else to the test's temporary directory.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from fleet_groups import SECOND_FLEET

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SECOND_FLEET)]

REPO = Path(__file__).resolve().parents[2]
DRILL_VARS = Path(__file__).resolve().parent / "drill_vars.yml"

# Checks of the drill report judged by wall time: their budgets stay in the report (and
# decide a real release drill), but this shared machine's speed is no outcome of the code.
TIMED_CHECKS = ("fast_rollback_time", "deep_rollback_time", "pooled_clients_leave_the_direct_path")


def stop_load_client(drill_dir, timeout=120):
    """The drill's load client ends at its stop file: a drill that stopped half-way leaves it
    running. Touch the file and wait for the client's final summary (it writes "finished")
    rather than signal anything: the client runs detached, as an Ansible async job."""
    summary = drill_dir / "load.json"
    if not summary.exists():
        return None  # the drill stopped before it started the client
    (drill_dir / "load.stop").touch()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            document = json.loads(summary.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            document = {}
        if document.get("finished"):
            return document
        time.sleep(0.5)
    raise AssertionError(
        "the drill's load client did not finish within %d s of its stop file" % timeout
    )


def test_drill_loses_no_request_and_reports_both_rollbacks(fleet, tmp_path):
    report_root = Path(os.environ.get("ZEROLAYER_DRILL_REPORT_DIR") or tmp_path / "drills")
    drill_id = "drill-%d" % os.getpid()
    drill_dir = report_root / drill_id
    private = tmp_path / "runner"
    extra = [
        "-e @%s" % DRILL_VARS,
        "-e canary_prometheus_url=%s" % fleet.prometheus_url,
        "-e drill_report_dir=%s" % report_root,
        "-e drill_id=%s" % drill_id,
    ]
    # Through ansible-runner, as AWX or an automation platform would run it.
    try:
        run = subprocess.run(
            [
                "ansible-runner",
                "run",
                str(private),
                "--project-dir",
                str(REPO),
                "--playbook",
                "playbooks/drill.yml",
                "--inventory",
                fleet.inventory_path,
                "--ident",
                "drill",
                "--cmdline",
                " ".join(extra),
                "--quiet",
            ],
            env=fleet.env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=1200,
            check=False,
        )
    finally:
        stop_load_client(drill_dir)
    artifacts = private / "artifacts" / "drill"
    output = (artifacts / "stdout").read_text() if (artifacts / "stdout").exists() else run.stderr
    assert run.returncode == 0, output[-8000:]
    assert (artifacts / "status").read_text().strip() == "successful"

    report = json.loads((drill_dir / "report.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    assert set(TIMED_CHECKS) <= set(checks), "the report judges no rollback against its budget"
    failed = [c for c in report["checks"] if not c["passed"] and c["name"] not in TIMED_CHECKS]
    assert not failed, failed
    assert report["requests"]["failed"] == 0, report["requests"]["failures_by_cause"]
    assert report["requests"]["ok"] > 1000
    assert report["requests"]["streams_completed"] > 0
    # The cohort stage first (weight 0, the load client itself the cohort), then 1, 5, 20 %.
    assert [stage["weight"] for stage in report["stages"]] == [0, 1, 5, 20]
    for name in (
        "cohort_stage_confirmed",
        "cohort_stage_direct_client",
        "cohort_stage_direct_router",
    ):
        assert checks[name]["passed"], checks[name]
    assert report["stages"][0]["client_direct_pct"] == 100.0, report["stages"][0]
    for stage in (2, 3, 4):
        assert checks["split_client_stage_%d" % stage]["passed"]
        assert checks["split_router_stage_%d" % stage]["passed"]
    fast, deep = report["rollbacks"]["fast"], report["rollbacks"]["deep"]
    assert fast["nodes_confirmed"] == deep["nodes_confirmed"] == len(fleet.nodes)
    # The keep-alive client beside it: it lost nothing, rode the direct path during the
    # canary, and left it after the fast rollback (without the engines' direct drain it stayed
    # there to the drill's end: neither weight 0 nor a detach moves a connection).
    pooled = report["clients"]["pooled"]
    assert pooled["connection_mode"] == "pooled" and pooled["requests_failed"] == 0, pooled
    assert pooled["requests_ok"] > 500 and pooled["last_direct_answer_unix"] is not None, pooled
    assert pooled["last_direct_answer_unix"] < deep["triggered_at"], (pooled, deep)
    # In the drill's order: every node confirmed weight 0 before the deep rollback began.
    assert fast["confirmed_at"] <= deep["triggered_at"], (fast, deep)
    stages = report["stages"]
    print(
        "drill %s: %d requests, 0 failed, %d streams; fast rollback %.2f s (%s), deep %.2f s "
        "(%s); pooled client: %d requests, last direct answer %.2f s after the fast trigger "
        "(%s); split client/router per stage %s"
        % (
            drill_id,
            report["requests"]["ok"],
            report["requests"]["streams_completed"],
            fast["wall_time_s"],
            checks["fast_rollback_time"]["expected"],
            deep["wall_time_s"],
            checks["deep_rollback_time"]["expected"],
            pooled["requests_ok"],
            pooled["last_direct_answer_after_fast_trigger_s"],
            checks["pooled_clients_leave_the_direct_path"]["expected"],
            [(s["weight"], s["client_direct_pct"], s["router_engine_pct"]) for s in stages],
        )
    )

    suite = ET.parse(drill_dir / "report.junit.xml").getroot()  # noqa: S314 - the drill's own file
    over_budget = [name for name in TIMED_CHECKS if not checks[name]["passed"]]
    assert suite.get("failures") == str(len(over_budget)), over_budget
    assert int(suite.get("tests")) == len(report["checks"])
    assert (drill_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The drill leaves the fleet as it found it: router attached, weight 0, record closed.
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 0, node
        assert fleet.show(node)["router"]["attached"], node
    record = json.loads((drill_dir / "rollouts" / drill_id / "gpu_nodes.json").read_text())
    assert record["outcome"] == "rolled_back"
    # The cohort was the controller's own address toward the nodes, and every node confirmed
    # it by the router's opt-in counter: the cohort's connections on the engine, none by the
    # weight. Nothing of it is left on the routes after the rollbacks and the restore.
    cohort = record["schedule"][0]["cohort"]
    assert cohort and all(cidr.endswith(("/32", "/128")) for cidr in cohort), cohort
    assert [stage["cohort"] for stage in record["schedule"][1:]] == [[]] * 4
    cohort_splits = record["splits"]["0"]
    assert sorted(cohort_splits) == fleet.nodes
    for node, split in cohort_splits.items():
        assert split["ok"] and split["cohort"], (node, split)
        assert split["opt_in"] >= 100 and split["to_engine"] == 0, (node, split)
    for node in fleet.nodes:
        for route in fleet.show(node)["routes"]:
            assert route["always_direct"] == [] and not route["opt_in"], (node, route)
