"""The store's upkeep against real etcd members: a snapshot saved with etcdctl restores into a
fresh member with every key; with the periodic compaction the rollout_store role configures,
a small quota keeps taking writes that fill it without; defragmentation gives the space
back; the runbook's way out of NOSPACE works; and etcd's metrics listener serves what the
quota alert reads, and no keys.

Each test starts the members it needs, ended by process group and removed, always.
"""

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter

from .etcd_member import EtcdMember, free_port, running_etcd

ETCDCTL = shutil.which("etcdctl")
QUOTA = 4 << 20
VALUE = os.urandom(100_000)
# The role's setting is an hour (rollout_store_auto_compaction_retention); a second here, so
# that compaction runs while the test writes.
COMPACTION = ["--auto-compaction-mode", "periodic", "--auto-compaction-retention", "1s"]


def etcdctl(url, *args, timeout=60):
    if ETCDCTL is None:
        pytest.fail("etcdctl is not installed; run scripts/setup (bindep: etcd-client)")
    result = subprocess.run(
        [ETCDCTL, "--endpoints", url, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={**os.environ, "ETCDCTL_API": "3", "LANG": "C"},
    )
    assert result.returncode == 0, "etcdctl %s: %s%s" % (args, result.stdout, result.stderr)
    return result.stdout


def status(url):
    """(database size, of it in use, revision) of the member at url."""
    (entry,) = json.loads(etcdctl(url, "endpoint", "status", "-w", "json"))
    return (
        entry["Status"]["dbSize"],
        entry["Status"]["dbSizeInUse"],
        entry["Status"]["header"]["revision"],
    )


def alarms(url):
    """The alarms raised, as `etcdctl alarm list` names them (memberID:N alarm:NOSPACE)."""
    return re.findall(r"\balarm:(\w+)", etcdctl(url, "alarm", "list"))


def overwrite(client, times, pause_s=0.0):
    """Put a 100 kB value at one key `times` times: every put adds a revision of history.
    Returns the put that was refused first (its index and error), or None."""
    for index in range(times):
        try:
            client.put("/zlt-quota/blob", VALUE)
        except FleetError as exc:
            return index, exc.message
        time.sleep(pause_s)
    return None


@contextlib.contextmanager
def restored_member(snapshot):
    """A fresh member on free ports whose data is the snapshot, as the runbook restores one:
    etcdctl snapshot restore into a new data directory, then the member starts on it."""
    member = EtcdMember(name="zlt-restored")
    try:
        etcdctl(
            "http://127.0.0.1:1",  # restore reads only the file; etcdctl wants an endpoint
            "snapshot", "restore", snapshot,
            "--name", member.name,
            "--data-dir", os.path.join(member.data, "member"),
            "--initial-cluster", member.initial_cluster,
            "--initial-advertise-peer-urls", member.peer_url,
            "--initial-cluster-token", "zlt-restored",
        )  # fmt: skip
        member.start()
        yield member
    finally:
        member.remove()


def test_a_snapshot_restores_into_a_fresh_member(store, etcd_url):
    store.client.put(store.key("fence"), json.dumps({"epoch": 7, "action": "fast"}))
    store.client.put(store.key("rollouts", "chat-a", "wave_canary"), "record")
    store.client.put(store.key("events", "chat-a", "~1.x"), "event")
    store.client.delete(store.key("rollouts", "chat-a", "wave_canary"))
    _size, _in_use, revision = status(etcd_url)
    with tempfile.TemporaryDirectory(prefix="zlt-snapshot-") as directory:
        snapshot = os.path.join(directory, "rollout-store.db")
        etcdctl(etcd_url, "snapshot", "save", snapshot)
        # What the snapshot timer checks after each save: the file is whole (its hash).
        assert (
            json.loads(etcdctl(etcd_url, "snapshot", "status", snapshot, "-w", "json"))["revision"]
            >= revision
        )
        with restored_member(snapshot) as member:
            restored = RolloutStore(EtcdClient(member.url, timeout=3), store.prefix)
            fence = restored.client.get(restored.key("fence"))
            assert fence.json() == {"epoch": 7, "action": "fast"}
            assert restored.fence()["epoch"] == 7
            assert restored.client.get(restored.key("events", "chat-a", "~1.x")).value == b"event"
            assert restored.client.get(restored.key("rollouts", "chat-a", "wave_canary")) is None
            # The revisions go on from the snapshot's, so a record's compare-and-swap token
            # read before the loss still means what it meant.
            assert status(member.url)[2] >= revision
            # A member of its own: it takes writes, and the old member is not its peer.
            restored.client.put(restored.key("after-restore"), "yes")
            assert store.client.get(store.key("after-restore")) is None


def test_without_compaction_a_small_quota_fills_and_refuses_every_write():
    with running_etcd(["--quota-backend-bytes", str(QUOTA)]) as member:
        client = EtcdClient(member.url, timeout=3)
        refused = overwrite(client, 80)
        assert refused is not None, "80 puts of 100 kB of history must exceed a 4 MiB quota"
        assert "database space exceeded" in refused[1]
        assert "NOSPACE" in alarms(member.url)
        # What the store's exporter reads for ZerolayerRolloutStoreNoSpace, through the gateway.
        exported = store_exporter.collect(RolloutStore(client, "/zlt-quota/"))
        assert exported["up"] is True
        assert exported["alarms"] == {"NOSPACE": 1, "CORRUPT": 0}


def test_with_periodic_compaction_the_same_writes_fit_and_defrag_gives_space_back():
    with running_etcd(["--quota-backend-bytes", str(QUOTA), *COMPACTION]) as member:
        client = EtcdClient(member.url, timeout=3)
        # Twice the quota in history, written over 8 s: compaction keeps only the last second.
        assert overwrite(client, 80, pause_s=0.1) is None
        assert "NOSPACE" not in alarms(member.url)
        size, in_use, _revision = status(member.url)
        etcdctl(member.url, "defrag")
        after, _in_use, _revision = status(member.url)
        assert after < size, "defrag gave nothing back (%d bytes, %d in use)" % (size, in_use)
        assert after <= in_use + (256 << 10)


def test_the_runbooks_way_out_of_nospace():
    """docs/runbook.md#rollout-store-no-space: compact, defragment, disarm; writes again."""
    with running_etcd(["--quota-backend-bytes", str(QUOTA)]) as member:
        client = EtcdClient(member.url, timeout=3)
        assert overwrite(client, 80) is not None
        assert "NOSPACE" in alarms(member.url)
        _size, _in_use, revision = status(member.url)
        etcdctl(member.url, "compact", str(revision))
        etcdctl(member.url, "defrag")
        # Still refused: the alarm outlives the space it was raised for.
        with pytest.raises(FleetError, match="database space exceeded"):
            client.put("/zlt-quota/after", "x")
        etcdctl(member.url, "alarm", "disarm")
        assert "NOSPACE" not in alarms(member.url)
        exported = store_exporter.collect(RolloutStore(client, "/zlt-quota/"))
        assert exported["alarms"] == {"NOSPACE": 0, "CORRUPT": 0}
        client.put("/zlt-quota/after", "x")
        assert client.get("/zlt-quota/after").value == b"x"


def test_the_metrics_listener_serves_the_quota_alerts_series_and_no_keys():
    """--listen-metrics-urls, as rollout_store_metrics_port sets it: what
    ZerolayerRolloutStoreNearQuota reads (tests/monitoring/promql_names.py names them)."""
    metrics = "http://127.0.0.1:%d" % free_port()
    with running_etcd(["--quota-backend-bytes", str(QUOTA), "--listen-metrics-urls", metrics]):
        with urllib.request.urlopen(metrics + "/metrics", timeout=5) as answer:  # noqa: S310
            text = answer.read().decode()
        # Only ever http://127.0.0.1:<port> of the member this test started.
        request = urllib.request.Request(metrics + "/v3/kv/range", b'{"key": "Lw=="}')  # noqa: S310
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, timeout=5)  # noqa: S310
    assert refused.value.code == 404, "the metrics listener must serve no keys"
    samples = dict(
        line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert float(samples["etcd_server_quota_backend_bytes"]) == QUOTA
    assert 0 < float(samples["etcd_mvcc_db_total_size_in_bytes"]) < QUOTA
