"""A rollback of 1,000 and 5,000 simulated nodes: real etcd, real watches, real maps.

Each simulated node is what the fence watcher needs of a node, for real: its own pinned
router maps in a private bpffs (every map of the current layout, a route "chat" at 50 %),
its own fence file, and its own `fence_watcher.Watcher` with its own connection to one
real etcd member, watching the fence. What is not real: the nodes' watchers all share one
CPU (threads in a few worker processes), the controller has the other; and the router
program is not attached (no traffic flows; the watcher writes and reads the same maps
either way).

For each size, `playbooks/rollback.yml` runs against an inventory of that many hosts, as an
operator would: it raises the fence in the store, counts the acknowledgements and pushes to
the nodes that did not confirm. A share of the nodes (--silent-pct, 5 %) run no watcher:
- fast: they are reachable (`ansible_connection=local`, the push's raw call runs
  zerolayer-routectl on their own pins), so the push confirms them;
- deep: they are down (their SSH port on 127.0.0.1 refuses), so the push is tried and the
  report names them unreachable. The deep push does not run for real here: it would start
  and probe this machine's own proxy service.
Every map is read back afterwards: fast, weight 0 on every node; deep, pins removed on every
node with a watcher.

    .venv/bin/python bench/fence_fanout.py                       # 1,000 and 5,000 nodes
    .venv/bin/python bench/fence_fanout.py --sizes 200 --modes fast

Writes bench/results/fence-fanout-<UTC time>.md and .json. As root, from the checkout,
after scripts/setup. Removes every process, mount and file it made, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.zerolayer.fleet.plugins.module_utils.etcd_v3 import (  # noqa: E402
    EtcdClient,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.fence_watcher import (  # noqa: E402
    Watcher,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.loader import (  # noqa: E402
    pin_new_map,
    write_new_seeds,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import (  # noqa: E402
    PinLayout,
    ensure_pin_dirs,
    missing_pins,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_store import (  # noqa: E402
    RolloutStore,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.route_codec import (  # noqa: E402
    MAP_SPECS,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import (  # noqa: E402
    read_routes,
    set_route,
)

PREFIX = "/zlb-fanout/"
ROUTE, PORT, WEIGHT = "chat", 8080, 50
# A simulated watcher re-opens an idle watch this often (a node's: every 10 s); at 5,000
# nodes the default would be 500 reconnections a second on two cores, all through one run.
SIM_IDLE_RECHECK_S = 120.0
WORKER_PROCESSES = 4
# The simulated nodes' own work on one CPU, the controller on the other (etcd on either):
# so the controller's time is its own, and the nodes' acknowledgements show what sharing one
# CPU among them costs.
CONTROLLER_CPU, NODES_CPU = "0", "1"


def log(message):
    sys.stderr.write("fence-fanout: %s\n" % message)
    sys.stderr.flush()


def node_name(index):
    return "sim-%05d" % index


def node_layout(bpffs, state_dir, name):
    return PinLayout(os.path.join(bpffs, name), fence_file=os.path.join(state_dir, name + ".json"))


def make_node(layout):
    """Every map of the current layout, pinned, with the node's seeds and one route at 50 %."""
    ensure_pin_dirs(layout)
    for spec in MAP_SPECS:
        pin_new_map(spec, layout.map(spec.name))
    write_new_seeds(layout)
    set_route(layout, ROUTE, PORT, WEIGHT)


# ---------------------------------------------------------------- worker process


def worker_main(args):
    """Run one Watcher thread per node named on stdin; say "ready" once all are connected."""
    names = [line.strip() for line in sys.stdin if line.strip()]
    stopping = threading.Event()
    watchers = []
    for name in names:
        layout = node_layout(args.bpffs, args.state_dir, name)
        store = RolloutStore(EtcdClient(args.endpoint, timeout=30), PREFIX)
        watchers.append(Watcher(store, layout, name, status_file=None))
    for watcher in watchers:
        thread = threading.Thread(
            target=watcher.run,
            kwargs={"stop": stopping.is_set, "idle_recheck_s": SIM_IDLE_RECHECK_S},
            daemon=True,
        )
        thread.start()
    deadline = time.monotonic() + 600
    while not all(watcher.status["connected"] for watcher in watchers):
        if time.monotonic() > deadline:
            sys.stdout.write("not ready\n")
            return 1
        time.sleep(0.2)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    signal.sigwait({signal.SIGTERM})
    return 0


# ---------------------------------------------------------------- one size


def start_workers(stack, args, endpoint, bpffs, state_dir, names):
    workers = []
    shares = [names[i::WORKER_PROCESSES] for i in range(WORKER_PROCESSES)]
    for share in shares:
        if not share:
            continue
        proc = subprocess.Popen(
            ["taskset", "-c", NODES_CPU, sys.executable, __file__, "--worker",
             "--endpoint", endpoint, "--bpffs", bpffs, "--state-dir", state_dir],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        stack.callback(stop_group, proc)
        proc.stdin.write("\n".join(share) + "\n")
        proc.stdin.close()
        workers.append(proc)
    for proc in workers:
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError("a watcher worker did not connect: %r" % line)
    return workers


def stop_group(proc):
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


def write_inventory(path, names, silent, mode, routectl, bpffs, state_dir):
    lines = ["[gpu_nodes]"]
    for name in names:
        layout = node_layout(bpffs, state_dir, name)
        if name in silent and mode == "deep":
            # Down: nothing answers on its SSH port.
            lines.append("%s ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=9" % name)
            continue
        lines.append(
            "%s ansible_connection=local rollback_routectl='%s --pin-dir %s --fence-file %s'"
            % (name, routectl, layout.pin_dir, layout.fence_file)
        )
    Path(path).write_text("\n".join(lines) + "\n")


def write_routectl(path):
    """zerolayer-routectl from the checkout, as the node's command runs it: on the nodes'
    CPU, since on a fleet the push's work on the node is the node's, not the controller's."""
    Path(path).write_text(
        "#!/bin/sh\nexec taskset -c %s %s -c 'import sys; sys.path.insert(0, %s); "
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.node_cli import main; "
        'sys.exit(main())\' "$@"\n'
        % (NODES_CPU, sys.executable, json.dumps(str(REPO / ".collections")))
    )
    os.chmod(path, 0o700)


def environment():
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["PATH"] = "%s:%s" % (REPO / ".venv" / "bin", env.get("PATH", ""))
    # A controller for this many hosts: forks beyond the cores only queue.
    env["ANSIBLE_FORKS"] = "20"
    env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
    return env


def run_size(args, size, mode, endpoint):
    names = [node_name(i) for i in range(size)]
    silent_count = round(size * args.silent_pct / 100.0)
    # Spread over the fleet: every step-th node, as many as asked.
    step = max(1, size // silent_count) if silent_count else 1
    silent = set(names[::step][:silent_count])
    with contextlib.ExitStack() as stack:
        workdir = tempfile.mkdtemp(prefix="zlb-fanout-")
        stack.callback(subprocess.run, ["rm", "-rf", workdir], check=False)
        bpffs = os.path.join(workdir, "bpffs")
        os.mkdir(bpffs, 0o700)
        subprocess.run(["mount", "-t", "bpf", "bpf", bpffs], check=True)
        stack.callback(subprocess.run, ["umount", bpffs], check=False)
        state_dir = os.path.join(workdir, "state")
        os.mkdir(state_dir)

        started = time.monotonic()
        for name in names:
            make_node(node_layout(bpffs, state_dir, name))
        made_s = time.monotonic() - started
        log("%d nodes' maps pinned in %.1f s" % (size, made_s))
        started = time.monotonic()
        watched = [name for name in names if name not in silent]
        start_workers(stack, args, endpoint, bpffs, state_dir, watched)
        connected_s = time.monotonic() - started
        log(
            "%d watchers connected in %.1f s (%d silent)" % (len(watched), connected_s, len(silent))
        )

        routectl = os.path.join(workdir, "routectl")
        write_routectl(routectl)
        inventory = os.path.join(workdir, "inventory.ini")
        write_inventory(inventory, names, silent, mode, routectl, bpffs, state_dir)
        report_path = os.path.join(workdir, "report.json")
        extra = {
            "rollback_mode": mode,
            "rollback_hosts": "gpu_nodes",
            "rollout_store_endpoints": [endpoint],
            "rollout_store_prefix": PREFIX,
            "canary_record_dir": os.path.join(workdir, "records"),
            "rollback_report_path": report_path,
            "rollback_reason": "fence fan-out bench",
            "rollback_ack_wait_s": args.ack_wait_s,
            "rollback_deep_ack_wait_s": args.ack_wait_s,
        }
        extra_file = os.path.join(workdir, "extra.json")
        Path(extra_file).write_text(json.dumps(extra))
        argv = [
            "taskset", "-c", CONTROLLER_CPU,
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i", inventory, str(REPO / "playbooks" / "rollback.yml"), "-e", "@" + extra_file,
        ]  # fmt: skip
        started_wall = time.time()
        started = time.monotonic()
        proc = subprocess.run(
            argv, env=environment(), cwd=REPO, capture_output=True, text=True, timeout=1800,
            check=False,
        )  # fmt: skip
        process_s = time.monotonic() - started
        if os.environ.get("ZLB_SHOW_PLAYBOOK"):
            sys.stderr.write(proc.stdout)
        if not os.path.exists(report_path):
            raise RuntimeError("rollback.yml wrote no report (rc %d): %s" % (
                proc.returncode, proc.stdout[-3000:]))  # fmt: skip
        report = json.loads(Path(report_path).read_text())

        # Read every node back, from its maps.
        wrong = []
        for name in names:
            layout = node_layout(bpffs, state_dir, name)
            if mode == "fast":
                weights = {route.name: route.weight_bp for route in read_routes(layout)}
                if weights != {ROUTE: 0}:
                    wrong.append((name, weights))
            elif name not in silent and not missing_pins(layout):
                # Its deep rollback must have removed the maps.
                wrong.append((name, "maps still pinned"))
        by_node = {entry["node"]: entry for entry in report["nodes"]}
        seen = sorted(
            entry["seen_after_s"] for entry in report["nodes"]
            if entry.get("confirmed_by") == "watcher" and entry.get("seen_after_s") is not None
        )  # fmt: skip
        result = {
            "mode": mode,
            "nodes": size,
            "silent": len(silent),
            "maps_pinned_s": round(made_s, 2),
            "watchers_connected_s": round(connected_s, 2),
            "process_s": round(process_s, 2),
            "report_wall_time_s": report["wall_time_s"],
            "started_at_unix": report["started_at_unix"],
            "bench_launch_unix": round(started_wall, 3),
            "confirmed_by_watcher": len(report["confirmed_by_watcher"]),
            "pushed": len(report["pushed"]),
            "unreachable": len(report["unreachable"]),
            "not_confirmed": len(report["not_confirmed"]),
            "silent_named": sorted(silent)
            == sorted(
                set(report["pushed"]) | set(report["unreachable"]) | set(report["not_confirmed"])
            ),
            "silent_pushed_ok": all(
                by_node[name].get("confirmed_by") == "push" and by_node[name]["confirmed"]
                for name in silent
            )
            if mode == "fast"
            else None,
            "ack_seen_p50_s": seen[len(seen) // 2] if seen else None,
            "ack_seen_max_s": seen[-1] if seen else None,
            "errors_sample": [
                (entry["node"], entry.get("error"))
                for entry in report["nodes"]
                if entry.get("error")
            ][:3],
            "read_back_wrong": len(wrong),
            "read_back_wrong_sample": wrong[:5],
            "playbook_rc": proc.returncode,
        }
        log(json.dumps(result))
        return result


def render(results, command, started):
    lines = [
        "# Fence fan-out: rollback.yml against simulated nodes",
        "",
        "Date: %s (UTC). Command: `%s`" % (started.strftime("%Y-%m-%d %H:%M:%S"), command),
        "",
        "Host: %s, %d CPUs; load average before %s. One etcd member on loopback; each "
        "simulated node its own pinned maps, fence file, Watcher and watch connection."
        % (os.uname().release, os.cpu_count(), " ".join("%.2f" % v for v in os.getloadavg())),
        "",
        "| mode | nodes | silent | whole process s | report s (process start to last confirmation) "
        "| by watcher | pushed | unreachable | ack seen p50 s | ack seen max s | maps wrong |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            "| %s | %d | %d | %.2f | %.2f | %d | %d | %d | %s | %s | %d |"
            % (r["mode"], r["nodes"], r["silent"], r["process_s"], r["report_wall_time_s"],
               r["confirmed_by_watcher"], r["pushed"], r["unreachable"], r["ack_seen_p50_s"],
               r["ack_seen_max_s"], r["read_back_wrong"])
        )  # fmt: skip
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--modes", default="fast,deep")
    parser.add_argument("--silent-pct", type=float, default=5.0)
    parser.add_argument(
        "--ack-wait-s",
        type=float,
        default=60.0,
        help="how long the count waits (rollback_ack_wait_s, rollback_deep_ack_wait_s): the "
        "simulated nodes share one CPU, so their acknowledgements take seconds to come",
    )
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "results"), help="directory for the result files"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--bpffs", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Thousands of watch connections: this process and etcd need the descriptors.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.worker:
        return worker_main(args)
    if os.geteuid() != 0:
        sys.exit("fence_fanout.py: run as root (bpffs, BPF maps)")
    # A SIGTERM (timeout, a CI job's end) unwinds like an exception, so that every worker,
    # etcd member, mount and file made so far is removed.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    from store.etcd_member import running_etcd

    started = datetime.datetime.now(datetime.timezone.utc)
    command = "bench/fence_fanout.py " + " ".join(argv if argv is not None else sys.argv[1:])
    results = []
    for size in [int(s) for s in args.sizes.split(",")]:
        for mode in args.modes.split(","):
            with running_etcd() as member:
                results.append(run_size(args, size, mode, member.url))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("fence-fanout-%s" % started.strftime("%Y%m%dT%H%M%SZ"))
    stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
    stem.with_suffix(".md").write_text(render(results, command, started))
    sys.stdout.write(render(results, command, started))
    log("written: %s.md, %s.json" % (stem, stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
