"""Rollback speed at fleet scale: fast and deep rollback wall time for 1, 5, 10, 20 nodes.

One run, side by side: a sandbox fleet of the largest size is started and provisioned once
(the roles a rollback touches: rollout_store, model_engine, legacy_proxy, ebpf_router with
its fence watcher), reached over SSH as a real fleet is, then for each round every size is
measured in turn with `rollback.yml -e rollback_hosts=<first n nodes>` on two paths:
`watcher` (the fence raised, the nodes' watchers acknowledge, the push only where they lag),
`static` (fast only: the same with the inventory read from a file written once from the
sandbox's, as a fleet's inventory is, instead of asking podman on every run) and `push` (no
acknowledgement awaited, `rollback_ack_wait_s=0`: every node gets the push, so the push's
per-node cost over SSH shows), next to the floors the controller cannot go
below on the same nodes: an `ansible -m raw` no-op and an `ansible -m ansible.builtin.ping`
(a Python module) no-op. Each deep rollback is followed by restore.yml (also timed). The
time compared with the budgets is the report's: from the ansible-playbook process's start to
the last confirmation. Per-node cost is the least-squares slope of wall time over node count;
100 and 1,000 nodes are projected from it.

    .venv/bin/python bench/rollback_scale.py                     # sizes 1,5,10,20, 3 rounds
    .venv/bin/python bench/rollback_scale.py --sizes 1,5 --rounds 1 --deep-rounds 1
    .venv/bin/python bench/rollback_scale.py --sizes 1,10 --deep-rounds 0  # fast only

Writes bench/results/rollback-scale-<UTC time>.md and .json. Removes the fleet at the end
unless --keep-fleet. As root, from the checkout, after scripts/setup.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import configparser
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SANDBOX = REPO / "scripts" / "sandbox"
INVENTORY = REPO / "inventories" / "sandbox"
ROUTECTL = "/usr/local/sbin/zerolayer-routectl"
PROVISION_TAGS = "rollout_store,model_engine,legacy_proxy,ebpf_router"
# The ways a rollback is measured: confirmed by the nodes' fence watchers; the same with the
# inventory read from a static file instead of asking podman (what a fleet's inventory is: a
# file, or a cached cloud inventory); every node pushed, no acknowledgement awaited; the
# operator's command `zerolayer rollback` (no ansible-playbook unless a node lags).
FAST_PATHS = ("watcher", "static", "push", "cli")
DEEP_PATHS = ("watcher", "push", "cli")
RUN_KEYS = ["fast_" + path for path in FAST_PATHS] + ["deep_" + path for path in DEEP_PATHS]
# The static path's inventory, written once per run into the run's work directory.
STATIC_INVENTORY = "static-inventory.yml"


def log(message):
    sys.stderr.write("rollback-scale: %s\n" % message)
    sys.stderr.flush()


def environment():
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["PATH"] = "%s:%s" % (REPO / ".venv" / "bin", env.get("PATH", ""))
    env["CONTAINERS_CONF"] = str(REPO / "tests" / "sandbox" / "containers.conf")
    return env


def timed(argv, env, check=True, timeout=1800):
    started = time.monotonic()
    result = subprocess.run(
        argv, env=env, cwd=REPO, capture_output=True, text=True, timeout=timeout, check=False
    )
    wall = time.monotonic() - started
    if check and result.returncode != 0:
        raise RuntimeError(
            "%s failed (%d):\n%s\n%s"
            % (" ".join(argv[:3]), result.returncode, result.stdout[-4000:], result.stderr[-4000:])
        )
    return wall, result


def node_names(count):
    return ["zl-node-%02d" % index for index in range(1, count + 1)]


def set_weight(env, nodes, percent):
    """A person on each node raising the weight under the node's current fence epoch (after
    a rollback a write without it is refused, as it must be)."""

    def one(node):
        shown = subprocess.run(
            ["podman", "exec", node, ROUTECTL, "show"],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        epoch = json.loads(shown.stdout.strip().splitlines()[-1])["fence"]["epoch"]
        subprocess.run(
            ["podman", "exec", node, ROUTECTL, "set-weight", "--route=chat",
             "--weight=%d" % percent, "--epoch=%d" % epoch],
            env=env,
            check=True,
            capture_output=True,
        )  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, nodes))


def static_inventory(env, workdir):
    """The sandbox's inventory written once to a file: the same hosts, groups and variables
    (group variables kept with their groups), read without asking podman."""
    path = Path(workdir) / STATIC_INVENTORY
    timed(["ansible-inventory", "-i", str(INVENTORY), "--list", "--yaml", "--export",
           "--output", str(path)], env)  # fmt: skip
    return path


def cli_rollback(env, nodes, mode, report):
    """`zerolayer rollback`: the whole command as the process the person waits for."""
    argv = [str(REPO / ".venv" / "bin" / "zerolayer"), "rollback", "-i", str(INVENTORY),
            "--hosts", ",".join(nodes), "--report", str(report), "-o", "json"]  # fmt: skip
    if mode == "deep":
        argv.append("--deep")
    return timed(argv, env)


def rollback(env, nodes, mode, path, workdir):
    report = Path(workdir) / ("rollback-%s-%d-%d.json" % (mode, len(nodes), time.time_ns()))
    if path == "cli":
        wall, _result = cli_rollback(env, nodes, mode, report)
        return confirmed_run(report, nodes, mode, path, wall)
    inventory = Path(workdir) / STATIC_INVENTORY if path == "static" else INVENTORY
    # push: no acknowledgement is awaited, every node gets the push.
    wait = []
    if path == "push":
        wait = ["-e", "rollback_ack_wait_s=0", "-e", "rollback_deep_ack_wait_s=0"]
    wall, _result = timed(
        [
            "ansible-playbook",
            "-i",
            str(inventory),
            str(REPO / "playbooks" / "rollback.yml"),
            "-e",
            "rollback_mode=%s" % mode,
            "-e",
            "rollback_hosts=%s" % ",".join(nodes),
            "-e",
            "rollback_report_path=%s" % report,
            "-e",
            "canary_record_dir=%s" % workdir,
            *wait,
        ],
        env,
    )
    return confirmed_run(report, nodes, mode, path, wall)


def confirmed_run(report, nodes, mode, path, wall):
    """A run's figures from its report; RuntimeError when a node was not confirmed."""
    facts = json.loads(report.read_text())
    if int(facts["nodes_confirmed"]) != len(nodes):
        raise RuntimeError("%s rollback confirmed %s of %d nodes" % (mode, facts, len(nodes)))
    by_watcher = len(facts["confirmed_by_watcher"])
    if path != "push" and by_watcher != len(nodes):
        raise RuntimeError("%s rollback: only %s confirmed by their watcher" % (mode, by_watcher))
    return {
        "report_wall_s": float(facts["wall_time_s"]),
        "playbook_wall_s": wall,
        "by_watcher": by_watcher,
        "pushed": len(facts["pushed"]),
    }


def adhoc(env, nodes, module):
    argv = ["ansible", "-i", str(INVENTORY), ",".join(nodes), "-m", module]
    if module == "raw":
        argv += ["-a", "true"]
    wall, _result = timed(argv, env)
    return wall


def restore(env, nodes):
    wall, _result = timed(
        [
            "ansible-playbook",
            "-i",
            str(INVENTORY),
            str(REPO / "playbooks" / "restore.yml"),
            "-e",
            "restore_hosts=%s" % ",".join(nodes),
        ],
        env,
    )
    return wall


def slope(points):
    """Least-squares (intercept, slope) of [(n, seconds)]."""
    xs = [nodes for nodes, _seconds in points]
    ys = [seconds for _nodes, seconds in points]
    if len(set(xs)) < 2:
        return ys[0], 0.0
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / sum((x - mean_x) ** 2 for x in xs)
    return mean_y - b * mean_x, b


def ansible_settings():
    parser = configparser.ConfigParser()
    parser.read(REPO / "ansible.cfg")
    return {
        "forks": parser.get("defaults", "forks", fallback="5"),
        "strategy": parser.get("defaults", "strategy", fallback="linear"),
        "pipelining": parser.get("ssh_connection", "pipelining", fallback="False"),
        "connection": "ssh, ControlPersist (inventories/sandbox)",
        "gather_facts": "false (fast and deep)",
    }


def measure(args, env, workdir):
    sizes = args.sizes
    largest = node_names(max(sizes))
    rows = {n: {"raw": [], "python": [], "restore": []} for n in sizes}
    for n in sizes:
        for key in RUN_KEYS:
            rows[n][key] = []
    static_inventory(env, workdir)
    for round_index in range(args.rounds):
        for n in sizes:
            nodes = largest[:n]
            rows[n]["raw"].append(adhoc(env, nodes, "raw"))
            rows[n]["python"].append(adhoc(env, nodes, "ansible.builtin.ping"))
            for path in FAST_PATHS:
                set_weight(env, nodes, 50)
                run = rollback(env, nodes, "fast", path, workdir)
                rows[n]["fast_" + path].append(run)
                log(
                    "round %d, %d nodes, fast by %s: report %.2f s, process %.2f s "
                    "(%d by watcher, %d pushed)"
                    % (round_index + 1, n, path, run["report_wall_s"], run["playbook_wall_s"],
                       run["by_watcher"], run["pushed"])
                )  # fmt: skip
            log("round %d, %d nodes: raw %.2f s, python %.2f s"
                % (round_index + 1, n, rows[n]["raw"][-1], rows[n]["python"][-1]))  # fmt: skip
    for round_index in range(args.deep_rounds):
        for n in sizes:
            nodes = largest[:n]
            for path in DEEP_PATHS:
                run = rollback(env, nodes, "deep", path, workdir)
                rows[n]["deep_" + path].append(run)
                rows[n]["restore"].append(restore(env, nodes))
                log(
                    "round %d, %d nodes, deep by %s: report %.2f s, process %.2f s "
                    "(%d by watcher, %d pushed), restore %.1f s"
                    % (round_index + 1, n, path, run["report_wall_s"], run["playbook_wall_s"],
                       run["by_watcher"], run["pushed"], rows[n]["restore"][-1])
                )  # fmt: skip
    return rows


def median_or_none(values):
    values = list(values)
    return statistics.median(values) if values else None


def summarise(rows):
    table = []
    for n, row in sorted(rows.items()):
        entry = {
            "nodes": n,
            "restore_s": median_or_none(row["restore"]),
            "raw_noop_s": median_or_none(row["raw"]),
            "python_noop_s": median_or_none(row["python"]),
        }
        for key in RUN_KEYS:
            entry[key + "_report_s"] = median_or_none(r["report_wall_s"] for r in row[key])
            entry[key + "_process_s"] = median_or_none(r["playbook_wall_s"] for r in row[key])
        table.append(entry)
    fits = {}
    for key in [k + "_report_s" for k in RUN_KEYS] + ["raw_noop_s", "python_noop_s"]:
        if any(row[key] is None for row in table):
            continue  # not measured (no deep rounds)
        intercept, per_node = slope([(row["nodes"], row[key]) for row in table])
        fits[key] = {
            "intercept_s": round(intercept, 3),
            "per_node_s": round(per_node, 4),
            "projected_100_s": round(intercept + 100 * per_node, 1),
            "projected_1000_s": round(intercept + 1000 * per_node, 1),
        }
    return table, fits


def markdown(table, fits, settings, started, args):
    lines = [
        "# Rollback at scale (%s)" % started,
        "",
        "Sandbox nodes (privileged systemd containers) on this machine, %d round(s) fast, "
        "%d deep; medians. Ansible: %s." % (args.rounds, args.deep_rounds, settings),
        "`report` is the rollback's own measurement (the ansible-playbook process's start to "
        "the last confirmation, the figure the budgets judge); `process` is the whole "
        "process the person waits for (with the report, its files and records). `watcher`: the "
        "nodes' fence watchers confirm; `static`: the same, the inventory read from a file "
        "written once from the sandbox's (`ansible-inventory --list --yaml --export`) instead of "
        "asking podman; `push`: no acknowledgement awaited, every node pushed; `cli`: "
        "`zerolayer rollback` (the store and the count in process, ansible-playbook only for "
        "nodes that lag; its report's time also runs from the process's start).",
        "",
        "| nodes | "
        + " | ".join("%s report / process s" % key.replace("_", " ") for key in RUN_KEYS)
        + " | restore s | raw no-op s | Python no-op s |",
        "|" + " --- |" * (len(RUN_KEYS) + 4),
    ]
    for row in table:
        cells = ["%d" % row["nodes"]]
        for key in RUN_KEYS:
            if row[key + "_report_s"] is None:
                cells.append("not measured")
                continue
            cells.append("%.2f / %.2f" % (row[key + "_report_s"], row[key + "_process_s"]))
        cells += ["%.1f" % row["restore_s"] if row["restore_s"] is not None else "not measured",
                  "%.2f" % row["raw_noop_s"], "%.2f" % row["python_noop_s"]]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| fit | intercept s | per node s | 100 nodes s | 1,000 nodes s |"]
    lines.append("| --- | --- | --- | --- | --- |")
    for key, fit in fits.items():
        lines.append(
            "| %s | %s | %s | %s | %s |"
            % (
                key,
                fit["intercept_s"],
                fit["per_node_s"],
                fit["projected_100_s"],
                fit["projected_1000_s"],
            )
        )
    return "\n".join(lines) + "\n"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="1,5,10,20", help="node counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of fast rollbacks")
    parser.add_argument(
        "--deep-rounds", type=int, default=1, help="rounds of deep rollbacks (0: none)"
    )
    parser.add_argument("--keep-fleet", action="store_true", help="leave the fleet running")
    parser.add_argument(
        "--reuse-fleet", action="store_true", help="use a fleet already up and provisioned"
    )
    parser.add_argument("--output-dir", default=str(REPO / "bench" / "results"))
    args = parser.parse_args(argv)
    try:
        args.sizes = sorted({int(size) for size in args.sizes.split(",")})
    except ValueError:
        parser.error("--sizes must be whole numbers separated by commas, e.g. 1,5,10,20")
    if args.sizes[0] < 1 or args.sizes[-1] > 99:
        parser.error("--sizes must be from 1 to 99 (the sandbox's limit)")
    if args.rounds < 1 or args.deep_rounds < 0:
        parser.error("--rounds must be at least 1 and --deep-rounds at least 0")
    return args


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    env = environment()
    started = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    settings = ansible_settings()
    try:
        if not args.reuse_fleet:
            log("starting %d nodes" % args.sizes[-1])
            timed([str(SANDBOX), "up", str(args.sizes[-1])], env)
            log("provisioning them (%s)" % PROVISION_TAGS)
            wall, _result = timed(
                [
                    "ansible-playbook",
                    "-i",
                    str(INVENTORY),
                    str(REPO / "playbooks" / "site.yml"),
                    "--tags",
                    PROVISION_TAGS,
                ],
                env,
                timeout=5400,
            )
            log("provisioned in %.0f s" % wall)
        with tempfile.TemporaryDirectory(prefix="zl-rollback-scale-") as workdir:
            rows = measure(args, env, workdir)
    finally:
        if not (args.keep_fleet or args.reuse_fleet):
            subprocess.run([str(SANDBOX), "down"], env=env, check=False)
    table, fits = summarise(rows)
    report = markdown(table, fits, settings, started, args)
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    (output / ("rollback-scale-%s.md" % started)).write_text(report)
    (output / ("rollback-scale-%s.json" % started)).write_text(
        json.dumps({"settings": settings, "runs": rows, "table": table, "fits": fits}, indent=2)
        + "\n"
    )
    sys.stdout.write(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
