"""Verify zerolayer-store-exporter on the member: its unit, its own read-only identity, and
the series it serves for records, an owner lease and the fence that the collection's own
code writes into the real etcd (TLS, RBAC), through the controller's identity.

Runs after test_rollout_store.py, which leaves keys of other kinds under the prefix (a
bare "7" as the fence, "rollouts/verify"): the exporter counts them as unreadable.
"""

import base64
import json
import os
import pathlib
import re
import shlex
import time

import pytest
import testinfra.utils.ansible_runner

RUNNER = testinfra.utils.ansible_runner.AnsibleRunner(os.environ["MOLECULE_INVENTORY_FILE"])
testinfra_hosts = RUNNER.get_hosts("monitoring")

PKI = pathlib.Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "pki"
MEMBER_PKI = "/etc/etcd/zerolayer"
CONFIG_DIR = "/etc/zerolayer/store-exporter"
LIB_DIR = "/usr/local/lib/zerolayer-store-exporter"
UNIT = "zerolayer-store-exporter.service"
ACCOUNT = "zerolayer-store-exporter"
PORT = 9465
# The controller's identity and a writer script, copied into the member for these checks.
WORK = "/root/zl-verify-exporter"
WAVE = 'rollout_id="verify-rollout",wave="wave_canary"'

# Writes as the runner and the operators do, with the collection's own functions (the node
# artifact the exporter runs): plan a wave and start its first stage, own its scope, raise the
# fence, release the scope, pause the wave. One action per run; prints what it did.
WRITER = """
import datetime, json, sys
sys.path.insert(0, %r)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    runner_identity, store_from_params)

settings, action = json.loads(sys.argv[1]), sys.argv[2]
store = store_from_params(settings)
records = StoreRecords(store, "verify-rollout/wave_canary")
now = datetime.datetime.now(datetime.timezone.utc)
done = {}
if action == "start":
    # The bare "7" an earlier check wrote is no fence; put one the collection reads.
    store.client.put(store.key("fence"), {"epoch": 7, "action": "fast", "reason": "verify"})
    done["fence"] = store.raise_fence("fast", "verify the exporter", "verify@molecule")
    record, _c, _n = rollout.plan(None, "verify-rollout:wave_canary", [{"weight": 5, "hold": 600},
        {"weight": 100, "hold": 0}], None, False, now, "runner@molecule",
        epoch=done["fence"]["epoch"])
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, now, "runner@molecule")
    records.write(record, 0)
    done["owner"] = store.acquire("gpu_nodes", runner_identity("verify-rollout"), 30)
elif action == "release":
    holder = store.owner("gpu_nodes")
    store.release("gpu_nodes", holder["lease"])
    done["released"] = holder["lease"]
elif action == "pause":
    record, token = records.read()
    record, _c = rollout.apply(record, "pause", {"reason": "verify"}, now, "oncall@molecule")
    records.write(record, token)
    done["paused_at"] = now.timestamp()
print(json.dumps(done))
""" % (LIB_DIR + "/zerolayer-node.pyz")


@pytest.fixture(scope="module")
def writer(host, address):
    """Run WRITER's action as the controller; returns its JSON answer."""
    host.check_output("install -d -m 0700 %s", WORK)
    files = {name: (PKI / name).read_bytes() for name in ("controller.pem", "controller-key.pem")}
    files["controller.password"] = (PKI / "controller.password").read_bytes()
    files["writer.py"] = WRITER.encode()
    for name, data in files.items():
        encoded = base64.b64encode(data).decode()
        host.check_output(f"printf %s {encoded} | base64 -d > {WORK}/{name}")
        host.check_output(f"chmod 0600 {WORK}/{name}")
    settings = {
        "endpoints": [f"https://{address}:2379"],
        "ca_file": f"{MEMBER_PKI}/ca.pem",
        "cert_file": f"{WORK}/controller.pem",
        "key_file": f"{WORK}/controller-key.pem",
        "user": "zerolayer-controller",
        "password_file": f"{WORK}/controller.password",
        "prefix": "/zerolayer/",
    }

    def run(action):
        result = host.run(
            shlex.join(["python3", f"{WORK}/writer.py", json.dumps(settings), action])
        )
        assert result.rc == 0, result.stdout + result.stderr
        return json.loads(result.stdout)

    return run


def scrape(host, address):
    """{name{labels}: value} of one GET of the exporter's /metrics."""
    text = host.check_output(f"curl -sS -m 10 http://{address}:{PORT}/metrics")
    found = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})?", name_labels)
            labels = ",".join(sorted(match.group(2).split(","))) if match.group(2) else ""
            found["%s{%s}" % (match.group(1), labels)] = float(value)
    return found


def test_exporter_runs_as_its_own_account_without_capabilities(host):
    service = host.service(UNIT)
    assert service.is_running and service.is_enabled
    shown = host.check_output(
        f"systemctl show -p User -p CapabilityBoundingSet -p NoNewPrivileges {UNIT}"
    )
    properties = dict(line.split("=", 1) for line in shown.splitlines())
    assert properties["User"] == ACCOUNT
    assert properties["CapabilityBoundingSet"] == ""
    assert properties["NoNewPrivileges"] == "yes"
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    assert host.check_output(f"stat -c %U /proc/{pid}") == ACCOUNT
    assert "--store-config" in host.check_output(f"tr '\\0' ' ' < /proc/{pid}/cmdline")


def test_exporter_runs_the_node_artifact_and_exports_its_version(host, address):
    link = host.file(LIB_DIR + "/zerolayer-node.pyz")
    assert link.is_symlink and host.file("/usr/local/sbin/zerolayer-store-exporter").is_symlink
    printed = host.check_output("/usr/local/sbin/zerolayer-store-exporter --version")
    version = printed.rsplit(" ", 1)[1]
    assert link.linked_to == "%s/zerolayer-node-%s.pyz" % (LIB_DIR, version), printed
    assert scrape(host, address)['zerolayer_node_artifact_info{version="%s"}' % version] == 1
    assert not host.file(LIB_DIR + "/ansible_collections").exists


def test_exporter_listens_on_the_member_address(host, address):
    assert host.socket(f"tcp://{address}:{PORT}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{PORT}").is_listening


def test_exporter_credentials_are_its_own_and_only_its_own(host):
    for name, mode in (("exporter-key.pem", 0o640), ("exporter.password", 0o640)):
        secret = host.file(f"{CONFIG_DIR}/{name}")
        assert (secret.user, secret.group, secret.mode) == ("root", ACCOUNT, mode), name
    settings = json.loads(host.file(f"{CONFIG_DIR}/store.json").content_string)
    assert settings["endpoints"] == ["https://127.0.0.1:2379"]
    assert settings["user"] == ACCOUNT
    assert "O = zerolayer" in host.check_output(
        f"openssl x509 -in {settings['cert']} -noout -subject"
    )


def exporter_etcdctl(host, *args):
    settings = json.loads(host.file(f"{CONFIG_DIR}/store.json").content_string)
    password = host.file(settings["password_file"]).content_string.strip()
    command = [
        "env",
        f"ETCDCTL_USER={ACCOUNT}:{password}",
        "ETCDCTL_API=3",
        "ETCDCTL_DIAL_TIMEOUT=5s",
        "ETCDCTL_COMMAND_TIMEOUT=10s",
        "etcdctl",
        "--endpoints=https://127.0.0.1:2379",
        f"--cacert={settings['ca']}",
        f"--cert={settings['cert']}",
        f"--key={settings['key']}",
        *args,
    ]
    return host.run(shlex.join(command))


def test_exporter_user_reads_what_it_exports_and_writes_only_the_events(host):
    for args in (("/zerolayer/fence",), ("--prefix", "/zerolayer/owners/"),
                 ("--prefix", "/zerolayer/rollouts/")):  # fmt: skip
        read = exporter_etcdctl(host, "get", "--keys-only", *args)
        assert read.rc == 0, str(args) + read.stderr
    # rollout_store_exporter_aborts_stuck is false: no fence, no records, no owners written.
    for key in ("/zerolayer/fence", "/zerolayer/rollouts/x", "/zerolayer/owners/x"):
        result = exporter_etcdctl(host, "put", key, "0")
        assert result.rc != 0 and "permission denied" in result.stderr, key
    # A stuck wave's event (the deadline watch) and its deletion (the events' retention).
    key = "/zerolayer/events/verify-watch/w.stuck.x"
    put = exporter_etcdctl(host, "put", key, "{}")
    assert put.rc == 0, key + put.stderr
    assert exporter_etcdctl(host, "del", key).rc == 0
    result = exporter_etcdctl(host, "get", "/elsewhere")
    assert result.rc != 0 and "permission denied" in result.stderr
    unit = host.file("/etc/systemd/system/zerolayer-store-exporter.service").content_string
    assert "--deadline-watch-interval 10" in unit and "--abort-stuck" not in unit


def test_exporter_user_cannot_read_the_notification_sinks(host):
    """Item 8 of issue #28: the sinks' urls and headers are secrets; the exporter's user (on
    every member, behind a port Prometheus scrapes) reads neither them nor the rest of the
    prefix it does not export, and writes no sender's keys."""
    for args in (
        ("get", "/zerolayer/config/notifications"),
        ("get", "--prefix", "/zerolayer/config/"),
        ("get", "--prefix", "--keys-only", "/zerolayer/"),
        ("get", "--prefix", "/zerolayer/acks/"),
        ("get", "/zerolayer/notifications/sender"),
        ("put", "/zerolayer/notifications/cursor/verify", "{}"),
    ):
        result = exporter_etcdctl(host, *args)
        assert result.rc != 0 and "permission denied" in result.stderr, args


def test_exporter_serves_the_store_as_the_collection_writes_it(host, address, writer):
    before = scrape(host, address)
    assert before["zerolayer_rollout_store_up{}"] == 1
    # test_rollout_store.py's keys: a bare fence, rollouts/verify and rollouts/gateway.
    assert before["zerolayer_rollout_store_unreadable_keys{}"] >= 3

    started = writer("start")
    got = scrape(host, address)
    assert got["zerolayer_rollout_store_fence_epoch{}"] == started["fence"]["epoch"] == 8
    assert got['zerolayer_rollout_store_wave_info{outcome="running",%s}' % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_owner_lease_ttl_seconds{%s}" % WAVE] == 30
    assert 0 < got["zerolayer_rollout_store_wave_owner_lease_remaining_seconds{%s}" % WAVE] <= 30
    assert got["zerolayer_rollout_store_wave_fence_epoch{%s}" % WAVE] == 8

    writer("release")
    got = scrape(host, address)
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_owned{%s}" % WAVE] == 0
    assert "zerolayer_rollout_store_wave_owner_lease_remaining_seconds{%s}" % WAVE not in got

    paused = writer("pause")
    got = scrape(host, address)
    assert got['zerolayer_rollout_store_wave_info{outcome="paused",%s}' % WAVE] == 1
    assert got["zerolayer_rollout_store_wave_running{%s}" % WAVE] == 0
    assert got["zerolayer_rollout_store_wave_paused{%s}" % WAVE] == 1
    since = got["zerolayer_rollout_store_wave_paused_since_timestamp_seconds{%s}" % WAVE]
    assert abs(since - paused["paused_at"]) < 1
    assert since <= time.time() + 5


def test_exporter_says_when_it_cannot_read_the_store(host, address):
    """etcd stopped: the exporter still answers, with up 0 and nothing else of the store
    (its own version stays)."""
    host.check_output("systemctl stop etcd")
    try:
        got = scrape(host, address)
    finally:
        host.check_output("systemctl start etcd")
    version = host.check_output("/usr/local/sbin/zerolayer-store-exporter --version").split()[-1]
    assert got == {
        "zerolayer_rollout_store_up{}": 0,
        'zerolayer_node_artifact_info{version="%s"}' % version: 1,
    }
    deadline = time.monotonic() + 60
    while scrape(host, address)["zerolayer_rollout_store_up{}"] != 1:
        assert time.monotonic() < deadline, "the exporter did not read the store again"
        time.sleep(1)
