"""canary.yml and rollback.yml driven by ansible-playbook against the sandbox fleet.

One fleet for the session (conftest.py). Each test starts from weight 0 everywhere and a
fresh controller record directory; the deep rollback, which removes the router, runs last
here and ends with restore.yml putting it back.
Schedules are compressed to seconds (tests/playbooks/drill_vars.yml and per-test -e).
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

# One sandbox fleet at a time on a machine: every test that brings it up runs in one worker.
pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

TWO_WAVES = json.dumps(
    {
        "canary_waves": ["wave_canary", "wave_rest"],
        "canary_schedule": [
            {"weight": 1, "hold": 5},
            {"weight": 5, "hold": 5},
            {"weight": 20, "hold": 5},
            {"weight": 100, "hold": 0},
        ],
        "canary_wave_schedules": {
            "wave_rest": [{"weight": 20, "hold": 5}, {"weight": 100, "hold": 0}]
        },
    }
)


def recap(output):
    """{host: {ok, changed, failed, ...}} from the PLAY RECAP (a task-time profile after it,
    ZEROLAYER_PLAYBOOK_LOGS, has lines of the same shape without the counts)."""
    counts = {}
    for line in output.split("PLAY RECAP", 1)[-1].splitlines():
        match = re.match(r"^(\S+)\s+:\s+(ok=\d+.*)$", line.strip())
        if match:
            counts[match.group(1)] = {
                key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", match.group(2))
            }
    return counts


def record(records, rollout_id, wave):
    return json.loads((records / rollout_id / ("%s.json" % wave)).read_text())


def rollback_report(records):
    reports = sorted(records.glob("rollback-*.json"))
    assert reports, "no rollback report written under %s" % records
    return json.loads(reports[-1].read_text())


def test_bad_schedule_or_gates_change_nothing(fleet, records, baseline):
    before = fleet.weights()
    bad_schedule = fleet.canary(
        "bad-schedule",
        records,
        "-e",
        json.dumps({"canary_schedule": [{"weight": 5, "hold": 10}, {"weight": 3, "hold": 10}]}),
    )
    assert bad_schedule.returncode != 0
    assert "schedule[1].weight must be greater" in bad_schedule.stdout

    bad_gate = fleet.canary(
        "bad-gate",
        records,
        "-e",
        json.dumps(
            {
                "canary_gates": [
                    {"name": "success_rate", "query": "up", "comparison": "=~", "threshold": 1}
                ]
            }
        ),
    )
    assert bad_gate.returncode != 0
    assert "comparison" in bad_gate.stdout

    bad_action = fleet.canary("bad-action", records, "-e", "canary_action=skip")
    assert bad_action.returncode != 0
    assert "canary_action must be one of" in bad_action.stdout

    assert fleet.weights() == before, "weights or generations changed"
    assert not list(records.glob("**/*.json")), "a record was written"


def test_a_split_without_traffic_stops_the_run_before_the_hold_and_reports_why(
    fleet, records, baseline
):
    """No load and a split check that wants 40 new connections a node in 2 s: the read-back
    passes, the split does not, and the run stops the way a pause does: the split is in the record,
    no hold started, the next wave is untouched, the rollout's report names the stop, and
    the run fails with the message naming the nodes."""
    run = fleet.canary("no-split", records, "-e", TWO_WAVES, "-e", "canary_split_wait=2")
    assert run.returncode != 0
    stopped = "Measured split not confirmed at stage 1 of wave wave_canary"
    assert stopped in run.stdout, run.stdout[-4000:]
    kept = record(records, "no-split", "wave_canary")
    assert (kept["outcome"], kept["stage"]["status"]) == ("running", "started"), kept["stage"]
    splits = kept["splits"]["0"]
    assert splits and not any(split["ok"] for split in splits.values()), splits
    assert set(kept["nodes"]) == set(splits), "every node read back, then was measured"
    assert not (records / "no-split" / "wave_rest.json").exists(), "the next wave never planned"
    report = json.loads((records / "report-no-split.json").read_text())
    assert (report["stopped"]["kind"], report["stopped"]["wave"]) == ("split_off", "wave_canary")


def test_pass_path_to_full_weight_then_rerun_changes_nothing(fleet, records, baseline, load):
    client = load("pass")
    run = fleet.canary("pass", records, "-e", TWO_WAVES)
    summary = client.stop()
    assert run.returncode == 0, run.stdout[-6000:]

    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 10000, node
    assert summary["requests_failed"] == 0, summary.get("failures")
    assert summary["paths"]["direct"]["requests"] > 0
    assert summary["paths"]["proxy"]["requests"] > 0

    for wave in ("wave_canary", "wave_rest"):
        kept = record(records, "pass", wave)
        assert kept["outcome"] == "completed"
        assert [stage["how"] for stage in kept["completed_stages"]] == ["stage_completed"] * len(
            kept["schedule"]
        )
        assert kept["rollback"] is None
    for node in fleet.nodes:
        assert fleet.node_record(node)["outcome"] == "completed", node
    # The report file: a row per wave and stage, with the split each stage measured.
    report = json.loads((records / "report-pass.json").read_text())
    assert [(row["wave"], row["weight"]) for row in report["stages"]] == [
        ("wave_canary", 1), ("wave_canary", 5), ("wave_canary", 20), ("wave_canary", 100),
        ("wave_rest", 20), ("wave_rest", 100)]  # fmt: skip
    assert all(row["end"] == "completed" for row in report["stages"]), report["stages"]
    measured = [row for row in report["stages"] if row["split"]]
    assert measured and all(row["split"].get("measured_pct") for row in measured), measured
    # The progress callback printed one line per evaluation and the final report.
    assert "[zerolayer] wave wave_canary | stage 1/4 | weight 1%" in run.stdout
    assert "[zerolayer]   wave wave_rest: completed" in run.stdout

    before = fleet.weights()
    again = fleet.canary("pass", records, "-e", TWO_WAVES)
    assert again.returncode == 0, again.stdout[-6000:]
    counts = recap(again.stdout)
    assert set(counts) >= set(fleet.nodes)
    assert all(count["changed"] == 0 for count in counts.values()), counts
    assert fleet.weights() == before


def test_injected_errors_fail_a_gate_and_roll_back(fleet, records, baseline, load):
    client = load("errors")
    try:
        fleet.set_error_rate(0.2)
        run = fleet.canary(
            "errors",
            records,
            "-e",
            json.dumps(
                {"canary_schedule": [{"weight": 5, "hold": 60}, {"weight": 100, "hold": 0}]}
            ),
        )
    finally:
        fleet.set_error_rate(0.0)
        client.stop()
    assert run.returncode != 0
    assert "rolled back" in run.stdout
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 0, node
    kept = record(records, "errors", "gpu_nodes")
    assert kept["outcome"] == "rolled_back"
    assert kept["verdicts"][-1]["gates"]["success_rate"] == "fail"
    assert kept["verdicts"][-1]["decision"] == "rollback"
    report = rollback_report(records)
    assert report["nodes_confirmed"] == len(fleet.nodes)
    assert report["mode"] == "fast"
    # Every node's copy of the record says rolled back too: the route exporter serves it,
    # and a copy left at the stage's weight would set off ZerolayerRouteWeightDiffersFromRecord.
    for node in fleet.nodes:
        assert fleet.node_record(node)["outcome"] == "rolled_back", node


def test_unreachable_prometheus_holds_never_rolls_back_and_a_resume_carries_on(
    fleet, records, baseline, load
):
    assert fleet.monitoring, "the inventory names no monitoring host"
    client = load("holds")
    fleet.exec(fleet.monitoring, "systemctl", "stop", "prometheus.service")
    try:
        run = fleet.canary(
            "holds",
            records,
            "-e",
            json.dumps(
                {
                    "canary_schedule": [{"weight": 5, "hold": 10}, {"weight": 100, "hold": 0}],
                    "canary_max_holds": 2,
                }
            ),
        )
    finally:
        fleet.exec(fleet.monitoring, "systemctl", "start", "prometheus.service")
    try:
        assert run.returncode != 0
        assert "paused at stage 1" in run.stdout
        kept = record(records, "holds", "gpu_nodes")
        assert kept["outcome"] == "paused"
        assert kept["rollback"] is None
        assert {verdict["verdict"] for verdict in kept["verdicts"]} == {"hold"}
        # No rollback: the stage's weight is still in place on every node, whose copy of the
        # record says paused.
        for node, routes in fleet.weights().items():
            assert routes[fleet.route["name"]][0] == 500, node
            assert fleet.node_record(node)["outcome"] == "paused", node
        assert not list(records.glob("rollback-*.json"))

        # Prometheus is back: a person's resume carries the paused wave on from its stage,
        # with a fresh gate history, to full weight.
        resumed = fleet.canary(
            "holds",
            records,
            "-e",
            json.dumps(
                {
                    "canary_schedule": [{"weight": 5, "hold": 10}, {"weight": 100, "hold": 0}],
                    "canary_action": "resume",
                }
            ),
        )
    finally:
        summary = client.stop()
    assert resumed.returncode == 0, resumed.stdout[-6000:]
    kept = record(records, "holds", "gpu_nodes")
    assert kept["outcome"] == "completed"
    assert "resume" in [transition["action"] for transition in kept["transitions"]]
    assert kept["verdicts"][-1]["decision"] == "complete"
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 10000, node
        assert fleet.node_record(node)["outcome"] == "completed", node
    assert summary["requests_failed"] == 0, summary.get("failures")


HOLD_KEYS = ("index", "status", "hold_started_at")


def in_hold_everywhere(fleet, records, rollout_id, wave, stage):
    """The run's state once it is inside stage's hold loop: the controller's record holding,
    every node's copy of it synced, the stage's weight on every node and at least one gate
    evaluation counted in the wave's gate history. None until then."""
    try:
        kept = record(records, rollout_id, wave)
        gates = json.loads((records / rollout_id / "gates" / ("%s.json" % wave)).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if kept["stage"].get("status") != "holding" or kept["stage"].get("index") != stage:
        return None
    if gates.get("stage") != stage or gates.get("evaluations", 0) < 1:
        return None
    weight_bp = kept["schedule"][stage]["weight_bp"]
    for node in fleet.nodes:
        copy = (fleet.node_record(node) or {}).get("stage", {})
        if [copy.get(key) for key in HOLD_KEYS] != [kept["stage"][key] for key in HOLD_KEYS]:
            return None
        if fleet.routes(node)[fleet.route["name"]][0] != weight_bp:
            return None
    return kept


def test_interrupted_run_resumes_with_the_remaining_hold(fleet, records, baseline, load):
    # The second run keeps the first run's hold start whether or not any of the hold is left.
    hold_s = 25
    schedule = json.dumps(
        {"canary_schedule": [{"weight": 5, "hold": hold_s}, {"weight": 100, "hold": 0}]}
    )
    client = load("resume")
    try:
        first = fleet.canary("resume", records, "-e", schedule, background=True)
        # Killed only once it is inside the hold loop with its state on the controller and
        # every node, so the second run has a hold start to keep; never by how long it ran.
        deadline = time.monotonic() + 600
        held = None
        while held is None and first.poll() is None and time.monotonic() < deadline:
            held = in_hold_everywhere(fleet, records, "resume", "gpu_nodes", 0)
            time.sleep(0.5)
        assert held is not None, (
            "the first run never reached its hold on every node:\n"
            + first.log_path.read_text()[-6000:]
        )
        # The whole run, Ansible's workers (sessions of their own) included, and nothing else.
        fleet.end_background_runs()
        assert first.returncode == -signal.SIGKILL

        second = fleet.canary("resume", records, "-e", schedule)
    finally:
        client.stop()
    assert second.returncode == 0, (
        first.log_path.read_text()[-3000:] + "\n--- second run ---\n" + second.stdout[-6000:]
    )
    kept = record(records, "resume", "gpu_nodes")
    assert kept["outcome"] == "completed"
    first_stage = kept["completed_stages"][0]
    # The hold kept its first start: the second run held only what was left of it.
    assert first_stage["hold_started_at"] == held["stage"]["hold_started_at"]
    assert [t["action"] for t in kept["transitions"]].count("hold_started") == 2  # stage 1 and 2
    assert [t["stage"] for t in kept["transitions"] if t["action"] == "stage_started"] == [0, 1]
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 10000, node


def test_fast_rollback_confirms_weight_zero_and_reports_its_time(
    fleet, records, baseline, tmp_path
):
    fleet.set_weight(50)
    gone = tmp_path / "gone.ini"
    gone.write_text("[gpu_nodes]\nzl-node-gone ansible_connection=containers.podman.podman\n")

    # One node's fence watcher is stopped: the others confirm by their acknowledgement in
    # the store, that one gets the push. Its watcher left no presence key behind, so the
    # count does not wait for it: given 30 s and a quiet period of 30 s, a count that waited
    # for the silent node would last 30 s.
    stopped = fleet.nodes[-1]
    fleet.exec(stopped, "systemctl", "stop", "zerolayer-fence-watcher.service")
    try:
        # A budget other than the default: the report must judge against the one it was given.
        before = time.time()
        run = fleet.playbook(
            "rollback.yml",
            "-e",
            "canary_record_dir=%s" % records,
            "-e",
            "rollback_fast_budget_s=3600",
            "-e",
            "rollback_ack_wait_s=30",
            "-e",
            "rollback_ack_quiet_s=30",
        )
        after = time.time()
    finally:
        fleet.exec(stopped, "systemctl", "start", "zerolayer-fence-watcher.service")
    assert run.returncode == 0, run.stdout[-6000:]
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 0, node
    report = rollback_report(records)
    assert report["mode"] == "fast"
    assert report["nodes_confirmed"] == report["nodes_total"] == len(fleet.nodes)
    assert sorted(report["confirmed_by_watcher"]) == sorted(set(fleet.nodes) - {stopped}), report
    assert report["pushed"] == [stopped], report
    assert report["watchers_absent"] == [stopped], report
    assert float(report["count_waited_s"]) < 10, report
    by_node = {entry["node"]: entry for entry in report["nodes"]}
    assert all(by_node[node]["seen_after_s"] is not None for node in report["confirmed_by_watcher"])
    # The report's clock readings lie inside the run as this test saw it from outside: its
    # time starts with the ansible-playbook process (kept in 10 ms clock ticks, rounded down).
    assert before - 0.02 <= report["started_at_unix"] <= before + 1.0, (before, report)
    assert report["started_at_unix"] <= report["finished_at_unix"] <= after, (
        before,
        report,
        after,
    )
    assert (report["budget_s"], report["within_budget"]) == (3600, True)
    assert "(budget 3600 s: within)" in run.stdout
    # After it, outside its time: every node said its direct connections were gone, the
    # watchers in the store and the pushed node by its own count.
    direct = report["direct"]
    assert direct["left"] == {} and direct["unreported"] == [], direct
    assert {node: entry["by"] for node, entry in direct["nodes"].items()} == {
        node: "push" if node == stopped else "watcher" for node in fleet.nodes
    }, direct
    print("fast rollback: report wall_time_s=%s" % report["wall_time_s"])

    # A node that cannot be reached is named, the others still roll back, the exit is non-zero.
    fleet.set_weight(50)
    for stale in records.glob("rollback-*.json"):
        stale.unlink()
    # A budget of 0 s no rollback can keep: the report says it went over.
    partial = fleet.playbook(
        "rollback.yml",
        "-e",
        "canary_record_dir=%s" % records,
        "-e",
        "rollback_fast_budget_s=0",
        inventories=[gone],
    )
    assert partial.returncode != 0
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 0, node
    report = rollback_report(records)
    assert report["nodes_confirmed"] == len(fleet.nodes)
    assert "zl-node-gone" in report["unreachable"] + report["not_confirmed"]
    assert (report["budget_s"], report["within_budget"]) == (0, False)


def test_a_role_run_after_a_rollback_raises_no_weight(fleet, records, baseline):
    """site.yml after a rollback cannot undo it: its route writes carry no epoch."""
    run = fleet.playbook("rollback.yml", "-e", "canary_record_dir=%s" % records)
    assert run.returncode == 0, run.stdout[-6000:]
    node = fleet.nodes[0]
    epoch = fleet.fence_epoch(node)
    assert epoch > 0
    pinned = [
        dict(route, weight=5, pin_weight=True)
        for route in fleet.node_vars[node]["ebpf_router_routes"]
    ]
    role_run = (
        "site.yml",
        "--tags",
        "ebpf_router",
        "--limit",
        node,
        "-e",
        json.dumps({"ebpf_router_routes": pinned}),
    )
    # (weight_bp, generation) per route: any write to the route map moves the generation.
    before = fleet.routes(node)

    refused = fleet.playbook(*role_run)
    assert refused.returncode != 0, refused.stdout[-4000:]
    assert "carries epoch 0, older than this node's fence epoch %d" % epoch in refused.stdout, (
        refused.stdout[-4000:]
    )
    assert fleet.routes(node) == before

    # Taking the epoch on purpose (ebpf_router_epoch) is what restore.yml does: the deep
    # rollback test below restores at a declared weight above 0.


def test_deep_rollback_detaches_and_the_proxy_serves(fleet, records, baseline):
    fleet.set_weight(100)
    # The watchers do the deep rollback and acknowledge it; the one stopped gets the push.
    stopped = fleet.nodes[0]
    fleet.exec(stopped, "systemctl", "stop", "zerolayer-fence-watcher.service")
    try:
        run = fleet.playbook(
            "rollback.yml",
            "-e",
            "rollback_mode=deep",
            "-e",
            "canary_record_dir=%s" % records,
            "-e",
            "rollback_deep_budget_s=1800",
        )
    finally:
        fleet.exec(stopped, "systemctl", "start", "zerolayer-fence-watcher.service")
    assert run.returncode == 0, run.stdout[-6000:]
    report = rollback_report(records)
    assert report["mode"] == "deep"
    assert report["nodes_confirmed"] == len(fleet.nodes)
    assert sorted(report["confirmed_by_watcher"]) == sorted(set(fleet.nodes) - {stopped}), report
    assert report["pushed"] == [stopped], report
    assert report["watchers_absent"] == [stopped], report
    route = fleet.route["name"]
    for entry in report["nodes"]:
        assert entry["router_removed"] and entry["paths"] == {route: "proxy"}, entry
        assert entry["proxy_running"] is True, entry
    assert (report["budget_s"], report["within_budget"]) == (1800, True)
    assert report["direct"]["left"] == {} and report["direct"]["unreported"] == [], report
    assert report["direct"]["nodes"][stopped]["by"] == "push", report["direct"]
    print("deep rollback: report wall_time_s=%s" % report["wall_time_s"])
    for node in fleet.nodes:
        assert fleet.exec(node, "test", "-e", "/sys/fs/bpf/zerolayer", check=False).returncode != 0
        answer = fleet.service_headers(node)
        assert "X-Zerolayer-Path: proxy" in answer, (node, answer)
        assert " 200 " in answer.splitlines()[0], (node, answer)

    # restore.yml puts the router back with the engines registered (the drill's last step,
    # and what the next test module needs). It takes the store's current fence epoch, so a
    # declared weight above 0 is admitted on nodes the rollback fenced; the baseline puts
    # the weights back to 0 after the test.
    declared = [
        dict(route, weight=5) for route in fleet.node_vars[fleet.nodes[0]]["ebpf_router_routes"]
    ]
    restored = fleet.playbook("restore.yml", "-e", json.dumps({"ebpf_router_routes": declared}))
    assert restored.returncode == 0, restored.stdout[-6000:]
    for node, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 500, node
    for node in fleet.nodes:
        info = fleet.show(node)
        assert info["router"]["attached"], node
        assert all(route["slots"] for route in info["routes"]), (node, info["routes"])
