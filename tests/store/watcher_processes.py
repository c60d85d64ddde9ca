"""Fence watcher processes for the store's tests: `zerolayer-routectl watch` for a node, as
its unit runs it, against the test's etcd, on a node a deep rollback detached earlier (no
router maps: a fast fence there records the epoch and is acknowledged with no kernel object,
which is what presence, counts and rollbacks are about). The `watchers` fixture
(conftest.py) starts them and kills every one it started."""

import json
import os
import signal
import subprocess
import sys

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_mode
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import raise_fence

from .conftest import COLLECTIONS_PATH

ROUTECTL = (
    "import sys; sys.path.insert(0, %r); "
    "from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_cli import main; "
    "sys.exit(main())" % COLLECTIONS_PATH
)


class WatcherProcess:
    """`zerolayer-routectl watch` for one node, as its unit runs it."""

    def __init__(self, directory, etcd_url, prefix, node):
        self.node = node
        os.makedirs(directory)
        self.pin_dir = os.path.join(directory, "pins")
        os.makedirs(self.pin_dir)
        self.fence_file = os.path.join(directory, "fence.json")
        # A deep rollback detached this node's router earlier: its maps are gone.
        raise_fence(
            self.fence_file, 1, "deep rollback",
            record=router_mode.detached_record(self.fence_file, "an earlier deep rollback"),
        )  # fmt: skip
        self.config = os.path.join(directory, "router.json")
        with open(self.config, "w") as handle:
            json.dump({"routes": []}, handle)
        self.store_config = os.path.join(directory, "store.json")
        with open(self.store_config, "w") as handle:
            json.dump({"endpoints": [etcd_url], "node": node, "prefix": prefix}, handle)
        self.status_file = os.path.join(directory, "fence-watcher.json")
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(
            [
                sys.executable, "-c", ROUTECTL,
                "--config", self.config, "--pin-dir", self.pin_dir,
                "--fence-file", self.fence_file,
                "watch", "--store-config", self.store_config, "--status-file", self.status_file,
            ],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        return self

    def stop(self):
        """SIGTERM, as systemd stops it."""
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        assert self.proc.returncode == 0, (out, err)
        self.proc = None

    def kill(self):
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None


def presence_of(store, node):
    kv = store.client.get(store.key("presence", node))
    return kv.json() if kv else None
