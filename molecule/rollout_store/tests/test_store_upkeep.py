"""Verify the store's upkeep on the member: etcd runs with its compaction and quota and serves
its metrics for Prometheus, the snapshot and defragmentation timers are scheduled, and one
run of each service does its work: a snapshot that keeps only the newest (the scenario keeps
2) and restores, here on the controller, into a fresh member with the store's keys.
"""

import base64
import contextlib
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import testinfra.utils.ansible_runner

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("monitoring")

REPO = pathlib.Path(os.environ["MOLECULE_PROJECT_DIRECTORY"])
PKI = pathlib.Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "pki"
MEMBER_PKI = "/etc/etcd/zerolayer"
SNAPSHOTS = "/var/backups/zerolayer-rollout-store"
SNAPSHOT_NAME = re.compile(r"^rollout-store-\d{8}T\d{6}Z\.db$")
KEEP = 2  # rollout_store_snapshot_keep of the scenario
QUOTA = 2147483648  # rollout_store_quota_backend_bytes' default
METRICS_PORT = 2381
# The controller's own etcd (bindep: etcd-server, etcd-client) restores the member's snapshot.
ETCDCTL = shutil.which("etcdctl")


def root_etcdctl(host, *args):
    """etcdctl on the member as the role's timers run it: root's certificate."""
    command = [
        "env", "ETCDCTL_API=3", "ETCDCTL_DIAL_TIMEOUT=5s", "ETCDCTL_COMMAND_TIMEOUT=10s",
        "etcdctl", "--endpoints=https://127.0.0.1:2379", f"--cacert={MEMBER_PKI}/ca.pem",
        f"--cert={MEMBER_PKI}/root.pem", f"--key={MEMBER_PKI}/root-key.pem", *args,
    ]  # fmt: skip
    return host.run(shlex.join(command))


def snapshots(host):
    listed = host.check_output(f"ls -1 {SNAPSHOTS}").split()
    return sorted(name for name in listed if SNAPSHOT_NAME.match(name))


def test_etcd_runs_with_periodic_compaction_and_the_quota(host, address):
    pid = host.check_output("systemctl show -p MainPID --value etcd")
    environ = host.check_output(f"tr '\\0' '\\n' < /proc/{pid}/environ").splitlines()
    assert "ETCD_AUTO_COMPACTION_MODE=periodic" in environ
    assert "ETCD_AUTO_COMPACTION_RETENTION=1h" in environ
    assert f"ETCD_QUOTA_BACKEND_BYTES={QUOTA}" in environ
    # etcd took them: the quota it enforces, from its own metrics.
    metrics = host.check_output(f"curl -sS -m 10 http://{address}:{METRICS_PORT}/metrics")
    quota = re.search(r"^etcd_server_quota_backend_bytes (\S+)$", metrics, re.MULTILINE)
    assert quota and float(quota.group(1)) == QUOTA
    assert re.search(r"^etcd_mvcc_db_total_size_in_bytes \d", metrics, re.MULTILINE)


def test_the_metrics_listener_is_on_the_member_address_and_serves_no_keys(host, address):
    assert host.socket(f"tcp://{address}:{METRICS_PORT}").is_listening
    status = host.check_output(
        f"curl -s -o /dev/null -w '%{{http_code}}' -m 10 -X POST -d '{{}}' "
        f"http://{address}:{METRICS_PORT}/v3/kv/range"
    )
    assert status == "404"


@pytest.mark.parametrize("unit", ["zerolayer-store-snapshot", "zerolayer-store-defrag"])
def test_timers_are_enabled_and_scheduled(host, unit):
    timer = host.service(f"{unit}.timer")
    assert timer.is_enabled and timer.is_running
    calendar = host.check_output(f"systemctl show -p TimersCalendar --value {unit}.timer")
    # The only member defragments at rollout_store_defrag_time; snapshots are hourly.
    expected = "*-*-* 03:00:00" if unit.endswith("defrag") else "*-*-* *:00:00"
    assert f"OnCalendar={expected}" in calendar, calendar
    assert host.check_output(f"systemctl show -p NextElapseUSecRealtime --value {unit}.timer")


def test_the_defragmentation_service_defragments_this_member(host):
    result = host.run("systemctl start zerolayer-store-defrag.service")
    assert result.rc == 0, result.stderr
    shown = host.check_output("systemctl show -p Result -p User zerolayer-store-defrag.service")
    assert "Result=success" in shown
    journal = host.check_output("journalctl -u zerolayer-store-defrag.service -n 20 --no-pager")
    assert "Finished defragmenting etcd member[https://127.0.0.1:2379]" in journal


def test_a_snapshot_is_saved_kept_as_configured_and_the_oldest_removed(host):
    directory = host.file(SNAPSHOTS)
    assert (directory.user, directory.group, directory.mode) == ("root", "etcd", 0o750)
    before = snapshots(host)
    made = []
    # The timer stays out of the count meanwhile.
    host.check_output("systemctl stop zerolayer-store-snapshot.timer")
    try:
        for _run in range(KEEP + 1):
            time.sleep(1.1)  # the names are to the second
            result = host.run("systemctl start zerolayer-store-snapshot.service")
            assert result.rc == 0, result.stderr
            made.append(snapshots(host)[-1])
    finally:
        host.check_output("systemctl start zerolayer-store-snapshot.timer")
    assert len(set(made)) == KEEP + 1 and not set(made) & set(before)
    assert snapshots(host) == made[-KEEP:], "the newest kept, the oldest removed"
    for name in snapshots(host):
        snapshot = host.file(f"{SNAPSHOTS}/{name}")
        assert (snapshot.user, snapshot.group, snapshot.mode) == ("etcd", "etcd", 0o600), name
    assert not [name for name in host.check_output(f"ls -1 {SNAPSHOTS}").split() if ".part" in name]


@contextlib.contextmanager
def restored_member(snapshot_bytes):
    """The snapshot restored into a fresh member on the controller, ended by process group
    and removed, always (tests/store/etcd_member.py)."""
    sys.path.insert(0, str(REPO / "tests" / "store"))
    try:
        from etcd_member import EtcdMember
    finally:
        sys.path.pop(0)
    member = EtcdMember(name="zlt-restored")
    with tempfile.TemporaryDirectory(prefix="zlt-mol-snapshot-") as directory:
        path = os.path.join(directory, "rollout-store.db")
        pathlib.Path(path).write_bytes(snapshot_bytes)
        try:
            restore = subprocess.run(
                [
                    ETCDCTL, "snapshot", "restore", path,
                    "--name", member.name, "--data-dir", os.path.join(member.data, "member"),
                    "--initial-cluster", member.initial_cluster,
                    "--initial-advertise-peer-urls", member.peer_url,
                ],
                env={**os.environ, "ETCDCTL_API": "3"},
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert restore.returncode == 0, restore.stderr
            member.start()
            yield member
        finally:
            member.remove()


def test_the_timers_snapshot_restores_into_a_fresh_member(host):
    assert ETCDCTL, "etcdctl is not installed on the controller; run scripts/setup"
    assert root_etcdctl(host, "put", "/zerolayer/verify-snapshot", "before").rc == 0
    assert host.run("systemctl start zerolayer-store-snapshot.service").rc == 0
    assert root_etcdctl(host, "put", "/zerolayer/verify-snapshot", "after").rc == 0
    newest = snapshots(host)[-1]
    # The file is etcd's alone; read it as the member's root for the copy to the controller.
    data = base64.b64decode(host.check_output(f"base64 -w0 {SNAPSHOTS}/{newest}"))
    password = (PKI / "controller.password").read_text().strip()
    with restored_member(data) as member:
        # The snapshot holds the users too: the controller's password works on the copy.
        got = subprocess.run(
            [ETCDCTL, "--endpoints", member.url, "--user", f"zerolayer-controller:{password}",
             "get", "/zerolayer/verify-snapshot", "--print-value-only"],
            env={**os.environ, "ETCDCTL_API": "3"},
            capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == "before"


def test_the_exporter_prunes_events_with_the_retention(host):
    pid = host.check_output("systemctl show -p MainPID --value zerolayer-store-exporter")
    command = host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")
    assert "--events-retention-days 30" in command
