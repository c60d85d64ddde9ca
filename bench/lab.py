"""The bench's kernel and process objects: netns, private bpffs, nginx, and their cleanup.

Every object is registered on a contextlib.ExitStack the moment it exists, so
it is removed again when the run ends, fails or is interrupted.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
# scripts/setup links the checkout as ansible_collections/zerolayer/fleet under .collections.
COLLECTIONS_PATH = os.path.join(REPO, ".collections")
if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (  # noqa: E402
    stat_fields,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (  # noqa: E402
    listening_inodes,
)

NAME_PREFIX = "zlb-"
SERVICE_PORT = 8080
ENGINE_PORT = 9001
# Keepalive runs measure steady connections: nginx's default of 1000 requests per
# connection would reopen every connection (a fresh SYN and lookup) many times a second.
KEEPALIVE_REQUESTS = 1000000

_HTTP_COMMON = """
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_timeout 75s;
    keepalive_requests {keepalive_requests};
"""

_MAIN = """
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 4096; }}
http {{
{http}
}}
"""

ENGINE_SERVER = """
    server {{
        listen 127.0.0.1:{port};
        location / {{
            default_type text/plain;
            return 200 "engine\\n";
        }}
    }}
"""

PROXY_SERVER = """
    upstream engine {{
        server 127.0.0.1:{engine_port};
        keepalive 32;
        keepalive_requests {keepalive_requests};
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://engine;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
{proxy_extra}
        }}
    }}
"""


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


def become_child_subreaper():
    """Orphaned nginx workers re-parent to this process, which reaps them (PID 1 may not)."""
    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


def nginx_config(role, prefix, port, proxy_extra=""):
    """nginx.conf text for the engine (static body) or the proxy (proxy_pass to the engine,
    with the directives in proxy_extra added to its location)."""
    values = {
        "prefix": prefix,
        "port": port,
        "engine_port": ENGINE_PORT,
        "keepalive_requests": KEEPALIVE_REQUESTS,
        "proxy_extra": proxy_extra,
    }
    server = {"engine": ENGINE_SERVER, "proxy": PROXY_SERVER}[role]
    http = _HTTP_COMMON.format(**values) + server.format(**values)
    return _MAIN.format(prefix=prefix, http=http)


def mount_private_bpffs(stack, workdir):
    """A bpffs instance of our own (the host has none at /sys/fs/bpf); unmounted at the end."""
    mountpoint = os.path.join(workdir, "bpffs")
    os.mkdir(mountpoint, 0o700)
    run(["mount", "-t", "bpf", "bpf", mountpoint])
    stack.callback(subprocess.run, ["umount", mountpoint], check=False)
    return mountpoint


def process_group_members(pgid):
    """Pids of the live (not zombie) processes in process group pgid."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is None:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.add(int(entry))
    return members


def stop_process(proc):
    """SIGTERM (nginx then reaps its workers), then SIGKILL whatever is left of its group."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
    for pid in process_group_members(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


class Netns:
    """A fresh named network namespace with lo up; removed, with its processes, at the end."""

    def __init__(self, stack, label, workdir, cpus=None):
        self.name = "%s%s-%s" % (NAME_PREFIX, label, uuid.uuid4().hex[:6])
        self.path = "/run/netns/" + self.name
        self.workdir = workdir
        self.cpus = cpus
        self._stack = stack
        run(["ip", "netns", "add", self.name])
        stack.callback(subprocess.run, ["ip", "netns", "del", self.name], check=False)
        run(["ip", "-n", self.name, "link", "set", "lo", "up"])

    def argv(self, argv, cpus=None):
        """argv run inside the netns, optionally pinned to a CPU list with taskset.

        nsenter --net, not `ip netns exec`: that one remounts /sys in a new mount
        namespace, which would hide the pins on our bpffs.
        """
        pinned = ["taskset", "-c", cpus] if cpus else []
        return ["nsenter", "--net=" + self.path, *pinned, *argv]

    def start_nginx(self, role, port, cpus=None):
        """Real nginx (one worker) listening on 127.0.0.1:port; returns its master's Popen."""
        prefix = os.path.join(self.workdir, "%s-%s" % (self.name, role))
        os.makedirs(prefix)
        conf = os.path.join(prefix, "nginx.conf")
        with open(conf, "w") as handle:
            handle.write(nginx_config(role, prefix, port))
        # nsenter and taskset exec, so the pid is nginx's master; its own session keeps a
        # terminal's Ctrl-C away from it, so the teardown below decides how it ends.
        proc = subprocess.Popen(
            self.argv(["nginx", "-p", prefix, "-c", conf], cpus),
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._stack.callback(stop_process, proc)
        deadline = time.monotonic() + 20
        while not listening_inodes(proc.pid, port, "inet"):
            if proc.poll() is not None:
                raise RuntimeError("nginx %s exited: %s" % (role, proc.stderr.read().decode()))
            if time.monotonic() > deadline:
                raise RuntimeError("nginx %s did not listen on port %d" % (role, port))
            time.sleep(0.05)
        return proc


def make_workdir(stack):
    workdir = tempfile.mkdtemp(prefix=NAME_PREFIX)
    stack.callback(subprocess.run, ["rm", "-rf", "--one-file-system", workdir], check=False)
    return workdir


def loadavg():
    with open("/proc/loadavg") as handle:
        return " ".join(handle.read().split()[:3])
