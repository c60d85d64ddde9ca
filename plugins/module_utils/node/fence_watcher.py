# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The node's fence watcher: one store write rolls the whole fleet back.

`zerolayer-routectl watch` keeps a watch on the fleet's fence key in the rollout store.
When the store's epoch rises above the node's own, the watcher acts on the node at once:
fast or abort, weight 0 on every route (blind 4-byte writes, routes.zero_weights); deep,
the deep rollback (router detached and kept so across reboots), then the proxy started and
every route's port asked which path answers, as the playbook's push does. It raises the node's
fence to that epoch first, the same epoch every weight write is checked against, reads
the result back and writes its acknowledgement to acks/<node> in the store. Then it follows
the direct-path connections that pooled clients still hold (direct_drain) until the engines
have let them all go, and writes how long that took to acks/<node>/direct. On every
(re)connection it reads the fence before it watches, so a watcher that was down, a store
that restarted or a node that rebooted catches up.

A store that cannot be reached changes nothing on the node: an outage of the store must
never become a rollback of the fleet. The watcher keeps trying, and says so in its status
file, which the route exporter turns into metrics (and an alert).

The decisions (what a fence record asks of this node) are plain functions, tested one by
one; run() is the loop around them.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import subprocess
import threading
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_text_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import (
    direct_drain,
    router_lifecycle,
    router_mode,
    routes,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import (
    FenceRefused,
    raise_fence,
    read_fence,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import maps_pinned
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.proc_sockets import in_netns
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_mode import (
    detached_without_maps,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (
    StoreUnavailable,
    lease_gone,
)

DEFAULT_STATUS_FILE = "/run/zerolayer/fence-watcher.json"
# The store's fence actions (rollout_store.FENCE_ACTIONS) and what each one does here.
# catch_up only records the epoch: the store was brought up to an epoch nodes had taken
# by themselves (a rollback that could not reach it), which must not roll anything back.
NODE_ACTIONS = {"fast": "fast", "abort": "fast", "deep": "deep", "catch_up": "catch_up"}
# A watch that saw nothing for this long is re-opened after a read of the fence: that read
# is also how the watcher notices a store that went away without closing the connection.
IDLE_RECHECK_S = 10.0
RETRY_FIRST_S = 0.2
RETRY_MAX_S = 5.0
# The legacy proxy marks every answer with the path that served it (legacy_proxy role).
PATH_HEADER = "X-Zerolayer-Path"
PROBE_TIMEOUT_S = 5.0
# After a rollback the watcher counts the direct-path connections pooled clients still hold
# until none is left, for at most the fast rollback's promise, and reports it in
# acks/<node>/direct (the node's own key prefix): the acknowledgement itself never waits.
DIRECT_DRAIN_WAIT_S = 30.0
# The node's weights as the watcher reads them (acks/<node>/live) live on a lease of this
# many seconds, renewed at every idle recheck: a watcher that stops loses its reading within
# it, so `zerolayer rollout status` never shows a dead node's last weights as today's.
LIVE_TTL_S = 45
LIVE_KEYS = ("node_epoch", "attached", "mode", "weights_bp")
# The watcher's presence (presence/<node>): a lease this short, renewed this often, so that a
# watcher killed is absent within seconds; a watch loop that has not turned for
# PRESENCE_STALL_S (its idle re-check turns it every IDLE_RECHECK_S) is stuck, and its
# presence is let expire.
PRESENCE_TTL_S = 6
PRESENCE_RENEW_S = 2.0
PRESENCE_STALL_S = 30.0


def plan(fence, node_epoch, last_ack_epoch):
    """What this node does with the store's fence record.

    Returns (step, epoch, action): step "apply" (the store's epoch is above the node's:
    act, then acknowledge), "ack" (the node is there already, by a push or an earlier
    run, and has not acknowledged this epoch), or "none". A record with no whole epoch or
    an unknown action raises FenceRefused; so does an epoch below one this node already
    acknowledged (a store that went back in time must not be trusted either way).
    """
    epoch = fence.get("epoch") if isinstance(fence, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise FenceRefused(
            "the store's fence record has no whole epoch >= 0: %r; nothing was changed" % (fence,),
            {"field": "epoch", "value": repr(epoch)},
        )
    if epoch == 0:
        return "none", 0, None  # no rollback ever
    action = fence.get("action")
    if action not in NODE_ACTIONS:
        raise FenceRefused(
            "the store's fence epoch %d has action %r; the watcher knows %s. Nothing was "
            "changed on this node" % (epoch, action, ", ".join(sorted(NODE_ACTIONS))),
            {"field": "action", "value": repr(action)},
        )
    if epoch < last_ack_epoch:
        raise FenceRefused(
            "the store's fence epoch %d is below epoch %d this node already acknowledged; "
            "nothing was changed (was the store restored from an old backup?)"
            % (epoch, last_ack_epoch),
            {"field": "epoch", "value": epoch, "acknowledged": last_ack_epoch},
        )
    if epoch > node_epoch:
        return "apply", epoch, NODE_ACTIONS[action]
    if epoch > last_ack_epoch:
        return "ack", epoch, NODE_ACTIONS[action]
    return "none", epoch, NODE_ACTIONS[action]


def apply(layout, epoch, action, reason):
    """Act on the node: the fence first, then the rollback. Returns what was done.

    catch_up records the epoch and changes nothing else. A fast rollback on a node whose
    router a deep rollback detached records the epoch too: no connection goes direct there,
    and a node that could not record a newer fence would admit a writer of an older one.
    """
    if action == "catch_up":
        raise_fence(layout.fence_file, epoch, "catch up (fence watcher)")
        return {"actions": ["fence epoch recorded"]}
    if action == "deep":
        result = router_lifecycle.deep_rollback(layout, epoch, reason)
        return {"actions": result["actions"]}
    if detached_without_maps(layout):
        raise_fence(layout.fence_file, epoch, "fast rollback (fence watcher, router detached)")
        return {"actions": ["fence epoch recorded: the router is detached"]}
    routes.fence_routes(layout, epoch, "fast rollback (fence watcher)")
    failures, _routes = routes.roll_back_and_read(layout)
    return {"actions": ["weight 0 on every route"], "failures": failures}


def read_back(layout):
    """What the node is now: its fence epoch, whether the router runs, each route's weight."""
    state = router_lifecycle.router_state(layout)
    weights = {}
    if maps_pinned(layout):
        weights = {route.name: route.weight_bp for route in routes.read_routes(layout)}
    return {
        "node_epoch": read_fence(layout.fence_file)["epoch"],
        "attached": state["attached"],
        "mode": router_mode.read_mode(layout.fence_file)["mode"],
        "weights_bp": weights,
    }


SELF_NETNS = "/proc/self/ns/net"


def connect_in_netns(netns_path, port, timeout):
    """A TCP connection to 127.0.0.1:port made inside the netns the router steers."""
    return in_netns(
        netns_path, lambda: socket.create_connection(("127.0.0.1", port), timeout=timeout)
    )


def proxy_after_deep(routes, proxy_service, netns_path=None, run=subprocess.run):
    """The deep rollback's second half: the proxy runs, and the proxy answers every route.

    routes: the node config's routes (name, port); proxy_service: the proxy's systemd unit,
    or None where the node has none to start (proxy_running is then None, not False).
    """
    running = None
    if proxy_service:
        argv = ["systemctl", "start", proxy_service]
        started = run(argv, capture_output=True, text=True, check=False, timeout=60)
        active = run(
            ["systemctl", "is-active", "--quiet", proxy_service],
            capture_output=True, text=True, check=False, timeout=10,
        )  # fmt: skip
        running = started.returncode == 0 and active.returncode == 0
    paths = {route["name"]: probe_path(route["port"], netns_path) for route in routes}
    return {"proxy_running": running, "paths": paths}


def probe_path(port, netns_path=None):
    """Which path answers a new connection to the port: the answer's PATH_HEADER, or why none."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=PROBE_TIMEOUT_S)
    try:
        connection.sock = connect_in_netns(netns_path, port, PROBE_TIMEOUT_S)
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        response.read()
        return response.getheader(PATH_HEADER) or "no %s header (HTTP %d)" % (
            PATH_HEADER,
            response.status,
        )
    except (OSError, http.client.HTTPException) as exc:
        return "no answer: %s" % (exc,)
    finally:
        connection.close()


def config_routes(config):
    """The (name, port) of each route in the node config; entries without both are left out."""
    routes = config.get("routes") if isinstance(config, dict) else None
    return [
        {"name": route["name"], "port": route["port"]}
        for route in routes or []
        if isinstance(route, dict)
        and isinstance(route.get("name"), str)
        and isinstance(route.get("port"), int)
        and not isinstance(route.get("port"), bool)
    ]


def confirmed(action, seen, epoch=0):
    """Whether what the node reads back is the state the fence of epoch asks for."""
    if action == "catch_up":
        return seen["node_epoch"] >= epoch
    if action == "deep":
        return (
            not seen["attached"]
            and seen["mode"] == "detached"
            and seen.get("proxy_running") is not False
            and all(path == "proxy" for path in seen.get("paths", {}).values())
        )
    return all(weight == 0 for weight in seen["weights_bp"].values())


def acknowledgement(node, epoch, action, step, seen, started):
    return {
        "node": node,
        "epoch": epoch,
        "action": action,
        "applied": step == "apply",
        "confirmed": confirmed(action, seen, epoch),
        "read_back": seen,
        "by": "watcher",
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "at_unix": round(time.time(), 6),
        # The node's own clock: the controller counts by what it sees arrive, not by this.
        "took_ms": round((time.monotonic() - started) * 1000.0, 3),
    }


class LeasedKey:
    """One key of this node's on a lease of its own: written with the lease, kept by renewing
    the lease (which writes nothing), gone with it. The node's live reading and its
    watcher's presence are both kept this way."""

    def __init__(self, client, key, ttl_s):
        self.client = client
        self.key = key
        self.ttl_s = ttl_s
        self.lease = 0

    def put(self, value):
        """Write value on the lease, granting one first when there is none (or it expired)."""
        if not self.lease:
            self.lease = self.client.grant_lease(self.ttl_s)
        self.client.put(self.key, value, lease=self.lease)

    def renew(self):
        """Whether the lease was still there to renew; if not the key went with it (and the
        next put() grants a new one). A store that fails the request otherwise (unreachable,
        a timeout, a leader change) raises: the lease is kept and renewed at the next turn,
        not replaced by another while it may still hold the key."""
        if not self.lease:
            return False
        try:
            renewed = self.client.keep_alive(self.lease) > 0
        except FleetError as exc:
            if not lease_gone(exc):
                raise
            renewed = False
        if not renewed:
            self.lease = 0
        return renewed

    def revoke(self):
        """Take the key out of the store now: best effort, the lease ends it anyway."""
        lease, self.lease = self.lease, 0
        if not lease:
            return
        try:
            self.client.revoke_lease(lease)
        except FleetError:
            pass


class LiveReading:
    """The node's weights, as this watcher last read them, kept in the store for status.

    Written only when they change (a store that keeps every revision must not grow by a
    write per node every few seconds); between changes only the lease is renewed, which
    writes nothing. The key goes when the lease does: no reading means no live watcher.
    """

    def __init__(self, store, node, ttl_s=LIVE_TTL_S):
        self.leased = LeasedKey(store.client, store.key("acks", node, "live"), ttl_s)
        self.key = self.leased.key
        self.node = node
        self.published = None

    def publish(self, seen):
        """Keep the reading of seen (a read_back()) in the store; True when it was written."""
        reading = {key: seen.get(key) for key in LIVE_KEYS}
        if self.leased.renew() and reading == self.published:
            return False
        self.leased.put(dict(reading, node=self.node, at_unix=round(time.time(), 3)))
        self.published = reading
        return True

    def withdraw(self):
        """Take the reading out of the store (a watcher that stops): best effort, the
        lease ends it anyway within its TTL."""
        self.leased.revoke()
        self.published = None


class Presence:
    """presence/<node>: this node's watcher runs and its loop goes on. The rollback reads it
    in the transaction that raises the fence and waits only for the watchers present; the
    other nodes get the push at once instead of after the count's quiet period.

    The key lives on a short lease (ttl_s) that a thread of its own renews every renew_s,
    but only while the watch loop beats (beat(), on each of its turns): a loop that has not
    beaten for stall_s is stuck, and a stuck watcher would never acknowledge, so its
    presence is let expire. A store that fails a renewal is logged and tried again at the
    next turn; an expired lease is granted anew and the key written again. stop() revokes
    the lease: a watcher stopped cleanly is absent at once.
    """

    def __init__(
        self,
        store,
        node,
        ttl_s=PRESENCE_TTL_S,
        renew_s=PRESENCE_RENEW_S,
        stall_s=PRESENCE_STALL_S,
        clock=time.monotonic,
        log=None,
    ):
        self.leased = LeasedKey(store.client, store.key("presence", node), ttl_s)
        self.node = node
        self.renew_s = renew_s
        self.stall_s = stall_s
        self.clock = clock
        self.log = log or (lambda message: None)
        self.started_at_unix = round(time.time(), 3)
        self.last_beat = None
        self.error = None
        self._stopped = threading.Event()
        self._thread = None

    def beat(self):
        """The watch loop is turning (called on each of its turns)."""
        self.last_beat = self.clock()

    def beating(self):
        return self.last_beat is not None and self.clock() - self.last_beat < self.stall_s

    def keep(self):
        """One turn of the renewal: renew the lease, or write the key on a new one. Returns
        whether the presence is in the store now (False also while the loop is stuck)."""
        if not self.beating():
            stuck = "the watch loop has not turned for %.0f s: presence left to expire"
            self._said(stuck % self.stall_s)
            return False
        try:
            if not self.leased.renew():
                self.leased.put(
                    {
                        "node": self.node,
                        "pid": os.getpid(),
                        "started_at_unix": self.started_at_unix,
                        "at_unix": round(time.time(), 3),
                    }
                )
        except FleetError as exc:
            self._said("presence not kept in the store: %s" % exc.message)
            return False
        self._said(None)
        return True

    def _said(self, error):
        """Log a failure once, when it changes, not at every renewal."""
        if error != self.error and error is not None:
            self.log(error)
        self.error = error

    def start(self):
        """Keep the presence from now on, in a daemon thread, until stop()."""
        self._stopped.clear()
        self._thread = threading.Thread(target=self._run, name="presence", daemon=True)
        self._thread.start()

    def _run(self):
        while True:
            self.keep()
            if self._stopped.wait(self.renew_s):
                return

    def stop(self):
        """End the renewals and take the presence out of the store (revoke its lease)."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join(timeout=self.renew_s + 10)
            self._thread = None
        self.leased.revoke()


class Watcher:
    """One node's watcher: the store, the router's pins, and what it last did."""

    def __init__(
        self, store, layout, node=None, status_file=DEFAULT_STATUS_FILE, log=None, config=None
    ):
        self.store = store
        self.layout = layout
        # The node config (router.json): its routes are probed, its proxy started, after deep.
        self.routes = config_routes(config or {})
        self.proxy_service = (config or {}).get("proxy_service") or None
        self.netns = (config or {}).get("netns") or SELF_NETNS
        self.node = node or socket.gethostname()
        self.status_file = status_file
        self.log = log or (lambda message: None)
        self.status = {
            "node": self.node,
            "connected": False,
            "store_epoch": None,
            "node_epoch": read_fence(layout.fence_file)["epoch"],
            "last_ack_epoch": 0,
            "last_ack_at_unix": None,
            "last_refusal": None,
            "last_error": None,
            "live_error": None,
        }
        self.live = LiveReading(store, self.node)
        self.presence = Presence(store, self.node, log=self.log)

    def last_ack_epoch(self):
        """The epoch this node last acknowledged, as the store holds it (0: none)."""
        kv = self.store.client.get(self.store.key("acks", self.node))
        if kv is None:
            return 0
        ack = kv.json()
        epoch = ack.get("epoch") if isinstance(ack, dict) else None
        return epoch if isinstance(epoch, int) and not isinstance(epoch, bool) else 0

    def handle(self, fence):
        """Act on one fence record; returns the acknowledgement written, or None."""
        started = time.monotonic()
        node_epoch = read_fence(self.layout.fence_file)["epoch"]
        self.status["store_epoch"] = fence.get("epoch") if isinstance(fence, dict) else None
        try:
            step, epoch, action = plan(fence, node_epoch, self.status["last_ack_epoch"])
        except FenceRefused as exc:
            self.status["last_refusal"] = exc.message
            self.log(exc.message)
            self.write_status()
            return None
        if step == "none":
            self.status["node_epoch"] = node_epoch
            self.write_status()
            return None
        if step == "apply":
            apply(self.layout, epoch, action, "fence epoch %d: %s" % (epoch, fence.get("reason")))
        seen = read_back(self.layout)
        if action == "deep":
            seen.update(proxy_after_deep(self.routes, self.proxy_service, self.netns))
        ack = acknowledgement(self.node, epoch, action, step, seen, started)
        self.store.client.put(self.store.key("acks", self.node), ack)
        # Always after a rollback, so that the report never waits for a node: with no route
        # in the node config there is nothing to count, and the report says so at once. A
        # catch-up moved no connection: nothing to follow.
        if action != "catch_up":
            threading.Thread(
                target=self.follow_direct_drain,
                args=(epoch, action, started),
                name="direct-drain",
                daemon=True,
            ).start()
        self.status.update(
            node_epoch=seen["node_epoch"], last_ack_epoch=epoch, last_ack_at_unix=ack["at_unix"]
        )
        self.log("fence epoch %d (%s): %s, acknowledged" % (epoch, action, step))
        self.write_status()
        return ack

    def follow_direct_drain(self, epoch, action, started, wait_s=DIRECT_DRAIN_WAIT_S):
        """Count the direct connections left until none is, then report it in the store:
        {node, epoch, action, first, left, drained, drained_after_s (from the fence's
        arrival), waited_s}. A store that cannot take it is logged, never retried."""
        try:
            outcome = direct_drain.wait_until_drained(
                self.routes_by_name(),
                max(0.0, wait_s - (time.monotonic() - started)),
                self.netns,
            )
            since_fence = round(time.monotonic() - started, 3)
            report = dict(
                outcome,
                node=self.node,
                epoch=epoch,
                action=action,
                drained_after_s=since_fence if outcome["drained"] else None,
                at_unix=round(time.time(), 6),
            )
            self.store.client.put(self.store.key("acks", self.node, "direct"), report)
            if outcome["drained"]:
                said = "no direct connection left after %.3f s" % since_fence
            else:
                said = "direct connections left after %.0f s: %s" % (since_fence, outcome["left"])
            self.log("fence epoch %d: %s" % (epoch, said))
            return report
        except (FleetError, OSError) as exc:
            self.log("fence epoch %d: direct connections not reported: %s" % (epoch, exc))
            return None

    def catch_up(self):
        """Read the fence (and this node's last acknowledgement) and act on it.

        Returns the fence key's revision, from which the watch goes on.
        """
        self.status["last_ack_epoch"] = max(self.status["last_ack_epoch"], self.last_ack_epoch())
        kv = self.store.client.get(self.store.key("fence"))
        self.status["connected"] = True
        self.status["last_error"] = None
        if kv is None:
            self.handle({"epoch": 0})
            return 0
        self.handle(kv.json())
        return kv.mod_revision

    def publish_live(self):
        """Keep the node's weights as read now in the store (LiveReading). A store that
        refuses it (the node's role lacks acks/<node>/live) is said in the status and the
        log, never a reason to stop watching the fence."""
        try:
            self.live.publish(read_back(self.layout))
        except StoreUnavailable:
            raise
        except FleetError as exc:
            if self.status.get("live_error") != exc.message:
                self.log("the node's weights are not kept in the store: %s" % exc.message)
            self.status["live_error"] = exc.message
            return
        self.status["live_error"] = None

    def run(self, stop=lambda: False, idle_recheck_s=IDLE_RECHECK_S, sleep=time.sleep):
        """Watch until stop() is true: catch up, watch, and after any break start over.
        The node's presence and live reading go with the watcher (Presence.stop,
        LiveReading.withdraw)."""
        self.presence.beat()
        self.presence.start()
        try:
            self._run(stop, idle_recheck_s, sleep)
        finally:
            self.presence.stop()
            self.live.withdraw()

    def _run(self, stop, idle_recheck_s, sleep):
        retry = RETRY_FIRST_S
        while not stop():
            self.presence.beat()
            try:
                revision = self.catch_up()
                self.publish_live()
                retry = RETRY_FIRST_S
                for events in self.store.client.watch(
                    self.store.key("fence"), revision + 1, timeout=idle_recheck_s
                ):
                    self.presence.beat()
                    for kv in events:
                        if kv.value:  # a deleted fence key (value empty) asks nothing
                            self.handle(kv.json())
                            self.publish_live()
                    if stop():
                        return
            except StoreUnavailable as exc:
                # Also the end of an idle watch: the next catch_up() tells an idle store
                # from a gone one.
                if self._store_answers():
                    self.status.update(connected=True, last_error=None)
                    self.write_status()  # the exporter tells a live watcher by this
                    continue
                self.status.update(connected=False, last_error=exc.message)
                self.write_status()
                self.log("store unreachable, the node is kept as it is: %s" % exc.message)
                sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)
            except FleetError as exc:
                # The store answered with an error (permissions, a record that is no JSON):
                # nothing is done on the node; said, and tried again later.
                self.status.update(last_error=exc.message)
                self.write_status()
                self.log(exc.message)
                sleep(retry)
                retry = min(retry * 2, RETRY_MAX_S)

    def _store_answers(self):
        try:
            self.store.client.get(self.store.key("fence"))
        except FleetError:
            return False
        return True

    def count_direct(self):
        """{route: its direct-path connections now}, or None when they cannot be counted.
        The watcher counts them (root sees every process's sockets) for the exporter, which
        runs without the privileges to."""
        try:
            return direct_drain.direct_connections_by_route(self.routes_by_name(), self.netns)
        except (FleetError, OSError):
            return None

    def routes_by_name(self):
        return {route["name"]: route["port"] for route in self.routes}

    def write_status(self):
        """The status file the exporter reads (replaced atomically)."""
        if not self.status_file:
            return
        self.status["direct_connections"] = self.count_direct()
        self.status["updated_at_unix"] = round(time.time(), 3)
        write_text_atomic(self.status_file, json.dumps(self.status, sort_keys=True))


def read_status(path):
    """The watcher's status file, or None when there is none (no watcher on this node)."""
    try:
        with open(path) as handle:
            status = json.load(handle)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise FleetError(
            "fence watcher status %s cannot be read: %s" % (path, exc), {"path": path}
        ) from None
    return status if isinstance(status, dict) else None
