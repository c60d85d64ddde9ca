"""Rollback speed at fleet scale: fast and deep rollback wall time for 1, 5, 10, 20 nodes.

One run, side by side: a sandbox fleet of the largest size is started and provisioned once
(the roles a rollback touches: model_engine, legacy_proxy, ebpf_router), then for each
round every size is measured in turn with `rollback.yml -e rollback_hosts=<first n
nodes>`, next to the floors the controller cannot go below on the same nodes: an
`ansible -m raw` no-op and an `ansible -m ansible.builtin.ping` (a Python module) no-op.
The deep rollback of each size is followed by restore.yml (also timed). Per-node cost is
the least-squares slope of wall time over node count; 100 and 1,000 nodes are projected
from it.

    .venv/bin/python bench/rollback_scale.py                     # sizes 1,5,10,20, 3 rounds
    .venv/bin/python bench/rollback_scale.py --sizes 1,5 --rounds 1 --deep-rounds 1

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
PROVISION_TAGS = "model_engine,legacy_proxy,ebpf_router"


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
    def one(node):
        weight = "--weight=%d" % percent
        subprocess.run(
            ["podman", "exec", node, ROUTECTL, "set-weight", "--route=chat", weight],
            env=env,
            check=True,
            capture_output=True,
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(one, nodes))


def rollback(env, nodes, mode, workdir):
    report = Path(workdir) / ("rollback-%s-%d-%d.json" % (mode, len(nodes), time.time_ns()))
    wall, _result = timed(
        [
            "ansible-playbook",
            "-i",
            str(INVENTORY),
            str(REPO / "playbooks" / "rollback.yml"),
            "-e",
            "rollback_mode=%s" % mode,
            "-e",
            "rollback_hosts=%s" % ",".join(nodes),
            "-e",
            "rollback_report_path=%s" % report,
            "-e",
            "canary_record_dir=%s" % workdir,
        ],
        env,
    )
    facts = json.loads(report.read_text())
    if int(facts["nodes_confirmed"]) != len(nodes):
        raise RuntimeError("%s rollback confirmed %s of %d nodes" % (mode, facts, len(nodes)))
    return {"report_wall_s": float(facts["wall_time_s"]), "playbook_wall_s": wall}


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
    rows = {n: {"fast": [], "deep": [], "restore": [], "raw": [], "python": []} for n in sizes}
    for round_index in range(args.rounds):
        for n in sizes:
            nodes = largest[:n]
            rows[n]["raw"].append(adhoc(env, nodes, "raw"))
            rows[n]["python"].append(adhoc(env, nodes, "ansible.builtin.ping"))
            set_weight(env, nodes, 50)
            rows[n]["fast"].append(rollback(env, nodes, "fast", workdir))
            log(
                "round %d, %d nodes: fast %.2f s (report %.2f s), raw %.2f s, python %.2f s"
                % (
                    round_index + 1,
                    n,
                    rows[n]["fast"][-1]["playbook_wall_s"],
                    rows[n]["fast"][-1]["report_wall_s"],
                    rows[n]["raw"][-1],
                    rows[n]["python"][-1],
                )
            )
    for round_index in range(args.deep_rounds):
        for n in sizes:
            nodes = largest[:n]
            rows[n]["deep"].append(rollback(env, nodes, "deep", workdir))
            rows[n]["restore"].append(restore(env, nodes))
            log(
                "round %d, %d nodes: deep %.2f s (report %.2f s), restore %.2f s"
                % (
                    round_index + 1,
                    n,
                    rows[n]["deep"][-1]["playbook_wall_s"],
                    rows[n]["deep"][-1]["report_wall_s"],
                    rows[n]["restore"][-1],
                )
            )
    return rows


def summarise(rows):
    table = []
    for n, row in sorted(rows.items()):
        table.append(
            {
                "nodes": n,
                "fast_report_s": statistics.median(r["report_wall_s"] for r in row["fast"]),
                "fast_playbook_s": statistics.median(r["playbook_wall_s"] for r in row["fast"]),
                "deep_report_s": statistics.median(r["report_wall_s"] for r in row["deep"]),
                "deep_playbook_s": statistics.median(r["playbook_wall_s"] for r in row["deep"]),
                "restore_s": statistics.median(row["restore"]),
                "raw_noop_s": statistics.median(row["raw"]),
                "python_noop_s": statistics.median(row["python"]),
            }
        )
    fits = {}
    for key in ("fast_report_s", "fast_playbook_s", "deep_report_s", "raw_noop_s"):
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
        "`report` is the rollback's own measurement (first task to last confirmation); "
        "`playbook` is the whole `ansible-playbook` process (start-up, inventory, report).",
        "",
        "| nodes | fast report s | fast playbook s | deep report s | deep playbook s | "
        "restore s | raw no-op s | Python no-op s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in table:
        lines.append(
            "| %(nodes)d | %(fast_report_s).2f | %(fast_playbook_s).2f | %(deep_report_s).2f | "
            "%(deep_playbook_s).2f | %(restore_s).1f | %(raw_noop_s).2f | %(python_noop_s).2f |"
            % row
        )
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
    parser.add_argument("--deep-rounds", type=int, default=1, help="rounds of deep rollbacks")
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
    if args.rounds < 1 or args.deep_rounds < 1:
        parser.error("--rounds and --deep-rounds must be at least 1")
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
                    "--limit",
                    "gpu_nodes",
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
