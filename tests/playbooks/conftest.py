"""The sandbox fleets for the playbook tests: each up once, shared by the test modules of its
xdist group (they run on one worker, in file order), always torn down.

Modules marked `xdist_group("sandbox-fleet")` use the default fleet (inventories/sandbox).
With ZEROLAYER_TEST_FLEETS=2 (tests/playbooks/fleet_groups.py), those marked
`xdist_group("sandbox-second-fleet")` get a second one beside it, in another worker
(`ZEROLAYER_SANDBOX_FLEET=second`, its own network, subnet, etcd PKI and a copy of the
inventory that selects its label). Without xdist every module shares the default fleet.

`scripts/sandbox up N` starts the nodes, `playbooks/site.yml` provisions them, and every
test drives `ansible-playbook` against them from this checkout. The fixture's finalizer
runs `scripts/sandbox down` whatever happened, and stops any load client still running.

Processes are ended only when this code started them: a playbook run is ended with every
process descended from it (Ansible's workers leave its process group, so a signal to the
group would miss them), found through their parent pids, never by matching command lines.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (
    stat_fields,
)
from fleet_groups import DEFAULT_FLEET
from sandbox_inventory import named_fleet_inventory

REPO = Path(__file__).resolve().parents[2]
SANDBOX = REPO / "scripts" / "sandbox"
LOAD_CLIENT = REPO / "files" / "load" / "zerolayer_load.py"
DRILL_VARS = Path(__file__).resolve().parent / "drill_vars.yml"
# xdist group -> (fleet name, subnet prefix); the first is the one inventories/sandbox finds.
DEFAULT_GROUP = DEFAULT_FLEET
FLEETS = {
    DEFAULT_GROUP: ("fleet", None),
    "sandbox-second-fleet": ("second", "10.89.214"),
}
# GPU nodes of the test fleet: two are the fewest that have both waves (wave_canary,
# wave_rest) and a peer to take a drained node's clients; every case here holds at two. On
# the 2-core CI machine all nodes' Ansible work shares the cores, so a third node costs
# minutes of every run; ZEROLAYER_PLAYBOOK_NODES=3 runs them on three (`make run`'s fleet).
NODE_COUNT = int(os.environ.get("ZEROLAYER_PLAYBOOK_NODES", "2"))
INVENTORY = os.environ.get("ZEROLAYER_PLAYBOOK_INVENTORY", str(REPO / "inventories" / "sandbox"))
SITE = os.environ.get("ZEROLAYER_PLAYBOOK_SITE", str(REPO / "playbooks" / "site.yml"))
# Set to reuse a fleet someone already started and provisioned (it is then left running).
REUSE = os.environ.get("ZEROLAYER_PLAYBOOK_REUSE_FLEET") == "1"
# A folder (it must exist) that keeps the output of every playbook run a test waits for,
# with each task's time (ansible.posix.profile_tasks): where a slow test spends its minutes.
PLAYBOOK_LOGS = os.environ.get("ZEROLAYER_PLAYBOOK_LOGS", "")


def podman(env, *argv, check=True):
    return subprocess.run(
        ["podman", *argv], env=env, check=check, capture_output=True, text=True, timeout=120
    )


def children_by_parent():
    """{ppid: [pid, ...]} of the live processes on the machine."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = stat_fields(int(entry))
        if fields is None:
            continue
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid):
    """Pids of every live process below pid."""
    children = children_by_parent()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def signal_quietly(pid, signum):
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def kill_tree(process):
    """SIGKILL a process this code started and everything descended from it.

    The tree is frozen first (SIGSTOP, repeated until no new descendant appears), so no
    process forks or is re-parented between finding it and killing it.
    """
    if process.poll() is not None and not descendants(process.pid):
        return
    frozen = {process.pid}
    signal_quietly(process.pid, signal.SIGSTOP)
    while True:
        found = set(descendants(process.pid)) - frozen
        if not found:
            break
        for pid in found:
            signal_quietly(pid, signal.SIGSTOP)
        frozen |= found
    for pid in frozen:
        signal_quietly(pid, signal.SIGKILL)
    process.wait(timeout=60)


class Fleet:
    """The provisioned sandbox fleet and the commands the tests need on it."""

    def __init__(self, env, workdir, name="fleet", inventory_path=INVENTORY):
        self.env = env
        self.workdir = workdir
        self.name = name
        self.inventory_path = str(inventory_path)
        self.network = "zerolayer-sandbox" if name == "fleet" else "zerolayer-sandbox-%s" % name
        # inventories/sandbox/group_vars/all.yml: each fleet has its own store PKI.
        self.pki_dir = REPO / ".cache" / ("pki-%s" % name)
        inventory = json.loads(
            subprocess.run(
                ["ansible-inventory", "-i", self.inventory_path, "--list"],
                env=env,
                check=True,
                capture_output=True,
                text=True,
                cwd=REPO,
            ).stdout
        )
        self.inventory = inventory
        self.nodes = sorted(inventory["gpu_nodes"]["hosts"])
        self.node_vars = inventory["_meta"]["hostvars"]
        first = self.node_vars[self.nodes[0]]
        self.route = first["ebpf_router_routes"][0]
        self.engine = first["model_engine_services"][0]
        self.api_key = first["zerolayer_api_keys"][0]
        monitoring = inventory.get("monitoring", {}).get("hosts", [])
        self.monitoring = monitoring[0] if monitoring else None
        self.prometheus_url = os.environ.get("ZEROLAYER_PROMETHEUS_URL") or (
            "http://%s:9090" % self.address(self.monitoring)
        )
        self.key_file = workdir / "api-key"
        self.key_file.write_text(self.api_key + "\n")
        self.key_file.chmod(0o600)
        # Playbook runs started with background=True, ended by the test or at its end.
        self.background = []
        # What a module changed on the fleet and owes it back (restore_before_next_use).
        self.owed_restores = []

    def restore_before_next_use(self, what, restore):
        """Owe the fleet restore() (a playbook run that puts back what a module changed),
        run when the next module takes the fleet, before its first test. The run's last
        module then restores nothing on a fleet that only goes down after it; its restore
        still runs, and fails that module's setup if it fails, whenever a module follows."""
        self.owed_restores.append((what, restore))

    def pay_owed_restores(self):
        while self.owed_restores:
            what, restore = self.owed_restores.pop(0)
            started = time.monotonic()
            restore()
            print("fleet %s: %s restored in %.0f s" % (self.name, what, time.monotonic() - started))

    def address(self, node):
        return podman(
            self.env,
            "inspect",
            "--format",
            '{{(index .NetworkSettings.Networks "%s").IPAddress}}' % self.network,
            node,
        ).stdout.strip()

    def exec(self, node, *argv, check=True):
        return podman(self.env, "exec", node, *argv, check=check)

    def show(self, node):
        """Router state, routes, slots and counters, read on the node with zerolayer-routectl."""
        return json.loads(self.exec(node, "/usr/local/sbin/zerolayer-routectl", "show").stdout)

    def service_headers(self, node):
        """Response headers of an authenticated request to the node's service port, made on
        the node itself (a new connection, so the router decides its path)."""
        return self.exec(
            node,
            "curl",
            "-sS",
            "-o",
            "/dev/null",
            "-D",
            "-",
            "-H",
            "Authorization: Bearer %s" % self.api_key,
            "http://127.0.0.1:%d/v1/models" % self.route["port"],
        ).stdout

    def routes(self, node):
        """{route: (weight_bp, generation)} read on the node with zerolayer-routectl."""
        return {r["name"]: (r["weight_bp"], r["generation"]) for r in self.show(node)["routes"]}

    def weights(self):
        return {node: self.routes(node) for node in self.nodes}

    def fence_epoch(self, node):
        return self.show(node)["fence"]["epoch"]

    def set_weight(self, percent, check=True):
        """A person on each node setting the weight under the node's current fence epoch
        (after a rollback a write without it is refused, as it should be)."""
        for node in self.nodes:
            self.exec(
                node,
                "/usr/local/sbin/zerolayer-routectl",
                "set-weight",
                "--route",
                self.route["name"],
                "--weight",
                str(percent),
                "--epoch",
                str(self.fence_epoch(node)),
                check=check,
            )

    def node_record(self, node):
        result = self.exec(node, "cat", "/var/lib/zerolayer/rollout.json", check=False)
        return json.loads(result.stdout) if result.returncode == 0 else None

    def admin_file(self):
        return "/etc/zerolayer/engines/%s/sim-admin.json" % self.engine["name"]

    def set_error_rate(self, rate, nodes=None):
        """The simulator re-reads its admin file on the next request (roles/model_engine)."""
        settings = {"error_rate": rate, "error_status": 503}
        for node in self.nodes if nodes is None else nodes:
            self.exec(
                node,
                "python3",
                "-c",
                "import json,sys; p=sys.argv[1]; d=json.load(open(p));"
                " d.update(json.loads(sys.argv[2])); open(p,'w').write(json.dumps(d))",
                self.admin_file(),
                json.dumps(settings),
            )

    def engine_upgrade(self, engine, to, *extra, inventories=(), report=None):
        """Run playbooks/engine_upgrade.yml from engine to the entry `to`."""
        argv = [
            "-e",
            "engine_upgrade_engine=%s" % engine,
            "-e",
            json.dumps({"engine_upgrade_to": to}),
            "-e",
            "canary_prometheus_url=%s" % self.prometheus_url,
        ]
        if report is not None:
            argv += ["-e", "engine_upgrade_report_path=%s" % report]
        return self.playbook(
            "engine_upgrade.yml", *argv, *extra, inventories=inventories, timeout=1200
        )

    def playbook(self, name, *extra, inventories=(), timeout=900, background=False):
        argv = ["ansible-playbook", "-i", self.inventory_path]
        for inventory in inventories:
            argv += ["-i", str(inventory)]
        argv += [str(REPO / "playbooks" / name), *extra]
        env = dict(self.env)
        env["ANSIBLE_CALLBACKS_ENABLED"] = "zerolayer.fleet.zerolayer_progress"
        if PLAYBOOK_LOGS:
            env["ANSIBLE_CALLBACKS_ENABLED"] += ",ansible.posix.profile_tasks"
            env["PROFILE_TASKS_TASK_OUTPUT_LIMIT"] = "60"
        if background:
            log_path = self.workdir / ("%s-%d.log" % (name, time.time_ns()))
            with open(log_path, "w") as log:
                process = subprocess.Popen(
                    argv,
                    env=env,
                    cwd=REPO,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            # Read by a test that fails, to show what the background run printed.
            process.log_path = log_path
            self.background.append(process)
            return process
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            # The progress lines go to stderr; the tests read them with the rest.
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        try:
            stdout = process.communicate(timeout=timeout)[0]
        except subprocess.TimeoutExpired:
            kill_tree(process)
            stdout = process.communicate()[0]
            raise AssertionError(
                "ansible-playbook %s ran past %d s and was ended:\n%s"
                % (name, timeout, stdout[-6000:])
            ) from None
        if PLAYBOOK_LOGS:
            kept = Path(PLAYBOOK_LOGS) / ("%s-%d.log" % (Path(name).name, time.time_ns()))
            kept.write_text(" ".join(argv) + "\n" + stdout)
        return subprocess.CompletedProcess(argv, process.returncode, stdout)

    def kill_run(self, process):
        """SIGKILL a background run and every process it started, as when its host dies.
        Its process group alone is not enough: ansible-core's workers run in sessions of
        their own, and would be left behind."""
        kill_tree(process)
        self.background.remove(process)

    def end_background_runs(self):
        """Kill what is left of every background playbook run (a test that failed half-way)."""
        while self.background:
            kill_tree(self.background.pop())

    def canary(self, rollout_id, record_dir, *extra, **kwargs):
        return self.playbook(
            "canary.yml",
            "-e",
            "@%s" % DRILL_VARS,
            "-e",
            "canary_prometheus_url=%s" % self.prometheus_url,
            "-e",
            "canary_record_dir=%s" % record_dir,
            "-e",
            "canary_rollout_id=%s" % rollout_id,
            *extra,
            **kwargs,
        )


class Load:
    """zerolayer_load.py on the controller against every node's service port."""

    def __init__(self, fleet, name, nodes=None, rate=60):
        self.summary = fleet.workdir / ("load-%s.json" % name)
        self.stop_file = fleet.workdir / ("load-%s.stop" % name)
        argv = [
            "python3",
            str(LOAD_CLIENT),
            "--api-key-file",
            str(fleet.key_file),
            "--model",
            fleet.engine["model"],
            "--concurrency",
            "4",
            "--rate",
            str(rate),
            "--stream-percent",
            "10",
            "--duration",
            "1800",
            "--stop-file",
            str(self.stop_file),
            "--summary",
            str(self.summary),
        ]
        for node in fleet.nodes if nodes is None else nodes:
            argv += ["--target", "%s:%d" % (fleet.address(node), fleet.route["port"])]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.wait_for(lambda summary: True, "its first summary")

    def snapshot(self):
        """The summary the client last wrote (it rewrites it every second), or None."""
        try:
            return json.loads(self.summary.read_text())
        except FileNotFoundError:
            return None

    def wait_for(self, predicate, what, timeout=120):
        """Poll the running client's summary until predicate(summary) holds; return it."""
        deadline = time.monotonic() + timeout
        while True:
            summary = self.snapshot()
            if summary is not None and predicate(summary):
                return summary
            if self.process.poll() is not None:
                raise AssertionError(
                    "the load client exited (rc %s) before %s: %s"
                    % (
                        self.process.returncode,
                        what,
                        self.process.stderr.read().decode(errors="replace")[-2000:],
                    )
                )
            if time.monotonic() > deadline:
                raise AssertionError("load client: no %s after %d s" % (what, timeout))
            time.sleep(0.5)

    def wait_for_more(self, requests, what="more requests"):
        """Wait until `requests` more requests succeeded than in the summary of now."""
        start = (self.snapshot() or {}).get("requests_ok", 0)
        return self.wait_for(lambda s: s["requests_ok"] >= start + requests, what)

    def stop(self):
        """Stop sending, let requests in flight finish, return the final summary."""
        if self.process.poll() is None:
            self.stop_file.touch()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return json.loads(self.summary.read_text())


class Fleets:
    """The fleets this worker started, each brought up and provisioned on first use."""

    def __init__(self, env):
        self.env = env
        self.started = {}
        self.names = []
        self.workdirs = []

    def get(self, group):
        name, subnet = FLEETS[group]
        if name in self.started:
            self.started[name].pay_owed_restores()
            return self.started[name]
        workdir = Path(tempfile.mkdtemp(prefix="zl-playbooks-%s-" % name))
        self.workdirs.append(workdir)
        env = dict(self.env)
        # The store's play writes the controller's settings for `zerolayer` under
        # $XDG_CONFIG_HOME: the fleet's own, gone with its workdir, never the user's.
        env["XDG_CONFIG_HOME"] = str(workdir / "config")
        inventory = INVENTORY
        if name != "fleet":
            env.update(ZEROLAYER_SANDBOX_FLEET=name, ZEROLAYER_SANDBOX_SUBNET_PREFIX=subnet)
            inventory = named_fleet_inventory(name, workdir / "inventory", INVENTORY)
        # Noted before it is up, so that the finalizer also removes a fleet half started.
        if name not in self.names:
            self.names.append(name)
        if not REUSE:
            subprocess.run([str(SANDBOX), "up", str(NODE_COUNT)], env=env, check=True, timeout=900)
            started = time.monotonic()
            provisioned = subprocess.run(
                ["ansible-playbook", "-i", str(inventory), SITE],
                env=env,
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=2400,
                check=False,
            )
            assert provisioned.returncode == 0, provisioned.stdout[-4000:]
            print("fleet %s provisioned in %.0f s" % (name, time.monotonic() - started))
        self.started[name] = Fleet(env, workdir, name, inventory)
        return self.started[name]

    def down(self):
        # A fleet someone else started stays up: it gets back what the modules changed.
        if REUSE:
            for fleet in self.started.values():
                fleet.pay_owed_restores()
        for name in self.names:
            if not REUSE:
                env = dict(self.env, ZEROLAYER_SANDBOX_FLEET=name)
                subprocess.run([str(SANDBOX), "down"], env=env, check=False, timeout=300)
        for workdir in self.workdirs:
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="session")
def fleets(ansible_env):
    if shutil.which("podman") is None:
        pytest.fail("podman is needed for the sandbox fleet")
    started = Fleets(ansible_env)
    try:
        yield started
    finally:
        started.down()


@pytest.fixture(scope="module")
def fleet(request, fleets):
    """The fleet of this module's xdist group; the default one without xdist (one process
    gains nothing from a second fleet) or when reusing a fleet someone started."""
    marker = request.node.get_closest_marker("xdist_group")
    group = marker.args[0] if marker else DEFAULT_GROUP
    if REUSE or "PYTEST_XDIST_WORKER" not in os.environ:
        group = DEFAULT_GROUP
    return fleets.get(group)


@pytest.fixture
def load(fleet):
    """A load client per test; stopped at the end of the test whatever happens."""
    started = []

    def start(name, nodes=None, **options):
        client = Load(fleet, name, nodes, **options)
        started.append(client)
        return client

    yield start
    for client in started:
        if client.process.poll() is None:
            client.process.send_signal(signal.SIGTERM)
            try:
                client.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                client.process.kill()
                client.process.wait()


@pytest.fixture(autouse=True)
def background_runs_ended(request):
    """A test that fails half-way leaves no playbook run of its own behind."""
    yield
    if "fleet" in request.fixturenames:
        request.getfixturevalue("fleet").end_background_runs()


@pytest.fixture
def records(tmp_path):
    """A fresh controller record directory per test."""
    return tmp_path / "rollouts"


@pytest.fixture
def baseline(fleet):
    """Every route at weight 0 before the test and after it."""
    fleet.set_weight(0)
    yield
    # The deep rollback test removes the router: nothing to reset there.
    fleet.set_weight(0, check=False)
