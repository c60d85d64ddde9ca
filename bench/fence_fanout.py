"""A rollback of 1,000 to 10,000 simulated nodes: real etcd, real watches, real maps.

Each simulated node is what the fence watcher needs of a node, for real: its own pinned
router maps in a private bpffs (every map of the current layout, a route "chat" at 50 %),
its own fence file, its own `fence_watcher.Watcher` and its own watch connection to one
real etcd member, watching the fence over the JSON gateway's streaming POST /v3/watch.
What is not real: the nodes' watchers all share one CPU (a few worker processes), the
controller has the other; and the router program is not attached (no traffic flows; the
watcher writes and reads the same maps either way).

The watchers run in one of two ways (--watchers; both in one run compare them side by side):
- threads: each node's Watcher.run() in a thread of its own, as on a node, with its own
  blocking connection (EtcdClient.watch). 5,000 of them do not fit one CPU: 4,750 threads
  starve each other past their HTTP timeouts and reconnect over and over. So this mode is
  skipped above --max-thread-nodes (1,000).
- multiplexed: each worker process holds its share of the nodes' watch connections as
  non-blocking sockets under one selector (epoll), one connection per node as before.
  What each node does is the product's own code: Watcher.catch_up() before every watch
  (the reads of the node's acknowledgement and of the fence, and handle() of what it
  reads), and Watcher.handle() of every fence record a watch delivers (the node's fence
  file raised, weight 0 in its own pinned maps or, deep, the deep rollback, the read-back,
  the acknowledgement put to the store). The watch request is the one EtcdClient.watch()
  builds (captured from the product's generator, formatted by http.client with _open()'s
  headers). Not reused, and why: Watcher.run() and EtcdClient.watch()/_open(), the loop
  and the transport, since they hold a thread blocked on one connection's readline(),
  which is what this mode replaces. The worker re-does their parts around the selector:
  the chunked HTTP response read and split into lines, each line decoded as watch()
  decodes it (KeyValue of the product); and run()'s decisions after a watch ends: the
  stream closed by the store, catch up at once; no line for the idle re-check time or an
  error (StoreUnavailable), catch up at once if the store answers (_store_answers()),
  else back off (RETRY_FIRST_S doubling to RETRY_MAX_S); any other FleetError, back off.
  Reactions of the nodes of one worker therefore run one after the other, not in
  parallel threads; on one CPU threads take turns under the GIL anyway.

Presence (--presence on, the default; off, or both side by side: on,off): each simulated node
that runs a watcher keeps presence/<node> in the store as the product's watcher does, with
the product's fence_watcher.Presence: its own lease (PRESENCE_TTL_S), renewed every
PRESENCE_RENEW_S with one store request, let expire when its watch loop stops turning. In
threads mode that is Watcher.run()'s own presence thread per node. In multiplexed mode one
thread per worker calls each node's Presence.keep() when it comes due (the one due first
first), and the worker's loop beats every node it serves, as run() beats on each turn; when
the worker cannot keep up, every node's renewal comes late, leases lapse, and the figures
say so (longest gap between renewals, leases lost, leases etcd expired, presence keys
counted in the store just before the rollback). Off: no presence key anywhere, which is how
the count worked before presence: it waits for every node until the quiet period.

The store's load is measured around each rollback: etcd's CPU time and resident memory
(/proc/<pid>/stat, status) and its own counters (GET /metrics: events its watches delivered,
leases renewed, granted, expired), over a steady window with every watcher connected
(--steady-s) and over the rollback.yml process. --store-members 3 starts a 3-member cluster
(the workers spread over the members) instead of one member.

For each size, `playbooks/rollback.yml` runs against an inventory of that many hosts, as an
operator would: it raises the fence in the store, counts the acknowledgements and pushes to
the nodes that did not confirm. A share of the nodes (--silent-pct, 5 %) run no watcher:
- fast: they are reachable (`ansible_connection=local`, the push's raw call runs
  zerolayer-routectl on their own pins), so the push confirms them;
- deep: they are down (their SSH port on 127.0.0.1 refuses), so the push is tried and the
  report names them unreachable. The deep push does not run for real here: it would start
  and probe this machine's own proxy service.
Every map is read back afterwards: fast, weight 0 on every node; deep, pins removed on every
node with a watcher.

    .venv/bin/python bench/fence_fanout.py                       # 1,000 and 5,000, multiplexed
    .venv/bin/python bench/fence_fanout.py --sizes 1000,5000 --watchers threads,multiplexed
    .venv/bin/python bench/fence_fanout.py --sizes 200 --modes fast
    .venv/bin/python bench/fence_fanout.py --sizes 1000,10000 --modes fast --presence on,off

Writes bench/results/fence-fanout-<UTC time>.md and .json (after each run, so a failed
later run keeps the earlier ones). As root, from the checkout, after scripts/setup. Removes
every process, mount and file it made, also on failure.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import errno
import heapq
import http.client
import itertools
import json
import os
import resource
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / ".collections"))

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (  # noqa: E402
    FleetError,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.process_clock import (  # noqa: E402
    stat_fields,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.loader import (  # noqa: E402
    pin_new_map,
    write_new_seeds,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (  # noqa: E402
    PinLayout,
    ensure_pin_dirs,
    missing_pins,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (  # noqa: E402
    MAP_SPECS,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (  # noqa: E402
    read_routes,
    set_route,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.fence_watcher import (  # noqa: E402
    IDLE_RECHECK_S,
    PRESENCE_RENEW_S,
    PRESENCE_STALL_S,
    PRESENCE_TTL_S,
    RETRY_FIRST_S,
    RETRY_MAX_S,
    Presence,
    Watcher,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (  # noqa: E402
    EtcdClient,
    KeyValue,
    StoreUnavailable,
    prefix_end,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (  # noqa: E402
    RolloutStore,
)

PREFIX = "/zlb-fanout/"
ROUTE, PORT, WEIGHT = "chat", 8080, 50
# A simulated watcher re-opens an idle watch this often (a node's: every 10 s); at 5,000
# nodes the default would be 500 reconnections a second on two cores, all through one run.
# The same in both watcher modes.
SIM_IDLE_RECHECK_S = 120.0
WORKER_PROCESSES = 4
WATCHER_MODES = ("threads", "multiplexed")
# Above this many nodes the thread-per-node mode is not run (see the module's docstring).
MAX_THREAD_NODES = 1000
# The simulated nodes' own work on one CPU, the controller on the other (etcd on either):
# so the controller's time is its own, and the nodes' acknowledgements show what sharing one
# CPU among them costs.
CONTROLLER_CPU, NODES_CPU = "0", "1"
# A multiplexed worker starts at most this many (re)connections (each a blocking catch-up
# of two reads) before it serves its open connections again.
MUX_STARTS_PER_TURN = 50
# How often a multiplexed worker looks for watches idle past their re-check time.
IDLE_CHECK_EVERY_S = 0.5
WATCH_PATH = "/v3/watch"
# --presence on: each simulated watcher keeps presence/<node> as the product's does; off: none
# anywhere in the store, so the count waits for every node as it did before presence.
PRESENCE_MODES = ("on", "off")
# A node's watcher lets its presence expire when its loop has not turned for PRESENCE_STALL_S,
# three times its idle re-check. The simulated watchers re-check every SIM_IDLE_RECHECK_S
# instead, so the same ratio: else an idle simulated watch would read as a stuck loop.
SIM_PRESENCE_STALL_S = SIM_IDLE_RECHECK_S * PRESENCE_STALL_S / IDLE_RECHECK_S
# Seconds between the simulated nodes being ready and the rollback: the store's steady load
# (the presence leases' renewals) is measured over this window.
STEADY_S = 10.0


def log(message):
    sys.stderr.write("fence-fanout: %s\n" % message)
    sys.stderr.flush()


def node_name(index):
    return "sim-%05d" % index


def node_layout(bpffs, state_dir, name):
    return PinLayout(os.path.join(bpffs, name), fence_file=os.path.join(state_dir, name + ".json"))


def make_node(layout):
    """Every map of the current layout, pinned, with the node's seeds and one route at 50 %."""
    ensure_pin_dirs(layout)
    for spec in MAP_SPECS:
        pin_new_map(spec, layout.map(spec.name))
    write_new_seeds(layout)
    set_route(layout, ROUTE, PORT, WEIGHT)


# ---------------------------------------------------------------- the nodes' side


class _Captured(Exception):
    """Raised by BenchClient._open() while it only captures a request."""


class _CaptureSocket:
    """What http.client sends, kept instead of sent."""

    def __init__(self):
        self.data = bytearray()

    def sendall(self, data):
        self.data += data


class BenchClient(EtcdClient):
    """The product's client, counting the watches it opens; and the bytes of a watch
    request, for the multiplexed watchers to send on a socket of their own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.watch_opens = 0
        self._capturing = None

    def _open(self, path, body, timeout, token=True):
        if self._capturing is not None:
            self._capturing.update(path=path, body=body, token=token)
            raise _Captured
        response = super()._open(path, body, timeout, token)
        if path == WATCH_PATH:
            self.watch_opens += 1
        return response

    def watch_request(self, key, start_revision):
        """The HTTP request EtcdClient.watch(key, start_revision) sends, as bytes.

        The path and body come from the product's watch() itself (run up to its _open());
        the request line and headers are the ones _open() has http.client send.
        """
        self._capturing = {}
        try:
            next(self.watch(key, start_revision))
        except _Captured:
            pass
        finally:
            captured, self._capturing = self._capturing, None
        headers = {"Content-Type": "application/json"}
        if captured["token"] and self._token:
            headers["Authorization"] = self._token
        url = urllib.parse.urlsplit(self.endpoints[0])
        connection = http.client.HTTPConnection(url.hostname, url.port or 2379)
        connection.sock = _CaptureSocket()
        connection.request(
            "POST",
            url.path.rstrip("/") + captured["path"],
            json.dumps(captured["body"]).encode(),
            headers,
        )
        return bytes(connection.sock.data)


class BenchWatcher(Watcher):
    """The product's Watcher, timing the reactions that acknowledged a fence epoch."""

    reactions = 0
    reaction_cpu_s = 0.0
    reaction_wall_s = 0.0
    handled = 0

    def follow_direct_drain(self, epoch, action, started, wait_s=0.0):
        # The simulated nodes run no engine: no direct connection to follow, and a second
        # store write per node would compete with the acknowledgements this bench measures.
        return None

    def handle(self, fence):
        cpu, wall = time.thread_time(), time.monotonic()
        self.handled += 1
        ack = super().handle(fence)
        if ack is not None:
            self.reactions += 1
            self.reaction_cpu_s += time.thread_time() - cpu
            self.reaction_wall_s += time.monotonic() - wall
        return ack


class NoPresence:
    """--presence off: a watcher of a release before presence, which keeps no key."""

    kept = lost = failed = 0
    longest_gap_s = 0.0
    gaps_over_ttl = 0
    leased = None

    def beat(self):
        pass

    def start(self):
        pass

    def stop(self):
        pass

    def keep(self):
        return False


class BenchPresence(Presence):
    """The product's Presence, counting its renewals: how many, how many found their lease
    gone (it expired between two renewals: the key was written again on a new one), and the
    longest time between two of them, which tells whether the simulated nodes kept up."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.kept = self.lost = self.failed = 0
        self.longest_gap_s = 0.0
        self.gaps_over_ttl = 0
        self._last_keep = None

    def keep(self):
        now = time.monotonic()
        if self._last_keep is not None:
            gap = now - self._last_keep
            self.longest_gap_s = max(self.longest_gap_s, gap)
            self.gaps_over_ttl += gap > self.leased.ttl_s
        self._last_keep = now
        lease = self.leased.lease
        kept = super().keep()
        self.kept += 1
        self.failed += not kept
        self.lost += bool(lease) and self.leased.lease != lease
        return kept


class NodeLog:
    """What the watchers of one worker said, other than their acknowledgements."""

    def __init__(self):
        self.count = 0
        self.samples = []
        self.lock = threading.Lock()

    def __call__(self, message):
        if message.endswith(", acknowledged"):
            return
        with self.lock:
            self.count += 1
            if len(self.samples) < 3:
                self.samples.append(message)


def make_watchers(args, names, node_log):
    watchers = []
    for name in names:
        layout = node_layout(args.bpffs, args.state_dir, name)
        store = RolloutStore(BenchClient(args.endpoint, timeout=30), PREFIX)
        watcher = BenchWatcher(store, layout, name, status_file=None, log=node_log)
        if args.presence == "on":
            watcher.presence = BenchPresence(
                store, name, stall_s=SIM_PRESENCE_STALL_S, log=watcher.log
            )
        else:
            watcher.presence = NoPresence()
        watchers.append(watcher)
    return watchers


def presence_kept(watchers):
    """Whether every watcher's presence is in the store (True with --presence off)."""
    return all(
        watcher.presence.leased is None or watcher.presence.leased.lease for watcher in watchers
    )


def worker_stats(watchers, node_log, cpu_at_ready, extra=None):
    usage = resource.getrusage(resource.RUSAGE_SELF)
    stats = {
        "nodes": len(watchers),
        "watch_opens": sum(w.store.client.watch_opens for w in watchers),
        "reactions": sum(w.reactions for w in watchers),
        "reaction_cpu_s": sum(w.reaction_cpu_s for w in watchers),
        "reaction_wall_s": sum(w.reaction_wall_s for w in watchers),
        "cpu_to_ready_s": cpu_at_ready,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "max_rss_mib": usage.ru_maxrss / 1024.0,
        "node_messages": node_log.count,
        "node_message_samples": node_log.samples,
        "fence_records_handled": sum(w.handled for w in watchers),
        "presence_kept": sum(w.presence.kept for w in watchers),
        "presence_failed": sum(w.presence.failed for w in watchers),
        "presence_lost": sum(w.presence.lost for w in watchers),
        "presence_gaps_over_ttl": sum(w.presence.gaps_over_ttl for w in watchers),
        # Summed like the rest by the caller; the max is taken from its own key.
        "presence_longest_gap_s_max": max((w.presence.longest_gap_s for w in watchers), default=0),
    }
    stats.update(extra or {})
    return stats


def process_cpu_s():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def write_stats(path, stats):
    Path(path).write_text(json.dumps(stats))


def worker_threads(args, names):
    """One Watcher.run() thread per node; "ready" once every node's watch is open."""
    # Blocked here, so that every thread inherits the mask and sigwait() below gets it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    node_log = NodeLog()
    watchers = make_watchers(args, names, node_log)
    stopping = threading.Event()
    for watcher in watchers:
        thread = threading.Thread(
            target=watcher.run,
            kwargs={"stop": stopping.is_set, "idle_recheck_s": SIM_IDLE_RECHECK_S},
            daemon=True,
        )
        thread.start()
    deadline = time.monotonic() + 600
    while not (
        all(watcher.store.client.watch_opens for watcher in watchers) and presence_kept(watchers)
    ):
        if time.monotonic() > deadline:
            sys.stdout.write("not ready\n")
            return 1
        time.sleep(0.2)
    cpu_at_ready = process_cpu_s()
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    signal.sigwait({signal.SIGTERM})
    write_stats(args.stats, worker_stats(watchers, node_log, cpu_at_ready))
    # Daemon threads may be inside a reaction: leave without waiting for them.
    os._exit(0)


class MuxNode:
    """One simulated node in a multiplexed worker: the product's Watcher (catch-up and
    reaction) and its watch connection, a non-blocking socket under the worker's selector.
    The methods re-do what Watcher.run() and EtcdClient.watch() do around one connection."""

    def __init__(self, watcher, address, idle_recheck_s):
        self.watcher = watcher
        self.address = address
        self.idle_recheck_s = idle_recheck_s
        self.retry = RETRY_FIRST_S
        self.sock = None
        self.opens = 0  # watches the store answered (HTTP 200)
        self.created = False
        self.dead = False
        self._reset()

    def _reset(self):
        self.out = b""
        self.buf = b""  # received, not decoded
        self.body = b""  # decoded, not yet a whole line
        self.headers_done = False
        self.chunked = False
        self.deadline = 0.0

    def start(self, mux):
        """One turn of Watcher.run(): catch up, then open the watch from the next revision."""
        try:
            revision = self.watcher.catch_up()
        except FleetError as exc:
            self.failed(mux, exc)
            return
        self.retry = RETRY_FIRST_S
        self.out = self.watcher.store.client.watch_request(
            self.watcher.store.key("fence"), revision + 1
        )
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(self.address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.failed(mux, self.unavailable("%s" % os.strerror(code)))
            return
        self.sock = sock
        self.deadline = time.monotonic() + self.idle_recheck_s
        mux.selector.register(sock, selectors.EVENT_WRITE, self)
        mux.open.add(self)

    def unavailable(self, why):
        return StoreUnavailable(
            "the watch of %s ended: %s" % (self.watcher.store.key("fence"), why),
            {"endpoints": self.watcher.store.client.endpoints},
        )

    def close(self, mux):
        if self.sock is not None:
            mux.selector.unregister(self.sock)
            self.sock.close()
            self.sock = None
            mux.open.discard(self)
        self._reset()

    def failed(self, mux, exc):
        """Watcher.run()'s except clauses: what happens after a watch (or catch-up) failed."""
        self.close(mux)
        watcher = self.watcher
        if isinstance(exc, StoreUnavailable):
            if watcher._store_answers():
                watcher.status.update(connected=True, last_error=None)
                watcher.write_status()
                mux.later(self, 0.0)
                return
            watcher.status.update(connected=False, last_error=exc.message)
            watcher.write_status()
            watcher.log("store unreachable, the node is kept as it is: %s" % exc.message)
        else:
            watcher.status.update(last_error=exc.message)
            watcher.write_status()
            watcher.log(exc.message)
        mux.later(self, self.retry)
        self.retry = min(self.retry * 2, RETRY_MAX_S)

    def on_event(self, mux, mask):
        if mask & selectors.EVENT_WRITE:
            self.on_writable(mux)
        elif mask & selectors.EVENT_READ:
            self.on_readable(mux)

    def on_writable(self, mux):
        code = self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if code:
            self.failed(mux, self.unavailable(os.strerror(code)))
            return
        try:
            sent = self.sock.send(self.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self.failed(mux, self.unavailable(exc))
            return
        self.out = self.out[sent:]
        if not self.out:
            mux.selector.modify(self.sock, selectors.EVENT_READ, self)

    def on_readable(self, mux):
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError as exc:
            self.failed(mux, self.unavailable(exc))
            return
        if not data:
            self.ended(mux)
            return
        self.deadline = time.monotonic() + self.idle_recheck_s
        self.buf += data
        try:
            lines, finished = self.decode()
        except FleetError as exc:
            self.failed(mux, exc)
            return
        for line in lines:
            # As EtcdClient.watch() reads each line.
            try:
                result = json.loads(line.decode()).get("result", {})
            except ValueError:
                continue
            if result.get("created") and not self.created:
                self.created = True
                mux.created += 1
            events = result.get("events") or []
            if not events:
                continue
            for kv in [KeyValue(event.get("kv", {})) for event in events]:
                if not kv.value:  # a deleted fence key (value empty) asks nothing
                    continue
                try:
                    self.watcher.handle(kv.json())
                except FleetError as exc:
                    self.failed(mux, exc)
                    return
                except Exception as exc:
                    # On a node this would end the watcher's thread: this node stops too.
                    self.close(mux)
                    self.dead = True
                    self.watcher.log("the watcher ended: %r" % (exc,))
                    return
        if finished:
            self.ended(mux)

    def ended(self, mux):
        """The store ended the stream: Watcher.run() starts over (catch-up, watch) at once."""
        self.close(mux)
        mux.later(self, 0.0)

    def decode(self):
        """The whole lines of the response body received so far, and whether it has ended."""
        if not self.headers_done:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return [], False
            head = self.buf[:end].decode("latin-1").split("\r\n")
            self.buf = self.buf[end + 4 :]
            parts = head[0].split(" ", 2)
            try:
                status = int(parts[1])
            except (IndexError, ValueError):
                raise self.unavailable("no HTTP status line: %r" % head[0]) from None
            headers = {}
            for line in head[1:]:
                name, _colon, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if status >= 400:
                reason = parts[2] if len(parts) > 2 else ""
                raise EtcdClient._answered_error(WATCH_PATH, status, reason, self.buf)
            self.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
            self.headers_done = True
            self.opens += 1
        finished = False
        if self.chunked:
            while True:
                eol = self.buf.find(b"\r\n")
                if eol < 0:
                    break
                try:
                    size = int(self.buf[:eol].split(b";")[0], 16)
                except ValueError:
                    raise self.unavailable("a chunk without a size") from None
                if size == 0:
                    finished = True
                    break
                if len(self.buf) < eol + 2 + size + 2:
                    break
                self.body += self.buf[eol + 2 : eol + 2 + size]
                self.buf = self.buf[eol + 2 + size + 2 :]
        else:
            self.body, self.buf = self.body + self.buf, b""
        *lines, self.body = self.body.split(b"\n")
        return lines, finished


class Mux:
    """One worker's selector, its open watch connections and the (re)connections due."""

    def __init__(self):
        self.selector = selectors.DefaultSelector()
        self.open = set()
        self.due = []
        self.order = itertools.count()
        self.created = 0  # nodes whose first watch the store has created
        self.next_idle_check = 0.0
        self.stopping = False
        self.nodes = []

    def later(self, node, delay):
        heapq.heappush(self.due, (time.monotonic() + delay, next(self.order), node))

    def turn(self):
        """Start the (re)connections due (a few), serve the sockets ready, end idle watches."""
        now = time.monotonic()
        started = 0
        while self.due and self.due[0][0] <= now and started < MUX_STARTS_PER_TURN:
            heapq.heappop(self.due)[2].start(self)
            started += 1
        now = time.monotonic()
        timeout = 0.5
        if self.due:
            timeout = max(0.0, min(timeout, self.due[0][0] - now))
        for key, mask in self.selector.select(timeout):
            if key.data.sock is not None and key.fileobj is key.data.sock:
                key.data.on_event(self, mask)
        now = time.monotonic()
        if now >= self.next_idle_check:
            self.next_idle_check = now + IDLE_CHECK_EVERY_S
            # Each node's watch loop is this one, and it turns: Watcher.run() beats on each
            # of its turns. A node whose watcher ended (dead) beats no more: its presence
            # expires as a stuck watcher's does.
            for node in self.nodes:
                if not node.dead:
                    node.watcher.presence.beat()
            for node in [node for node in self.open if node.deadline <= now]:
                # EtcdClient.watch(): no line within its timeout ends the watch, unavailable.
                node.failed(self, node.unavailable("timed out"))


class PresenceKeeper:
    """Presence.start()'s thread for every node of a multiplexed worker, in one thread: each
    node's Presence.keep() (the product's renewal, one lease per node, one store request per
    renewal as on a node), renew_s after that node's last one ended, the one due first
    first. A node's own thread does the same on its own clock; here, when the worker's CPU
    cannot keep up, every node's renewal comes late by the same amount, which is what the
    figures then show (longest gap, leases lost), not hidden."""

    def __init__(self, nodes):
        self.due = [(0.0, index, node) for index, node in enumerate(nodes)]
        self.kept_once = set()
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="presence", daemon=True)

    def start(self):
        self.thread.start()

    def _run(self):
        while not self.stopping.is_set():
            due, index, node = self.due[0]
            wait = due - time.monotonic()
            if wait > 0:
                self.stopping.wait(wait)
                continue
            presence = node.watcher.presence
            if presence.keep():
                self.kept_once.add(index)
            heapq.heapreplace(self.due, (time.monotonic() + presence.renew_s, index, node))

    def stop(self):
        self.stopping.set()
        # A renewal in flight ends within the client's timeout; the worker need not wait.
        self.thread.join(timeout=5)


def worker_multiplexed(args, names):
    """The nodes' watch connections under one selector; "ready" once every watch is open."""
    node_log = NodeLog()
    watchers = make_watchers(args, names, node_log)
    url = urllib.parse.urlsplit(args.endpoint)
    address = (url.hostname, url.port or 2379)
    mux = Mux()
    nodes = [MuxNode(watcher, address, SIM_IDLE_RECHECK_S) for watcher in watchers]
    mux.nodes = nodes
    for node in nodes:
        node.watcher.presence.beat()
        mux.later(node, 0.0)
    keeper = None
    if args.presence == "on":
        keeper = PresenceKeeper(nodes)
        keeper.start()

    def stop(_signum, _frame):
        mux.stopping = True

    signal.signal(signal.SIGTERM, stop)
    deadline = time.monotonic() + 600
    cpu_at_ready = None
    while not mux.stopping:
        mux.turn()
        if cpu_at_ready is None:
            if mux.created == len(nodes) and (
                keeper is None or len(keeper.kept_once) == len(nodes)
            ):
                cpu_at_ready = process_cpu_s()
                sys.stdout.write("ready\n")
                sys.stdout.flush()
            elif time.monotonic() > deadline:
                sys.stdout.write("not ready\n")
                sys.stdout.flush()
                return 1
    if keeper is not None:
        keeper.stop()
    # The watches are counted by the nodes here: this mode does not open them with _open().
    extra = {
        "watch_opens": sum(node.opens for node in nodes),
        "dead_nodes": sum(node.dead for node in nodes),
    }
    write_stats(args.stats, worker_stats(watchers, node_log, cpu_at_ready, extra))
    return 0


def worker_main(args):
    names = [line.strip() for line in sys.stdin if line.strip()]
    if args.watchers == "threads":
        return worker_threads(args, names)
    return worker_multiplexed(args, names)


# ---------------------------------------------------------------- one size


def start_workers(stack, args, watchers, presence, endpoints, bpffs, state_dir, names):
    """The worker processes; each talks to one store member, in turn, as a fleet's nodes
    spread over the members."""
    workers = []
    count = args.worker_processes
    shares = [names[i::count] for i in range(count)]
    for index, share in enumerate(shares):
        if not share:
            continue
        stats = os.path.join(state_dir, "worker-%d.stats.json" % index)
        proc = subprocess.Popen(
            ["taskset", "-c", NODES_CPU, sys.executable, __file__, "--worker",
             "--watchers", watchers, "--presence", presence,
             "--endpoint", endpoints[index % len(endpoints)], "--bpffs", bpffs,
             "--state-dir", state_dir, "--stats", stats],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        proc.stats_file = stats
        stack.callback(stop_group, proc)
        proc.stdin.write("\n".join(share) + "\n")
        proc.stdin.close()
        workers.append(proc)
    for proc in workers:
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise RuntimeError("a watcher worker did not connect: %r" % line)
    return workers


def stop_group(proc):
    """End the process group proc leads (started in a session of its own): SIGTERM, SIGKILL
    after 30 s; then whatever the group still holds once proc is gone (a playbook's forks)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        time.sleep(0.05)


def stop_workers(workers):
    """End every worker; what they counted, summed (None where one wrote nothing)."""
    for proc in workers:
        stop_group(proc)
    total = {}
    for proc in workers:
        try:
            stats = json.loads(Path(proc.stats_file).read_text())
        except (OSError, ValueError):
            return None
        for key, value in stats.items():
            if key == "node_message_samples":
                total.setdefault(key, []).extend(value)
            elif key.endswith("_max"):
                total[key] = max(total.get(key, 0), value)
            elif isinstance(value, (int, float)):
                total[key] = total.get(key, 0) + value
    return total


def write_inventory(path, names, silent, mode, routectl, bpffs, state_dir):
    lines = ["[gpu_nodes]"]
    for name in names:
        layout = node_layout(bpffs, state_dir, name)
        if name in silent and mode == "deep":
            # Down: nothing answers on its SSH port.
            lines.append("%s ansible_connection=ssh ansible_host=127.0.0.1 ansible_port=9" % name)
            continue
        lines.append(
            "%s ansible_connection=local rollback_routectl='%s --pin-dir %s --fence-file %s'"
            % (name, routectl, layout.pin_dir, layout.fence_file)
        )
    Path(path).write_text("\n".join(lines) + "\n")


def write_routectl(path):
    """zerolayer-routectl from the checkout, as the node's command runs it: on the nodes'
    CPU, since on a fleet the push's work on the node is the node's, not the controller's."""
    Path(path).write_text(
        "#!/bin/sh\nexec taskset -c %s %s -c 'import sys; sys.path.insert(0, %s); "
        "from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_cli import main; "
        'sys.exit(main())\' "$@"\n'
        % (NODES_CPU, sys.executable, json.dumps(str(REPO / ".collections")))
    )
    os.chmod(path, 0o700)


def environment():
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["PATH"] = "%s:%s" % (REPO / ".venv" / "bin", env.get("PATH", ""))
    # A controller for this many hosts: forks beyond the cores only queue.
    env["ANSIBLE_FORKS"] = "20"
    env["ANSIBLE_HOST_KEY_CHECKING"] = "False"
    return env


def silent_nodes(names, silent_pct):
    silent_count = round(len(names) * silent_pct / 100.0)
    # Spread over the fleet: every step-th node, as many as asked.
    step = max(1, len(names) // silent_count) if silent_count else 1
    return set(names[::step][:silent_count])


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
# etcd's own counters (GET /metrics), read before and after: events its watches delivered, and
# its leases renewed, granted and expired. A lease is renewed on the leader alone but
# granted and expired on every member, so these are taken from the member that counted most;
# the events are summed, each member delivering to the watches it holds.
STORE_EVENTS = "etcd_debugging_mvcc_events_total"
STORE_LEASE_COUNTERS = (
    "etcd_debugging_lease_renewed_total",
    "etcd_debugging_lease_granted_total",
    "etcd_debugging_server_lease_expired_total",
)


def store_sample(members):
    """The store's members now: CPU seconds and resident memory summed over their processes
    (/proc), and the counters above."""
    sample = {"at": time.monotonic(), "cpu_s": 0.0, "rss_mib": 0.0, "hwm_mib": 0.0}
    sample.update(dict.fromkeys((STORE_EVENTS, *STORE_LEASE_COUNTERS), 0.0))
    for member in members:
        pid = member.proc.pid
        fields = stat_fields(pid)  # utime and stime are fields 14 and 15 of stat(5)
        sample["cpu_s"] += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        for line in Path("/proc/%d/status" % pid).read_text().splitlines():
            if line.startswith("VmRSS:"):
                sample["rss_mib"] += int(line.split()[1]) / 1024.0
            elif line.startswith("VmHWM:"):
                sample["hwm_mib"] += int(line.split()[1]) / 1024.0
        with urllib.request.urlopen(member.url + "/metrics", timeout=30) as answer:  # noqa: S310
            for line in answer.read().decode().splitlines():
                name, _space, value = line.partition(" ")
                if name == STORE_EVENTS:
                    sample[name] += float(value)
                elif name in STORE_LEASE_COUNTERS:
                    sample[name] = max(sample[name], float(value))
    return sample


def store_load(before, after):
    """What the store did between two samples."""
    seconds = after["at"] - before["at"]
    return {
        "seconds": round(seconds, 2),
        "cpu_s": round(after["cpu_s"] - before["cpu_s"], 2),
        "cpu_share": round((after["cpu_s"] - before["cpu_s"]) / seconds, 3) if seconds else None,
        "rss_mib_before": round(before["rss_mib"], 1),
        "rss_mib_after": round(after["rss_mib"], 1),
        "rss_mib_peak": round(after["hwm_mib"], 1),
        "events_delivered": int(after[STORE_EVENTS] - before[STORE_EVENTS]),
        "leases_renewed": int(after[STORE_LEASE_COUNTERS[0]] - before[STORE_LEASE_COUNTERS[0]]),
        "renewals_per_s": round(
            (after[STORE_LEASE_COUNTERS[0]] - before[STORE_LEASE_COUNTERS[0]]) / seconds, 1
        )
        if seconds
        else None,
        "leases_granted": int(after[STORE_LEASE_COUNTERS[1]] - before[STORE_LEASE_COUNTERS[1]]),
        "leases_expired": int(after[STORE_LEASE_COUNTERS[2]] - before[STORE_LEASE_COUNTERS[2]]),
    }


def presence_keys(endpoints):
    """How many presence keys the store holds now (a count, no keys read)."""
    prefix = PREFIX + "presence/"
    key, end = (base64.b64encode(k).decode() for k in (prefix.encode(), prefix_end(prefix)))
    answer = EtcdClient(endpoints, timeout=30).call(
        "/v3/kv/range", {"key": key, "range_end": end, "count_only": True}
    )
    return int(answer.get("count", 0))


@contextlib.contextmanager
def running_store(size):
    """size etcd members on loopback (1: one member), ended and removed afterwards."""
    from store.etcd_member import etcd_cluster, running_etcd

    if size == 1:
        with running_etcd() as member:
            yield [member]
    else:
        with etcd_cluster(size) as members:
            yield members


def run_size(args, size, mode, watchers, members, push_processes=None, presence="on"):
    endpoints = [member.url for member in members]
    names = [node_name(i) for i in range(size)]
    silent = silent_nodes(names, args.silent_pct)
    with contextlib.ExitStack() as stack:
        workdir = tempfile.mkdtemp(prefix="zlb-fanout-")
        stack.callback(subprocess.run, ["rm", "-rf", workdir], check=False)
        bpffs = os.path.join(workdir, "bpffs")
        os.mkdir(bpffs, 0o700)
        subprocess.run(["mount", "-t", "bpf", "bpf", bpffs], check=True)
        stack.callback(subprocess.run, ["umount", bpffs], check=False)
        state_dir = os.path.join(workdir, "state")
        os.mkdir(state_dir)

        started = time.monotonic()
        for name in names:
            make_node(node_layout(bpffs, state_dir, name))
        made_s = time.monotonic() - started
        log("%d nodes' maps pinned in %.1f s" % (size, made_s))
        started = time.monotonic()
        watched = [name for name in names if name not in silent]
        workers = start_workers(
            stack, args, watchers, presence, endpoints, bpffs, state_dir, watched
        )
        connected_s = time.monotonic() - started
        log(
            "%d watches open in %.1f s (%s, presence %s, %d silent)"
            % (len(watched), connected_s, watchers, presence, len(silent))
        )
        # The store's steady load with every watcher connected (and, presence on, keeping its
        # lease), before any rollback.
        steady_from = store_sample(members)
        time.sleep(args.steady_s)
        playbook_from = store_sample(members)
        steady = store_load(steady_from, playbook_from)
        steady["presence_keys"] = presence_keys(endpoints)
        log("store, steady: %s" % json.dumps(steady))

        routectl = os.path.join(workdir, "routectl")
        write_routectl(routectl)
        inventory = os.path.join(workdir, "inventory.ini")
        write_inventory(inventory, names, silent, mode, routectl, bpffs, state_dir)
        report_path = os.path.join(workdir, "report.json")
        extra = {
            "rollback_mode": mode,
            "rollback_hosts": "gpu_nodes",
            "rollout_store_endpoints": endpoints,
            "rollout_store_prefix": PREFIX,
            "canary_record_dir": os.path.join(workdir, "records"),
            "rollback_report_path": report_path,
            "rollback_reason": "fence fan-out bench",
            "rollback_ack_wait_s": args.ack_wait_s,
            "rollback_deep_ack_wait_s": args.ack_wait_s,
            # No engines on simulated nodes: nothing to wait for after the rollback.
            "rollback_direct_wait_s": 0,
        }
        if args.ack_quiet_s is not None:
            extra["rollback_ack_quiet_s"] = args.ack_quiet_s
        if args.push_shard_nodes is not None:
            extra["rollback_push_shard_nodes"] = args.push_shard_nodes
        if push_processes is not None:
            extra["rollback_push_processes"] = push_processes
        extra_file = os.path.join(workdir, "extra.json")
        Path(extra_file).write_text(json.dumps(extra))
        argv = [
            "taskset", "-c", args.controller_cpus,
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i", inventory, str(REPO / "playbooks" / "rollback.yml"), "-e", "@" + extra_file,
        ]  # fmt: skip
        started_wall = time.time()
        started = time.monotonic()
        # A group of its own: on a failure or a signal, its forks end with it, before the
        # files they may still write to are removed.
        proc = subprocess.Popen(
            argv, env=environment(), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )  # fmt: skip
        stack.callback(stop_group, proc)
        try:
            playbook_out, _playbook_err = proc.communicate(timeout=args.playbook_timeout_s)
        except subprocess.TimeoutExpired:
            # Ended here, and said in the report as a run that did not finish, so that a
            # rollback this machine cannot finish in time still leaves what was measured.
            rollback_load = store_load(playbook_from, store_sample(members))
            stop_group(proc)
            stop_workers(workers)
            result = {
                "mode": mode, "watchers": watchers, "presence": presence,
                "store_members": len(members), "push_processes": push_processes,
                "nodes": size, "silent": len(silent), "finished": False,
                "process_s": round(time.monotonic() - started, 2),
                "watchers_connected_s": round(connected_s, 2),
                "store_steady": steady, "store_rollback": rollback_load,
            }  # fmt: skip
            log("did not finish: %s" % json.dumps(result))
            return result
        process_s = time.monotonic() - started
        load_after = os.getloadavg()[0]
        rollback_load = store_load(playbook_from, store_sample(members))
        nodes = stop_workers(workers) or {}
        if os.environ.get("ZLB_SHOW_PLAYBOOK"):
            sys.stderr.write(playbook_out)
        if not os.path.exists(report_path):
            raise RuntimeError("rollback.yml wrote no report (rc %d): %s" % (
                proc.returncode, playbook_out[-3000:]))  # fmt: skip
        report = json.loads(Path(report_path).read_text())
        fence = RolloutStore(EtcdClient(endpoints, timeout=30), PREFIX).fence()
        absent = report.get("watchers_absent")
        waited = report.get("count_waited_s")
        waited = float(waited) if waited not in (None, "") else None
        # The count begins as the fence is raised (at_unix: the controller's clock, just before
        # the transaction) and lasts waited_s; what follows, to the last confirmation, is the
        # push to the nodes the count did not see confirm.
        count_ended = fence["at_unix"] + waited if waited is not None else None

        # Read every node back, from its maps.
        wrong = []
        for name in names:
            layout = node_layout(bpffs, state_dir, name)
            if mode == "fast":
                weights = {route.name: route.weight_bp for route in read_routes(layout)}
                if weights != {ROUTE: 0}:
                    wrong.append((name, weights))
            elif name not in silent and not missing_pins(layout):
                # Its deep rollback must have removed the maps.
                wrong.append((name, "maps still pinned"))
        by_node = {entry["node"]: entry for entry in report["nodes"]}
        seen = sorted(
            entry["seen_after_s"] for entry in report["nodes"]
            if entry.get("confirmed_by") == "watcher" and entry.get("seen_after_s") is not None
        )  # fmt: skip
        reactions = nodes.get("reactions") or 0
        result = {
            "mode": mode,
            "watchers": watchers,
            "finished": True,
            "presence": presence,
            "store_members": len(members),
            "push_processes": push_processes,
            # Per shard of the push: its nodes, exit status and seconds ([]: not sharded).
            "push_shards": report.get("push_shards", []),
            "controller_cpus": args.controller_cpus,
            "worker_processes": len(workers),
            "nodes": size,
            "silent": len(silent),
            "silent_nodes": sorted(silent),
            "maps_pinned_s": round(made_s, 2),
            "watchers_connected_s": round(connected_s, 2),
            "process_s": round(process_s, 2),
            "report_wall_time_s": report["wall_time_s"],
            "started_at_unix": report["started_at_unix"],
            "bench_launch_unix": round(started_wall, 3),
            "confirmed_by_watcher": len(report["confirmed_by_watcher"]),
            "pushed": len(report["pushed"]),
            "unreachable": len(report["unreachable"]),
            "not_confirmed": len(report["not_confirmed"]),
            "silent_named": sorted(silent)
            == sorted(
                set(report["pushed"]) | set(report["unreachable"]) | set(report["not_confirmed"])
            ),
            "silent_pushed_ok": all(
                by_node[name].get("confirmed_by") == "push" and by_node[name]["confirmed"]
                for name in silent
            )
            if mode == "fast"
            else None,
            "ack_seen_p50_s": seen[len(seen) // 2] if seen else None,
            "ack_seen_max_s": seen[-1] if seen else None,
            "errors_sample": [
                (entry["node"], entry.get("error"))
                for entry in report["nodes"]
                if entry.get("error")
            ][:3],
            "read_back_wrong": len(wrong),
            "read_back_wrong_sample": wrong[:5],
            "playbook_rc": proc.returncode,
            # The nodes' side, as the workers counted it.
            "watch_opens": nodes.get("watch_opens"),
            "watch_reopens": (nodes["watch_opens"] - len(watched)) if nodes else None,
            "reactions": reactions,
            "reaction_cpu_ms_mean": round(1000.0 * nodes["reaction_cpu_s"] / reactions, 2)
            if reactions
            else None,
            "reaction_wall_ms_mean": round(1000.0 * nodes["reaction_wall_s"] / reactions, 2)
            if reactions
            else None,
            "nodes_cpu_to_ready_s": round(nodes["cpu_to_ready_s"], 2) if nodes else None,
            "nodes_cpu_s": round(nodes["cpu_s"], 2) if nodes else None,
            "nodes_max_rss_mib": round(nodes["max_rss_mib"], 1) if nodes else None,
            "node_messages": nodes.get("node_messages"),
            "node_message_samples": nodes.get("node_message_samples", [])[:3],
            "dead_nodes": nodes.get("dead_nodes", 0),
            "load_1m_after": round(load_after, 2),
            # Presence: the watchers the raise found present, and of those it did not the ones
            # that do run a watcher (their lease lapsed: the nodes could not keep up).
            "present_at_raise": size - len(absent) if isinstance(absent, list) else None,
            "absent_with_watcher": len(set(absent) - silent) if isinstance(absent, list) else None,
            "count_waited_s": waited,
            "fence_after_start_s": round(fence["at_unix"] - float(report["started_at_unix"]), 3),
            "push_s": round(float(report["finished_at_unix"]) - count_ended, 3)
            if count_ended is not None
            else None,
            "fence_records_handled": nodes.get("fence_records_handled"),
            "presence_kept": nodes.get("presence_kept"),
            "presence_failed": nodes.get("presence_failed"),
            "presence_lost": nodes.get("presence_lost"),
            "presence_gaps_over_ttl": nodes.get("presence_gaps_over_ttl"),
            "presence_longest_gap_s": round(nodes.get("presence_longest_gap_s_max") or 0, 2),
            "store_steady": steady,
            "store_rollback": rollback_load,
        }
        log(json.dumps({k: v for k, v in result.items() if k != "silent_nodes"}))
        return result


# ---------------------------------------------------------------- the report


# The dimensions a run is set by; two runs compared side by side differ in one of them.
RUN_DIMENSIONS = ("mode", "nodes", "watchers", "push_processes", "presence", "store_members")


def ratio_table(caption, pairs, columns):
    """Markdown lines of a side-by-side table: per (new, old) pair, its mode and nodes, then
    new / old for each (heading, key) of columns. [] when there is no pair."""
    if not pairs:
        return []
    lines = [
        "",
        "Side by side, %s:" % caption,
        "",
        "| mode | nodes | %s |" % " | ".join(heading for heading, _key in columns),
        "| --- | ---: |%s" % (" ---: |" * len(columns)),
    ]
    for new, old in pairs:
        cells = [_ratio(new[key], old[key]) for _heading, key in columns]
        lines.append("| %s | %d | %s |" % (new["mode"], new["nodes"], " | ".join(cells)))
    return lines


def side_by_side(results, varied, is_new):
    """(new, old) pairs of runs alike in every dimension but `varied`, where is_new(new) and
    not is_new(old): a ratio then shows what that one dimension changed."""
    alike = [key for key in RUN_DIMENSIONS if key != varied]
    return [
        (new, old)
        for new in results
        if is_new(new)
        for old in results
        if not is_new(old) and all(new.get(key) == old.get(key) for key in alike)
    ]


def _or_dash(value):
    return "-" if value is None else value


def _ratio(new, old):
    if new is None or old in (None, 0):
        return "-"
    return "%.2f" % (new / old)


def render(all_runs, command, started, skipped, load_before):
    results = [r for r in all_runs if r.get("finished", True)]
    lines = [
        "# Fence fan-out: rollback.yml against simulated nodes",
        "",
        "Date: %s (UTC). Command: `%s`" % (started.strftime("%Y-%m-%d %H:%M:%S"), command),
        "",
        "Host: %s, %d CPUs; load average before %s. etcd on loopback (members: %s); each "
        "simulated node its own pinned maps, fence file, Watcher and watch connection; "
        "watchers: threads (one thread per node) or multiplexed (one selector per worker "
        "process); presence on: each watcher keeps presence/<node> on a %d s lease of its own, "
        "renewed every %.0f s."
        % (
            os.uname().release,
            os.cpu_count(),
            load_before,
            ", ".join(sorted({str(r["store_members"]) for r in all_runs})),
            PRESENCE_TTL_S,
            PRESENCE_RENEW_S,
        ),
        "",
        "| mode | nodes | silent | watchers | presence | present at raise | push shards "
        "| whole process s | report s (process start to last confirmation) | fence after s "
        "| count waited s | push s | by watcher | pushed | unreachable | ack seen p50 s "
        "| ack seen max s | maps wrong | watches open s | watch re-opens | nodes' CPU s "
        "| CPU ms per reaction | load 1 min after |",
        "| --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            "| %s | %d | %d | %s | %s | %s | %d | %.2f | %.2f | %s | %s | %s | %d | %d | %d "
            "| %s | %s | %d | %.2f | %s | %s | %s | %s |"
            % (r["mode"], r["nodes"], r["silent"], r["watchers"], r.get("presence", "-"),
               _or_dash(r.get("present_at_raise")), len(r.get("push_shards") or []),
               r["process_s"], r["report_wall_time_s"], _or_dash(r.get("fence_after_start_s")),
               _or_dash(r.get("count_waited_s")), _or_dash(r.get("push_s")),
               r["confirmed_by_watcher"], r["pushed"],
               r["unreachable"], r["ack_seen_p50_s"], r["ack_seen_max_s"], r["read_back_wrong"],
               r["watchers_connected_s"], r["watch_reopens"], r["nodes_cpu_s"],
               r["reaction_cpu_ms_mean"], r["load_1m_after"])
        )  # fmt: skip
    with_presence = side_by_side(results, "presence", lambda run: run.get("presence") == "on")
    lines += ratio_table(
        "presence on / off (below 1: on took less)",
        with_presence,
        [("report s", "report_wall_time_s"), ("whole process s", "process_s"),
         ("count waited s", "count_waited_s"), ("push s", "push_s"),
         ("ack seen max s", "ack_seen_max_s")],
    )  # fmt: skip
    lines += [
        "",
        "The store: steady (every watcher connected, before the rollback, for the seconds "
        "given) and during rollback.yml (its process start to exit). etcd's CPU and resident "
        "memory from /proc, its counters from /metrics (events its watches delivered, leases "
        "renewed and expired); the nodes' side of presence as the workers counted it.",
        "",
        "| mode | nodes | presence | presence keys | steady s | steady etcd CPU share "
        "| renewals/s | rollback s | etcd CPU s | events delivered | renewals | leases expired "
        "| etcd RSS MiB before / after / peak | renewals by nodes | leases lost "
        "| longest gap s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
        "| --- | ---: | ---: | ---: |",
    ]
    for r in all_runs:
        steady, rollback = r.get("store_steady"), r.get("store_rollback")
        if not steady or not rollback:
            continue
        lines.append(
            "| %s | %d | %s | %s | %.1f | %.3f | %s | %.1f | %.2f | %d | %d | %d "
            "| %.0f / %.0f / %.0f | %s | %s | %s |"
            % (r["mode"], r["nodes"], r["presence"], _or_dash(steady.get("presence_keys")),
               steady["seconds"], steady["cpu_share"],
               steady["renewals_per_s"], rollback["seconds"], rollback["cpu_s"],
               rollback["events_delivered"], rollback["leases_renewed"],
               steady["leases_expired"] + rollback["leases_expired"],
               rollback["rss_mib_before"], rollback["rss_mib_after"], rollback["rss_mib_peak"],
               _or_dash(r.get("presence_kept")), _or_dash(r.get("presence_lost")),
               _or_dash(r.get("presence_longest_gap_s")))
        )  # fmt: skip
    pairs = side_by_side(results, "watchers", lambda run: run["watchers"] == "multiplexed")
    lines += ratio_table(
        "multiplexed / threads (below 1: the multiplexed run took less)",
        pairs,
        [("report s", "report_wall_time_s"), ("ack seen max s", "ack_seen_max_s"),
         ("watches open s", "watchers_connected_s"), ("nodes' CPU s", "nodes_cpu_s")],
    )  # fmt: skip
    sharded = side_by_side(results, "push_processes", lambda run: bool(run.get("push_shards")))
    if sharded:
        lines += [
            "",
            "Side by side, push sharded / one push process (below 1: sharded took less):",
            "",
            "| mode | nodes | pushed | shards | report s | whole process s |",
            "| --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        for r, t in sharded:
            lines.append(
                "| %s | %d | %d | %d | %s | %s |"
                % (r["mode"], r["nodes"], r["pushed"] + r["unreachable"], len(r["push_shards"]),
                   _ratio(r["report_wall_time_s"], t["report_wall_time_s"]),
                   _ratio(r["process_s"], t["process_s"]))
            )  # fmt: skip
    unfinished = [r for r in all_runs if not r.get("finished", True)]
    if unfinished:
        lines += ["", "Did not finish (rollback.yml ended after --playbook-timeout-s):", ""]
        for r in unfinished:
            lines.append(
                "- %s, %d nodes, %s, presence %s: ended after %.0f s"
                % (r["mode"], r["nodes"], r["watchers"], r["presence"], r["process_s"])
            )
    if skipped:
        lines += ["", "Not run: " + "; ".join(skipped) + "."]
    lines += ["", "Silent nodes (no watcher), per run:", ""]
    for r in results:
        silent = ", ".join(r["silent_nodes"])
        lines.append(
            "- %s, %d nodes, %s, presence %s: %s"
            % (r["mode"], r["nodes"], r["watchers"], r.get("presence", "-"), silent)
        )
    return "\n".join(lines) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--sizes", default="1000,5000")
    parser.add_argument("--modes", default="fast,deep")
    parser.add_argument(
        "--watchers",
        default="multiplexed",
        help="threads, multiplexed or both (threads,multiplexed): per size and mode, each "
        "in turn, in this order",
    )
    parser.add_argument(
        "--max-thread-nodes",
        type=int,
        default=MAX_THREAD_NODES,
        help="the threads mode is not run above this many nodes (default %(default)s)",
    )
    parser.add_argument(
        "--worker-processes",
        type=int,
        default=WORKER_PROCESSES,
        help="processes the simulated nodes are shared out to (default %(default)s)",
    )
    parser.add_argument(
        "--presence",
        default="on",
        help="on (each watcher keeps its presence key, as the product's), off (none: the count "
        "as before presence) or both (on,off): per size and mode, each in turn",
    )
    parser.add_argument(
        "--store-members",
        type=int,
        default=1,
        help="etcd members on loopback (default %(default)s; 3: a cluster, the workers "
        "spread over its members)",
    )
    parser.add_argument(
        "--steady-s",
        type=float,
        default=STEADY_S,
        help="seconds the store's steady load is measured, the nodes ready, before the "
        "rollback (default %(default)s)",
    )
    parser.add_argument(
        "--playbook-timeout-s",
        type=float,
        default=1800.0,
        help="rollback.yml is ended after this long and the run reported as not finished "
        "(default %(default)s)",
    )
    parser.add_argument("--silent-pct", type=float, default=5.0)
    parser.add_argument(
        "--ack-wait-s",
        type=float,
        default=60.0,
        help="how long the count waits (rollback_ack_wait_s, rollback_deep_ack_wait_s): the "
        "simulated nodes share one CPU, so their acknowledgements take seconds to come",
    )
    parser.add_argument(
        "--ack-quiet-s",
        type=float,
        help="rollback_ack_quiet_s for the count (default: the playbook's own, 0.5 s): the "
        "count ends once no acknowledgement came for this long",
    )
    parser.add_argument(
        "--push-processes",
        default="",
        help="rollback_push_processes, comma-separated for a run of each side by side "
        "(1: one push process; 0: one per CPU; default: the playbook's own)",
    )
    parser.add_argument(
        "--push-shard-nodes",
        type=int,
        help="rollback_push_shard_nodes: a push to more lagging nodes than this is sharded "
        "(default: the playbook's own, 50)",
    )
    parser.add_argument(
        "--controller-cpus",
        default=CONTROLLER_CPU,
        help="CPUs for rollback.yml and its push processes (taskset list, default "
        "%(default)s; the simulated nodes have CPU " + NODES_CPU + ")",
    )
    parser.add_argument(
        "--out", default=str(REPO / "bench" / "results"), help="directory for the result files"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--bpffs", help=argparse.SUPPRESS)
    parser.add_argument("--state-dir", help=argparse.SUPPRESS)
    parser.add_argument("--stats", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    # Thousands of watch connections: this process and etcd need the descriptors.
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if args.worker:
        return worker_main(args)
    watcher_modes = [w for w in args.watchers.split(",") if w]
    unknown = sorted(set(watcher_modes) - set(WATCHER_MODES))
    if unknown or not watcher_modes:
        parser.error("--watchers: %s; known: %s" % (", ".join(unknown), ", ".join(WATCHER_MODES)))
    if args.worker_processes < 1:
        parser.error("--worker-processes must be 1 or more")
    presence_modes = [p for p in args.presence.split(",") if p]
    unknown = sorted(set(presence_modes) - set(PRESENCE_MODES))
    if unknown or not presence_modes:
        parser.error("--presence: %s; known: on, off" % ", ".join(unknown))
    if args.store_members < 1:
        parser.error("--store-members must be 1 or more")
    if os.geteuid() != 0:
        sys.exit("fence_fanout.py: run as root (bpffs, BPF maps)")
    # A SIGTERM (timeout, a CI job's end) unwinds like an exception, so that every worker,
    # etcd member, mount and file made so far is removed.
    signal.signal(signal.SIGTERM, lambda _signum, _frame: sys.exit(143))
    started = datetime.datetime.now(datetime.timezone.utc)
    load_before = " ".join("%.2f" % v for v in os.getloadavg())
    command = "bench/fence_fanout.py " + " ".join(argv if argv is not None else sys.argv[1:])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = out / ("fence-fanout-%s" % started.strftime("%Y%m%dT%H%M%SZ"))
    results, skipped = [], []
    push_options = [int(value) for value in args.push_processes.split(",") if value] or [None]
    runs = [(w, p, pr) for w in watcher_modes for p in push_options for pr in presence_modes]
    for size in [int(s) for s in args.sizes.split(",")]:
        for mode in args.modes.split(","):
            for watchers, push_processes, presence in runs:
                if watchers == "threads" and size > args.max_thread_nodes:
                    note = "threads at %d nodes, %s (above --max-thread-nodes %d)" % (
                        size, mode, args.max_thread_nodes)  # fmt: skip
                    if note not in skipped:
                        skipped.append(note)
                        log("not run: " + note)
                    continue
                with running_store(args.store_members) as members:
                    results.append(
                        run_size(args, size, mode, watchers, members, push_processes, presence)
                    )
                # After each run: a later run that fails keeps these.
                stem.with_suffix(".json").write_text(json.dumps(results, indent=2) + "\n")
                stem.with_suffix(".md").write_text(
                    render(results, command, started, skipped, load_before)
                )
    sys.stdout.write(render(results, command, started, skipped, load_before))
    log("written: %s.md, %s.json" % (stem, stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
