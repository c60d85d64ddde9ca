"""The node's fence watcher against a real etcd and a real router: one store write, every
node rolled back and acknowledged; outages and bad records change nothing."""

import functools
import json
import os
import signal
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    router_lifecycle,
    router_mode,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import read_fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    read_routes,
    set_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
)
from waiting import wait_until as _wait_until

from .conftest import COLLECTIONS_PATH, ENGINE_PORT, SERVICE_PORT, maps_bytes
from .test_deep_rollback_sticky import boot_attach, write_config

ROUTECTL = (
    "import sys; sys.path.insert(0, %r); "
    "from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_cli import main; "
    "sys.exit(main())" % COLLECTIONS_PATH
)
NODE = "zlt-node-1"


@pytest.fixture
def store(etcd):
    return RolloutStore(EtcdClient(etcd.url, timeout=3), "/zlt-watch/")


@pytest.fixture
def routed(layout, netns, proxy, engine, router_object):
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "chat", SERVICE_PORT, 100)
    register_engine_socket(layout, "chat", engine.pid, ENGINE_PORT, timeout=10)
    return layout


class WatcherProcess:
    """`zerolayer-routectl watch`, as the zerolayer-fence-watcher unit runs it."""

    def __init__(self, layout, etcd, tmp_path, netns):
        self.layout = layout
        # As the ebpf_router role writes it: the routes the watcher probes after a deep
        # rollback, in the netns the router steers. No proxy unit: nginx here is no service.
        self.config = str(tmp_path / "router.json")
        with open(self.config, "w") as handle:
            json.dump(
                {"netns": netns.path, "routes": [{"name": "chat", "port": SERVICE_PORT}]}, handle
            )
        self.store_config = str(tmp_path / "store.json")
        with open(self.store_config, "w") as handle:
            json.dump({"endpoints": [etcd.url], "node": NODE, "prefix": "/zlt-watch/"}, handle)
        self.status_file = str(tmp_path / "fence-watcher.json")
        self.proc = None

    def argv(self, *extra):
        return [
            sys.executable, "-c", ROUTECTL,
            "--config", self.config,
            "--pin-dir", self.layout.pin_dir,
            "--fence-file", self.layout.fence_file,
            "watch", "--store-config", self.store_config, "--status-file", self.status_file,
            *extra,
        ]  # fmt: skip

    def start(self):
        self.proc = subprocess.Popen(
            self.argv(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True,
        )  # fmt: skip
        wait_until(lambda: (self.status() or {}).get("connected"), "the watcher to connect")
        return self

    def stop(self):
        """SIGTERM, as systemd stops it: one JSON line (its last status), exit 0."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=30)
        self.proc = None
        assert out.count("\n") == 1, (out, err)
        return json.loads(out)

    def kill(self):
        if self.proc is not None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
            self.proc = None

    def status(self):
        try:
            with open(self.status_file) as handle:
                return json.load(handle)
        except (FileNotFoundError, ValueError):
            return None


@pytest.fixture
def watcher(routed, etcd, tmp_path, netns):
    process = WatcherProcess(routed, etcd, tmp_path, netns)
    try:
        yield process
    finally:
        process.kill()


# Polled often: tests here time the watcher's answers.
wait_until = functools.partial(_wait_until, interval=0.01)


def ack_of(store, node=NODE):
    kv = store.client.get(store.key("acks", node))
    return kv.json() if kv else None


def acknowledged(store, epoch):
    """The node's acknowledgement of epoch, once it is in the store."""

    def check():
        ack = ack_of(store)
        return ack if ack and ack["epoch"] == epoch else None

    return wait_until(check, "the acknowledgement of epoch %d" % epoch)


def weights(layout):
    return {route.name: route.weight_bp for route in read_routes(layout)}


def test_a_fast_rollback_in_the_store_reaches_the_node_under_load(watcher, store, routed, netns):
    watcher.start()
    stop_clients = netns.background_clients()
    time.sleep(0.5)
    raised = store.raise_fence("fast", "p99 too high", "test")
    written = time.monotonic()
    ack = acknowledged(store, raised["epoch"])
    seen = time.monotonic() - written
    time.sleep(0.5)
    report = stop_clients()
    print("store write to acknowledgement seen: %.1f ms; node took %.1f ms" % (
        seen * 1000, ack["took_ms"]))  # fmt: skip
    assert ack["applied"] and ack["confirmed"] and ack["by"] == "watcher", ack
    assert ack["read_back"]["weights_bp"] == {"chat": 0}
    assert weights(routed) == {"chat": 0}
    assert read_fence(routed.fence_file)["epoch"] == raised["epoch"]
    assert report["errors"] == 0, report["error_samples"]
    assert report["served"].get("engine", 0) > 0 and report["served"].get("proxy", 0) > 0
    # The node now refuses any raise with an older epoch: the watcher's fence is the node's.
    with pytest.raises(Exception, match="older than this node's fence epoch"):
        set_route(routed, "chat", weight=50, epoch=raised["epoch"] - 1)
    status = watcher.stop()
    assert status["last_ack_epoch"] == raised["epoch"] and status["connected"] is True


def test_after_its_acknowledgement_the_watcher_reports_the_direct_connections_gone(
    watcher, store, routed, netns
):
    watcher.start()
    stop_clients = netns.background_clients()
    time.sleep(0.3)
    raised = store.raise_fence("fast", "pooled clients", "test")
    ack = acknowledged(store, raised["epoch"])
    reports = wait_until(
        lambda: store.direct_drains(raised["epoch"], [NODE]), "the direct-drain report"
    )
    report = stop_clients()
    direct = reports[NODE]
    # Connection-per-request clients: whatever was open at the first count closes at once.
    assert direct["drained"] is True and direct["left"] == {}, direct
    assert set(direct["first"]) == {"chat"} and 0 <= direct["drained_after_s"] < 30
    assert direct["epoch"] == raised["epoch"] and direct["action"] == "fast"
    assert ack["confirmed"] and report["errors"] == 0
    # The marker the engines read was written, for this epoch.
    with open(routed.direct_drain_file) as handle:
        assert json.load(handle)["all"]["epoch"] == raised["epoch"]


def test_the_watcher_keeps_the_nodes_weights_in_the_store_while_it_runs(watcher, store, routed):
    def live_weights(expected):
        reading = store.live_readings([NODE]).get(NODE)
        return reading if reading and reading["weights_bp"] == expected else None

    watcher.start()
    first = wait_until(lambda: live_weights({"chat": 10000}), "the node's weights at 100 %")
    assert first["attached"] is True and first["node_epoch"] == 0
    raised = store.raise_fence("fast", "pooled clients", "test")
    # Read again after it acted on the fence, not at the next idle recheck.
    after = wait_until(lambda: live_weights({"chat": 0}), "the node's weights at 0", seconds=5)
    assert after["node_epoch"] == raised["epoch"]
    watcher.stop()
    assert store.live_readings([NODE]) == {}, "a stopped watcher leaves no reading behind"


def test_a_deep_rollback_detaches_and_keeps_the_router_detached(watcher, store, routed, netns):
    watcher.start()
    raised = store.raise_fence("deep", "kernel trouble", "test")
    ack = acknowledged(store, raised["epoch"])
    assert ack["confirmed"] and ack["action"] == "deep", ack
    # What the push's probe checks, the watcher checked before it acknowledged.
    assert ack["read_back"]["paths"] == {"chat": "proxy"}, ack
    assert ack["read_back"]["proxy_running"] is None, "no proxy unit was configured"
    assert not router_lifecycle.router_state(routed)["attached"]
    assert router_mode.is_detached(routed.fence_file)
    assert netns.clients(count=30)["served"] == {"proxy": 30}


def test_a_deep_rollback_with_the_proxy_down_is_acknowledged_unconfirmed(
    watcher, store, routed, netns, proxy
):
    watcher.start()
    netns.stop(proxy)
    raised = store.raise_fence("deep", "kernel trouble, proxy down", "test")
    ack = acknowledged(store, raised["epoch"])
    # The router is gone all the same; the count must not call the node served.
    assert not router_lifecycle.router_state(routed)["attached"]
    assert ack["confirmed"] is False, ack
    assert ack["read_back"]["paths"]["chat"].startswith("no answer: "), ack


def test_a_catch_up_records_the_epoch_and_changes_no_weight(watcher, store, routed, netns):
    watcher.start()
    stop_clients = netns.background_clients()
    time.sleep(0.3)
    before = read_routes(routed)  # weights and generations: the counters move with traffic
    # The store brought up to an epoch the nodes took by themselves (canary_store.yml).
    caught_up = store.raise_fence("catch_up", "nodes fenced while the store was down", "test")
    ack = acknowledged(store, caught_up["epoch"])
    report = stop_clients()
    assert ack["applied"] and ack["confirmed"] and ack["action"] == "catch_up", ack
    assert weights(routed) == {"chat": 10000} and read_routes(routed) == before
    assert read_fence(routed.fence_file)["epoch"] == caught_up["epoch"]
    assert report["errors"] == 0 and report["served"].get("engine", 0) > 0, report
    # No direct connection moved: the engines' drain marker names no epoch of it.
    if os.path.exists(routed.direct_drain_file):
        with open(routed.direct_drain_file) as handle:
            marker = json.load(handle)
        assert (marker.get("all") or {}).get("epoch") != caught_up["epoch"], marker
    # A writer of the new epoch is admitted; one of the older epoch may no longer raise.
    set_route(routed, "chat", weight=50, epoch=caught_up["epoch"])
    with pytest.raises(Exception, match="older than this node's fence epoch"):
        set_route(routed, "chat", weight=80, epoch=caught_up["epoch"] - 1)
    assert weights(routed) == {"chat": 5000}


def test_a_detached_node_records_every_newer_fence_and_acknowledges_it(
    watcher, store, routed, netns
):
    watcher.start()
    deep = store.raise_fence("deep", "kernel trouble", "test")
    assert acknowledged(store, deep["epoch"])["confirmed"]
    assert not router_lifecycle.router_state(routed)["attached"]
    for action in ("fast", "abort", "catch_up"):
        raised = store.raise_fence(action, "after the deep rollback", "test")
        ack = acknowledged(store, raised["epoch"])
        assert ack["applied"] and ack["confirmed"], (action, ack)
        assert read_fence(routed.fence_file)["epoch"] == raised["epoch"], action
    # Still detached, on the proxy, and kept so (the fence file says detached).
    assert not router_lifecycle.router_state(routed)["attached"]
    assert router_mode.is_detached(routed.fence_file)
    assert netns.clients(count=20)["served"] == {"proxy": 20}


def test_a_stopped_watcher_catches_up_when_it_starts(watcher, store, routed):
    raised = store.raise_fence("abort", "operator abort", "test")
    time.sleep(0.5)
    assert weights(routed) == {"chat": 10000}, "no watcher ran: nothing may have changed"
    watcher.start()
    ack = wait_until(lambda: ack_of(store), "the acknowledgement")
    assert ack["epoch"] == raised["epoch"] and ack["applied"] and ack["confirmed"], ack
    assert weights(routed) == {"chat": 0}


def test_an_outage_of_the_store_changes_nothing_and_the_watcher_catches_up(
    watcher, store, routed, etcd
):
    watcher.start()
    before = maps_bytes(routed)
    etcd.stop()
    wait_until(lambda: (watcher.status() or {}).get("connected") is False, "the outage")
    time.sleep(1)
    assert maps_bytes(routed) == before, "a store outage must not roll the node back"
    assert read_fence(routed.fence_file)["epoch"] == 0
    etcd.start()
    wait_until(lambda: (watcher.status() or {}).get("connected"), "the reconnection", 30)
    raised = store.raise_fence("fast", "after the outage", "test")
    ack = acknowledged(store, raised["epoch"])
    assert ack["confirmed"] and weights(routed) == {"chat": 0}


def reboot(layout):
    """What a reboot leaves of the node's router: no pin (bpffs lives in memory), the fence
    file (on disk) as it was."""
    router_lifecycle.remove(layout)
    assert not os.path.exists(layout.pin_dir)


@pytest.mark.parametrize("action", ["fast", "deep"])
def test_a_node_rebooted_mid_rollback_ends_at_the_fence_and_acknowledges_it(
    watcher, store, routed, netns, engine, router_object, tmp_path, action
):
    """The node goes down (the watcher killed, every pin lost) before the rollback reaches
    it; it boots with a config that declares chat at 100 %, the router unit attaches, the
    watcher starts and catches up. A second reboot after the acknowledgement: the boot keeps
    the rollback, and the watcher does not act or acknowledge again."""
    config = write_config(tmp_path, routed, router_object, netns, engine, 100, "boot.json")
    watcher.start()
    watcher.kill()
    reboot(routed)
    raised = store.raise_fence(action, "rolled back while the node was down", "test")

    status, booted = boot_attach(config)
    assert status == 0 and booted["attached"], booted
    # The node had not seen the new epoch: the boot's declared weight was taken.
    assert weights(routed) == {"chat": 10000}
    watcher.start()
    ack = acknowledged(store, raised["epoch"])
    assert ack["applied"] and ack["confirmed"] and ack["action"] == action, ack
    assert read_fence(routed.fence_file)["epoch"] == raised["epoch"]
    if action == "fast":
        assert weights(routed) == {"chat": 0}
    else:
        assert not router_lifecycle.router_state(routed)["attached"]
        assert router_mode.is_detached(routed.fence_file)
    assert netns.clients(count=30)["served"] == {"proxy": 30}

    watcher.kill()
    reboot(routed)
    status, booted = boot_attach(config)
    assert status == 0, booted
    if action == "fast":
        # Boot carries no epoch: the declared 100 % is refused by the node's fence.
        assert booted["attached"] and "fenced" in booted["routes"][0], booted
        assert weights(routed) == {"chat": 0}
    else:
        assert booted["kept_detached"] and not booted["attached"], booted
    watcher.start()
    time.sleep(1)
    assert ack_of(store) == ack, "the same epoch must not be acted on or acknowledged again"
    assert netns.clients(count=30)["served"] == {"proxy": 30}


def test_records_the_watcher_refuses_change_nothing(watcher, store, routed):
    watcher.start()
    before = maps_bytes(routed)
    store.client.put(store.key("fence"), {"epoch": 4, "action": "sideways"})
    wait_until(lambda: (watcher.status() or {}).get("last_refusal"), "the refusal")
    assert "action 'sideways'" in watcher.status()["last_refusal"]
    assert maps_bytes(routed) == before and read_fence(routed.fence_file)["epoch"] == 0
    assert ack_of(store) is None

    store.client.put(store.key("fence"), {"epoch": 5, "action": "fast"})
    acknowledged(store, 5)
    # An epoch below the acknowledged one (a store restored from an old backup): refused.
    store.client.put(store.key("fence"), {"epoch": 3, "action": "deep"})
    wait_until(lambda: "below epoch 5" in (watcher.status() or {}).get("last_refusal", ""),
               "the refusal of epoch 3")  # fmt: skip
    assert router_lifecycle.router_state(routed)["attached"], "epoch 3 must not detach"
    assert ack_of(store)["epoch"] == 5


def test_a_new_rollout_after_the_rollback_is_not_zeroed_by_a_watcher_restart(
    watcher, store, routed
):
    """Epoch unchanged, weights raised since by a rollout that took it: no second zero."""
    watcher.start()
    raised = store.raise_fence("fast", "first", "test")
    wait_until(lambda: ack_of(store), "the acknowledgement")
    watcher.stop()
    set_route(routed, "chat", weight=5, epoch=raised["epoch"])  # the new rollout's 5 %
    watcher.start()
    time.sleep(1)
    assert weights(routed) == {"chat": 500}
    assert ack_of(store)["epoch"] == raised["epoch"]


def test_once_acts_and_exits(store, routed, etcd, tmp_path, netns):
    process = WatcherProcess(routed, etcd, tmp_path, netns)
    raised = store.raise_fence("fast", "once", "test")
    proc = subprocess.run(
        process.argv("--once"), capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    status = json.loads(proc.stdout)
    assert status["last_ack_epoch"] == raised["epoch"] and weights(routed) == {"chat": 0}


def showing(metrics, name, value):
    """metrics when name has value there, else None (for wait_until)."""
    return metrics if metrics.get(name) == value else None


def test_the_exporter_shows_the_fence_and_the_watcher(watcher, store, routed):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition

    def metrics():
        text = exposition.render({"fence": exposition.collect_fence(routed, watcher.status_file)})
        return dict(
            line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
        )

    watcher.start()
    # Connected as the watcher last wrote it (a store slow to answer, on a loaded machine,
    # may turn it to 0 for a moment: the metric is there to say so).
    before = wait_until(
        lambda: showing(metrics(), "zerolayer_fence_watcher_store_connected", "1"),
        "the exporter to show the watcher connected",
    )
    assert before["zerolayer_node_fence_epoch"] == "0"
    assert before["zerolayer_router_kept_detached"] == "0"
    # The watcher counts the direct connections (as root) for the exporter: none here.
    assert before['zerolayer_route_direct_connections{route="chat"}'] == "0"
    raised = store.raise_fence("deep", "exporter test", "test")
    acknowledged(store, raised["epoch"])
    # The watcher writes its status just after the acknowledgement: wait for that too.
    after = wait_until(
        lambda: showing(metrics(), "zerolayer_fence_watcher_last_ack_epoch", str(raised["epoch"])),
        "the exporter to show the acknowledgement",
    )
    assert after["zerolayer_node_fence_epoch"] == str(raised["epoch"])
    assert after["zerolayer_router_kept_detached"] == "1"
    assert float(after["zerolayer_fence_watcher_last_ack_timestamp_seconds"]) > 0
    watcher.kill()
    # No watcher status file at all: the watcher's series are absent, the fence's stay.
    os.unlink(watcher.status_file)
    gone = metrics()
    assert "zerolayer_fence_watcher_store_connected" not in gone
    assert gone["zerolayer_node_fence_epoch"] == str(raised["epoch"])


def test_an_unreadable_fence_file_leaves_only_its_series_out(routed):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition

    with open(routed.fence_file, "w") as handle:
        handle.write("not json")
    snapshot = exposition.collect(routed)
    text = exposition.render(snapshot)
    assert "zerolayer_node_fence_epoch" not in text
    assert 'zerolayer_route_weight_ratio{route="chat",port="8080"} 1' in text


def test_a_changed_store_config_ends_the_watcher_for_its_unit_to_start_it_again(
    watcher, store, routed
):
    watcher.start()
    with open(watcher.store_config) as handle:
        settings = json.load(handle)
    settings["timeout"] = 4  # what a run of the rollout_store role may change
    with open(watcher.store_config, "w") as handle:
        json.dump(settings, handle)
    # It notices after the next store event or idle re-check (10 s), whichever comes first.
    out, err = watcher.proc.communicate(timeout=30)
    watcher.proc = None
    status = json.loads(out)
    assert status["stopped_for"] == "store config %s changed" % watcher.store_config, (out, err)
    assert weights(routed) == {"chat": 10000}, "ending for new settings changes nothing on the node"
