"""One real etcd member on loopback: free ports, a data dir of its own, ended by its
process group, always. Used by the store tests and the data-plane tests of the fence
watcher."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import pytest

ETCD = shutil.which("etcd")


def free_port():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdMember:
    """One etcd process on fixed free ports and a data dir; stop() and start() again keep both
    (a store restart, as a node's watcher sees it). extra_args are etcd flags of the test's
    (a small quota, a token TTL); cluster members are made by etcd_cluster()."""

    def __init__(self, name="zlt", extra_args=()):
        if ETCD is None:
            pytest.fail("etcd is not installed; run scripts/setup (bindep: etcd-server)")
        self.name = name
        self.extra_args = list(extra_args)
        self.data = tempfile.mkdtemp(prefix="zlt-etcd-")
        self.client_port, self.peer_port = free_port(), free_port()
        self.url = "http://127.0.0.1:%d" % self.client_port
        self.peer_url = "http://127.0.0.1:%d" % self.peer_port
        self.initial_cluster = "%s=%s" % (name, self.peer_url)
        self.proc = None
        self.log = None

    def start(self):
        self.launch()
        self.wait_healthy()

    def launch(self):
        """Start the process without waiting: a cluster's members are healthy only together."""
        self.log = open(os.path.join(self.data, "etcd.log"), "a")
        self.proc = subprocess.Popen(
            [
                ETCD,
                "--name", self.name,
                "--data-dir", os.path.join(self.data, "member"),
                "--listen-client-urls", self.url,
                "--advertise-client-urls", self.url,
                "--listen-peer-urls", self.peer_url,
                "--initial-advertise-peer-urls", self.peer_url,
                "--initial-cluster", self.initial_cluster,
                *self.extra_args,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip

    def wait_healthy(self):
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=1) as answer:  # noqa: S310
                    if b"true" in answer.read():
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.log.flush()
                with open(os.path.join(self.data, "etcd.log")) as text:
                    pytest.fail("etcd did not become healthy: %s" % text.read()[-2000:])
            time.sleep(0.2)

    def stop(self):
        """End the member's process group (SIGKILL: a crash, not a clean shutdown)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None
        if self.log is not None:
            self.log.close()
            self.log = None

    def remove(self):
        self.stop()
        shutil.rmtree(self.data, ignore_errors=True)


@contextlib.contextmanager
def running_etcd(extra_args=()):
    """Start etcd, yield the member (its client URL: .url), end it and remove its data."""
    member = EtcdMember(extra_args=extra_args)
    try:
        member.start()
        yield member
    finally:
        member.remove()


@contextlib.contextmanager
def etcd_cluster(size):
    """Start a cluster of `size` members on loopback, yield them, end and remove them all."""
    members = [EtcdMember(name="zlt%d" % index) for index in range(size)]
    initial_cluster = ",".join("%s=%s" % (m.name, m.peer_url) for m in members)
    try:
        for member in members:
            member.initial_cluster = initial_cluster
            member.launch()
        for member in members:
            member.wait_healthy()
        yield members
    finally:
        for member in members:
            member.remove()
