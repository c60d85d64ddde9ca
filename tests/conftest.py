"""Settings shared by every test: where the checkout and its tools are."""

import os
import pathlib
import shutil
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"
# The collection as the tests import it (ansible_collections.zerolayer.fleet), whichever test
# folder runs first or alone.
if str(REPO / ".collections") not in sys.path:
    sys.path.insert(0, str(REPO / ".collections"))


def find_tool(name: str) -> str:
    """Path of a command from the project's venv, else from PATH."""
    candidate = VENV_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run scripts/setup")
    return found


@pytest.fixture(scope="session")
def tool():
    """find_tool as a fixture: tool("molecule") is the venv's molecule."""
    return find_tool


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def ansible_env() -> dict:
    """Environment for ansible-* commands run from the checkout."""
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["CONTAINERS_CONF"] = str(REPO / "tests" / "sandbox" / "containers.conf")
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.setdefault("LANG", "C.UTF-8")
    return env


# kernel.* and vm.* are shared by every network namespace and container on the machine:
# no test may change them. These keys move by themselves while the machine runs.
SELF_CHANGING_KERNEL_KEYS = (
    "kernel/ns_last_pid",
    "kernel/random/",
    "kernel/pty/nr",
    "kernel/perf_event_max_sample_rate",
)


def host_kernel_settings() -> dict:
    settings = {}
    for top in ("/proc/sys/kernel", "/proc/sys/vm"):
        for directory, _, files in os.walk(top):
            for name in files:
                path = os.path.join(directory, name)
                key = path[len("/proc/sys/") :]
                if key.startswith(SELF_CHANGING_KERNEL_KEYS):
                    continue
                try:
                    with open(path, encoding="utf-8") as handle:
                        settings[key] = handle.read().strip()
                except OSError:
                    continue
    return settings


@pytest.fixture(scope="session", autouse=True)
def host_kernel_settings_unchanged():
    """Fails the run if anything it started changed a host-global kernel setting."""
    before = host_kernel_settings()
    yield
    after = host_kernel_settings()
    changed = {k: (v, after.get(k)) for k, v in before.items() if after.get(k) != v}
    if changed:
        pytest.fail(f"host kernel settings changed during the tests (before, after): {changed}")


# Where the collection keeps node state (the fence file, rollout records): tests run on the
# controller, which must never gain such state from them.
HOST_STATE_DIRS = ("/var/lib/zerolayer", "/run/zerolayer", "/sys/fs/bpf/zerolayer")
HOST_STATE_BEFORE = pytest.StashKey[set]()


def host_state_files() -> set:
    found = set()
    for top in HOST_STATE_DIRS:
        for directory, _, files in os.walk(top):
            found.update(os.path.join(directory, name) for name in files)
    return found


# The fixtures that start a real etcd member (tests/store/conftest.py, tests/dataplane's).
ETCD_FIXTURES = {"etcd_member", "etcd"}
# What these need is root (the kernel's BPF, network namespaces, podman's containers).
ROOT_MARKERS = ("dataplane", "sandbox", "molecule")


def pytest_collection_modifyitems(items):
    """Every test that starts etcd says so with the `etcd` marker, whichever folder it is in:
    through a fixture, or by starting members of its own (tests/store/etcd_member.py; every
    test of a module that imports running_etcd or etcd_cluster is marked). Every test marked
    dataplane, sandbox or molecule is marked root too (tests/dataplane's hook runs first,
    and -m selects after both)."""
    for item in items:
        if any(item.get_closest_marker(name) for name in ROOT_MARKERS):
            item.add_marker(pytest.mark.root)
        module = getattr(item, "module", None)
        starts_its_own = any(hasattr(module, name) for name in ("running_etcd", "etcd_cluster"))
        if ETCD_FIXTURES & set(getattr(item, "fixturenames", ())) or starts_its_own:
            item.add_marker(pytest.mark.etcd)


def pytest_sessionstart(session):
    session.config.stash[HOST_STATE_BEFORE] = host_state_files()


def pytest_sessionfinish(session, exitstatus):
    """Fails the run if a test left node state on this machine (tests keep theirs in temp
    directories and throw-away nodes). Judged once all tests ended: in the xdist controller,
    or in the one pytest process without xdist."""
    if hasattr(session.config, "workerinput"):
        return
    left = sorted(host_state_files() - session.config.stash[HOST_STATE_BEFORE])
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = "tests left node state on this machine: %s" % left
        if reporter is not None:
            reporter.write_line("ERROR: " + message, red=True)
        else:
            print("ERROR: " + message)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture
def webhook_receiver():
    """A webhook receiver on loopback (tests/webhook_receiver.py), closed after the test."""
    from webhook_receiver import WebhookReceiver

    receiver = WebhookReceiver()
    try:
        yield receiver
    finally:
        receiver.close()
