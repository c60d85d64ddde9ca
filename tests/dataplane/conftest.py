"""Fixtures that give data-plane tests real kernel objects and clean all of them up.

Every test gets its own pin dir on a private bpffs (the host has none mounted at
/sys/fs/bpf), and the end-to-end tests get a fresh network namespace with real
nginx processes in it. Teardown runs also when a test fails.
"""

import contextlib
import ctypes
import io
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
COLLECTIONS_PATH = os.path.join(REPO, ".collections")

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (  # noqa: E402
    stat_fields,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle  # noqa: E402
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (  # noqa: E402
    listening_inodes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import PinLayout  # noqa: E402

BPF_DIR = os.path.join(REPO, "files", "bpf")
CLIENT = os.path.join(os.path.dirname(__file__), "http_client.py")
SERVICE_PORT = 8080
ENGINE_PORT = 9001

HERE = os.path.dirname(os.path.abspath(__file__))


# pytest reads `pytestmark` from test modules only, never from a conftest.py: the mark is
# given here to every test collected under this directory.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if os.path.dirname(str(item.path)).startswith(HERE):
            item.add_marker(pytest.mark.dataplane)


def run(argv, **kwargs):
    return subprocess.run(argv, check=True, capture_output=True, text=True, **kwargs)


@pytest.fixture
def etcd():
    """A real etcd member of this test's own (tests may stop and start it), ended always."""
    from store.etcd_member import running_etcd

    with running_etcd() as member:
        yield member


@pytest.fixture(scope="session", autouse=True)
def _require_root():
    if os.geteuid() != 0:
        pytest.fail(
            "data-plane tests load BPF programs and create network namespaces: run them as root"
        )


@pytest.fixture(scope="session")
def router_object():
    """The object `make -C files/bpf` builds."""
    run(["make", "-s", "-C", BPF_DIR])
    return os.path.join(BPF_DIR, "build", "zerolayer_router.bpf.o")


@pytest.fixture(scope="session")
def upgraded_object(tmp_path_factory):
    """A second build of the same source with another stamp: same decisions, another tag."""
    out = str(tmp_path_factory.mktemp("bpf") / "zerolayer_router-2.bpf.o")
    run(["make", "-s", "-C", BPF_DIR, "BUILD_STAMP=2", "OUT=" + out])
    return out


@pytest.fixture(scope="session")
def bpffs():
    """A private bpffs instance on a temp dir, unmounted at the end."""
    mountpoint = tempfile.mkdtemp(prefix="zlt-bpffs-")
    run(["mount", "-t", "bpf", "bpf", mountpoint])
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", mountpoint], check=False)
        os.rmdir(mountpoint)


@contextlib.contextmanager
def pin_layout(bpffs):
    """A fresh pin dir; everything under it is detached and unpinned afterwards."""
    # The node's fence file of this router too, so no test touches the machine's own.
    fence_dir = tempfile.mkdtemp(prefix="zlt-fence-")
    pins = PinLayout(
        os.path.join(bpffs, "zlt-" + uuid.uuid4().hex[:8]),
        fence_file=os.path.join(fence_dir, "fence.json"),
    )
    try:
        yield pins
    finally:
        try:
            if os.path.isdir(pins.pin_dir):
                try:
                    router_lifecycle.remove(pins)
                finally:
                    shutil.rmtree(pins.pin_dir, ignore_errors=True)
        finally:
            shutil.rmtree(fence_dir, ignore_errors=True)


@pytest.fixture
def layout(bpffs):
    """A fresh pin dir for one test (one node's router)."""
    with pin_layout(bpffs) as pins:
        yield pins


@pytest.fixture
def second_layout(bpffs):
    """Another node's pin dir, for tests that compare two routers."""
    with pin_layout(bpffs) as pins:
        yield pins


class Netns:
    """A named network namespace with lo up, and the processes the test starts in it."""

    def __init__(self, workdir):
        self.name = "zlt-" + uuid.uuid4().hex[:8]
        self.path = "/run/netns/" + self.name
        self.workdir = workdir
        self.processes = []

    def enter_argv(self, argv):
        # nsenter, not `ip netns exec`: that one remounts /sys and would hide our bpffs pins.
        return ["nsenter", "--net=" + self.path, *argv]

    def run(self, argv, timeout=120):
        return run(self.enter_argv(argv), timeout=timeout)

    def popen(self, argv, **kwargs):
        # Its own process group: teardown can find and end nginx workers with their master.
        proc = subprocess.Popen(self.enter_argv(argv), start_new_session=True, **kwargs)
        self.processes.append(proc)
        return proc

    def start_nginx(self, port, identity, listen=("127.0.0.1",)):
        """Real nginx answering every request with its identity.

        listen: the nginx listen addresses, each with port appended, e.g. "127.0.0.1",
        "[::1]" or "[::]" with " ipv6only=off" after it for one dual-stack socket.
        """
        # Unique per start: two nginx with one identity (one per family) may run at once.
        prefix = os.path.join(
            self.workdir, "nginx-%s-%d-%s" % (identity, port, uuid.uuid4().hex[:6])
        )
        os.makedirs(prefix, exist_ok=True)
        conf = os.path.join(prefix, "nginx.conf")
        listen_lines = "\n".join(
            "        listen %s:%d %s;" % (host, port, options)
            for host, _space, options in (address.partition(" ") for address in listen)
        )
        with open(conf, "w") as handle:
            handle.write(
                NGINX_CONF.format(
                    prefix=prefix,
                    listen=listen_lines,
                    identity=identity,
                    path="proxy" if identity == "proxy" else "direct",
                )
            )
        proc = self.popen(
            ["nginx", "-p", prefix, "-c", conf], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        family = "inet6" if listen[0].startswith("[") else "inet"
        deadline = time.monotonic() + 20
        while not listening_inodes(proc.pid, port, family):
            if proc.poll() is not None:
                raise RuntimeError("nginx %s exited: %s" % (identity, proc.stderr.read().decode()))
            if time.monotonic() > deadline:
                raise RuntimeError("nginx %s did not listen on %d" % (identity, port))
            time.sleep(0.05)
        return proc

    def stop(self, proc):
        """Stop a process and wait until it and, for nginx, its workers are gone.

        SIGTERM first: the nginx master then ends and reaps its workers itself.
        Whatever is left of the group is killed and reaped here (this process is
        a child subreaper, so orphaned workers become its children).
        """
        group = process_group(proc.pid)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)
        for pid in group | process_group(proc.pid):
            if pid == proc.pid:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass

    def clients(
        self,
        port=SERVICE_PORT,
        count=0,
        source_ports=(),
        host="127.0.0.1",
        source_host=None,
        client_hosts=(),
    ):
        """Run http_client.py in the netns and return its JSON report (source_host: the
        clients' own address, e.g. 127.0.0.2; client_hosts: count connections from each of
        these addresses, reported per address in by_source_host)."""
        argv = [sys.executable, CLIENT, str(port), "--count", str(count), "--host", host]
        if source_host:
            argv += ["--source-host", source_host]
        if client_hosts:
            argv += ["--client-hosts", ",".join(client_hosts)]
        for source_port in source_ports:
            argv += ["--source-port", str(source_port)]
        return json.loads(self.run(argv, timeout=300).stdout)

    def background_clients(self, port=SERVICE_PORT, port_range=None):
        """Start clients that connect until stopped; returns a stop() giving their report.

        port_range (first, last): every connection's source port, taken in turn.
        """
        stop_file = os.path.join(self.workdir, "stop-" + uuid.uuid4().hex[:6])
        argv = [sys.executable, CLIENT, str(port), "--until-file", stop_file]
        if port_range:
            argv += ["--port-range", "%d:%d" % port_range]
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while not os.path.exists(stop_file + ".started"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("background clients did not start: %s" % proc.stderr.read())
            time.sleep(0.02)

        def stop():
            open(stop_file, "w").close()
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            return json.loads(out)

        return stop


NGINX_CONF = """
daemon off;
master_process on;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    keepalive_timeout 0;
    server {{
{listen}
        location / {{
            default_type text/plain;
            add_header X-Served-By {identity};
            # As the legacy_proxy role's nginx says which path answered.
            add_header X-Zerolayer-Path {path};
            return 200 "{identity}\\n";
        }}
    }}
}}
"""


def process_group(pgid):
    """Pids of the live processes in process group pgid."""
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


def become_child_subreaper():
    """Orphans of our children re-parent to us, not to PID 1 (which may never reap them)."""
    pr_set_child_subreaper = 36
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_child_subreaper, 1, 0, 0, 0)


@pytest.fixture
def netns(tmp_path):
    become_child_subreaper()
    ns = Netns(str(tmp_path))
    run(["ip", "netns", "add", ns.name])
    try:
        run(["ip", "-n", ns.name, "link", "set", "lo", "up"])
        yield ns
    finally:
        for proc in reversed(ns.processes):
            ns.stop(proc)
        subprocess.run(["ip", "netns", "del", ns.name], check=False)


@pytest.fixture
def proxy(netns):
    """nginx bound to the service port: the proxy layer."""
    return netns.start_nginx(SERVICE_PORT, "proxy")


@pytest.fixture
def engine(netns):
    """A second nginx on its own port standing in for a model engine's HTTP listener."""
    return netns.start_nginx(ENGINE_PORT, "engine")


# zerolayer-routectl, run in this process


def routectl(layout, *argv, config=None):
    """Run the CLI; return (exit status, parsed JSON from stdout or stderr)."""
    out, err = io.StringIO(), io.StringIO()
    prefix = [
        "--config", config or "/nonexistent/router.json",
        "--pin-dir", layout.pin_dir,
        "--fence-file", layout.fence_file,
    ]  # fmt: skip
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

    status = node_cli.run([*prefix, *argv], stdout=out, stderr=err)
    text = out.getvalue() or err.getvalue()
    assert text.count("\n") == 1, "one JSON line, got %r" % text
    return status, json.loads(text)


def ok(layout, *argv, config=None):
    status, payload = routectl(layout, *argv, config=config)
    assert status == 0, payload
    return payload


@pytest.fixture
def attached(layout, netns, proxy, engine, router_object):
    """Router attached in the netns with route chat on 8080 and the engine in slot 0."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route

    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "chat", SERVICE_PORT, 0)
    registered = ok(
        layout, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
        "--port", str(ENGINE_PORT), "--timeout", "5",
    )  # fmt: skip
    assert registered["changed"] is True and registered["cookie"] > 0
    return layout


def maps_bytes(layout):
    """Every key and value of every pinned map of the router, raw: "nothing changed" proof.

    Per-CPU values are read for every possible CPU; a sockmap reads back socket cookies.
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import opened
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        MAP_SPECS,
        MAP_TYPE_PERCPU_ARRAY,
    )

    snapshot = {}
    for spec in MAP_SPECS:
        path = layout.map(spec.name)
        if not os.path.exists(path):
            continue
        value_size = spec.value_size
        if spec.map_type == MAP_TYPE_PERCPU_ARRAY:
            value_size = (value_size + 7) // 8 * 8 * bpf_syscall.possible_cpus()
        with opened(path) as fd:
            snapshot[spec.name] = [
                (key, bpf_syscall.map_lookup(fd, key, value_size))
                for key in sorted(bpf_syscall.map_keys(fd, spec.key_size))
            ]
    return snapshot


def four_sigma_bounds(count, share):
    """Range a binomial(count, share) draw stays within at 4 standard deviations."""
    mean = count * share
    spread = 4 * (count * share * (1 - share)) ** 0.5
    return mean - spread, mean + spread


def file_bytes(path):
    """The file's bytes; None while it does not exist."""
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


@pytest.fixture
def listeners():
    """Listening TCP sockets of this process (no SO_REUSEPORT: test runs refuse those);
    an IPv6 one takes IPv4 too with v6only=False."""
    socks = []

    def make(address="127.0.0.1", v6only=True):
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        if ":" in address:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        sock.bind((address, 0))
        sock.listen()
        socks.append(sock)
        return sock

    yield make
    for sock in socks:
        sock.close()
