"""A real etcd member on loopback for the rollout store's tests (etcd_member.py): started
once per worker, ended by its process group, always."""

import os

import pytest

COLLECTIONS_PATH = os.path.abspath(
    os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
)

from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (  # noqa: E402
    EtcdClient,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (  # noqa: E402
    RolloutStore,
)

from .etcd_member import running_etcd  # noqa: E402


@pytest.fixture(scope="session")
def etcd_member():
    with running_etcd() as member:
        yield member


@pytest.fixture(scope="session")
def etcd_url(etcd_member):
    return etcd_member.url


@pytest.fixture
def store(etcd_url, request):
    """A RolloutStore under a prefix of this test's own, so tests never see each other."""
    prefix = "/zlt-%s-%d/" % (
        request.node.name[:40].replace("[", "-").replace("]", ""),
        os.getpid(),
    )
    return RolloutStore(EtcdClient(etcd_url, timeout=3), prefix)


@pytest.fixture(autouse=True)
def no_store_config_of_the_user(tmp_path_factory, monkeypatch):
    """`zerolayer` reads the user's store config (~/.config/zerolayer/store.json, which `make
    run` writes) under the options a test gives: each test sees an empty one of its own."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("xdg-config")))
    monkeypatch.delenv("ZEROLAYER_STORE_CONFIG", raising=False)


@pytest.fixture
def watchers(tmp_path, etcd_url, store):
    """watchers(node) -> a WatcherProcess (call .start()); every one is killed at the end."""
    from .watcher_processes import WatcherProcess

    started = []

    def watcher(node):
        process = WatcherProcess(str(tmp_path / node), etcd_url, store.prefix, node)
        started.append(process)
        return process

    try:
        yield watcher
    finally:
        for process in started:
            process.kill()
