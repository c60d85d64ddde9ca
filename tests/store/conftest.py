"""A real etcd member on loopback for the rollout store's tests: started once per worker on
free ports with a data dir of its own, ended by its process group, always."""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import pytest

COLLECTIONS_PATH = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
)
if COLLECTIONS_PATH not in sys.path:
    sys.path.insert(0, COLLECTIONS_PATH)

from ansible_collections.zerolayer.fleet.plugins.module_utils.etcd_v3 import (  # noqa: E402
    EtcdClient,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout_store import (  # noqa: E402
    RolloutStore,
)

ETCD = shutil.which("etcd")


def free_port():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def etcd_url():
    if ETCD is None:
        pytest.fail("etcd is not installed; run scripts/setup (bindep: etcd-server)")
    data = tempfile.mkdtemp(prefix="zlt-etcd-")
    client, peer = free_port(), free_port()
    url = "http://127.0.0.1:%d" % client
    log = open(os.path.join(data, "etcd.log"), "w")
    proc = subprocess.Popen(
        [
            ETCD,
            "--name", "zlt",
            "--data-dir", os.path.join(data, "member"),
            "--listen-client-urls", url,
            "--advertise-client-urls", url,
            "--listen-peer-urls", "http://127.0.0.1:%d" % peer,
            "--initial-advertise-peer-urls", "http://127.0.0.1:%d" % peer,
            "--initial-cluster", "zlt=http://127.0.0.1:%d" % peer,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as answer:  # noqa: S310
                    if b"true" in answer.read():
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.flush()
                with open(os.path.join(data, "etcd.log")) as text:
                    pytest.fail("etcd did not become healthy: %s" % text.read()[-2000:])
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture
def store(etcd_url, request):
    """A RolloutStore under a prefix of this test's own, so tests never see each other."""
    prefix = "/zlt-%s-%d/" % (
        request.node.name[:40].replace("[", "-").replace("]", ""),
        os.getpid(),
    )
    return RolloutStore(EtcdClient(etcd_url, timeout=3), prefix)
