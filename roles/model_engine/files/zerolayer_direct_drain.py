"""Which direct-path connections an engine must let go after the router lowered a weight.

The router decides once per connection, at the SYN: a weight change or a rollback reaches
new connections only, and a client that pools keep-alive connections (the OpenAI SDK, a
gateway) would stay on the direct path for as long as it keeps sending. So every time a
node lowers a weight (a rollback, a canary step down, a drain) it writes a small marker
file (plugins/module_utils/dataplane/direct_drain.py, the one writer), and the engines' HTTP servers
read it here (the simulator, vLLM's zerolayer_vllm_paths middleware):

- a direct connection that must leave gets "Connection: close" on its next response, so
  a request in flight finishes (a stream to its end) and the client opens a new
  connection, which the router now decides with the new weight;
- one idle for the grace or longer is closed by the server (a FIN, never a reset); the
  grace keeps a connection that is in use from being closed between two of its requests.

Connections that came through the proxy (to the engine's own port) are never touched.

The marker, as JSON:

    {"version": 1,
     "all": {"since_unix": T, "epoch": E, "reason": "fast rollback"},
     "ports": {"8000": {"since_unix": T, "updated_unix": U, "weight_bp": W, "epoch": E,
                        "reason": "canary step down"}},
     "written_unix": W}

"all" is a weight-0 moment for every route (a rollback, the router detached); "ports"
holds the last change of one service port's weight: since_unix is its last lowering,
updated_unix its last write (a raise keeps since_unix). Of the two, the later governs
(the writer keeps every write strictly later than the last, written_unix).
At weight 0 every direct connection leaves; at a lower weight above 0 those first seen
before the lowering leave, and the router decides again for each as it reconnects. A
weight raised again (a new canary) ends the closing: connections made after the lowering
stay, so the marker belongs to the fence epoch that wrote it.

Standard library only: engines run it on nodes without pip.
"""

import json
import os
import threading
import time

MARKER_VERSION = 1
DEFAULT_MARKER_FILE = "/run/zerolayer/direct-drain.json"
# An engine closes an idle direct connection once it has been idle this long.
DEFAULT_IDLE_GRACE_S = 0.5
# A connection the router decided just before a lowering may reach the engine's accept()
# (or, for vLLM, its first request) a moment after it: those are counted as before.
ACCEPT_SLACK_S = 1.0
# How often a reader looks at the marker file again (a stat each time).
RECHECK_S = 0.05


def governing_entry(marker, port):
    """{"since_unix", "weight_bp", "epoch"} of the change that governs service port `port`,
    or None when no weight of it was ever lowered."""
    everything = marker.get("all")
    own = (marker.get("ports") or {}).get(str(port))
    if everything and (own is None or everything["since_unix"] >= own["updated_unix"]):
        return {
            "since_unix": everything["since_unix"],
            "weight_bp": 0,
            "epoch": everything.get("epoch"),
        }
    return own


def must_leave(marker, local_port, first_seen_unix):
    """Whether a direct connection to service port local_port, first seen at
    first_seen_unix (its accept, or its first request), must leave."""
    entry = governing_entry(marker, local_port)
    if entry is None:
        return False
    if entry["weight_bp"] == 0:
        return True
    before = entry["since_unix"] + ACCEPT_SLACK_S
    updated = entry.get("updated_unix", entry["since_unix"])
    if updated > entry["since_unix"]:
        # Raised since the lowering: a connection from after the raise had the new weight.
        before = min(before, updated)
    return first_seen_unix < before


def close_idle_now(marker, local_port, first_seen_unix, in_flight, idle_s, grace_s):
    """Whether the server closes a direct connection now: it must leave, has no request
    in flight, and has been idle for the grace."""
    return in_flight == 0 and idle_s >= grace_s and must_leave(marker, local_port, first_seen_unix)


def parse_marker(text):
    """The marker's dict; {} for anything that is not a marker of this version, so that a
    torn or foreign file never closes a connection."""
    try:
        marker = json.loads(text)
    except ValueError:
        return {}
    if not isinstance(marker, dict) or marker.get("version") != MARKER_VERSION:
        return {}
    return marker


class MarkerFile:
    """The marker as the node last wrote it, read again when the file changes (looked at
    every RECHECK_S at most). A missing file is an empty marker."""

    def __init__(self, path, clock=time.monotonic):
        self.path = path
        self.clock = clock
        self.lock = threading.Lock()
        self.checked_at = None
        self.identity = None
        self.marker = {}

    def current(self):
        with self.lock:
            now = self.clock()
            if self.checked_at is not None and now - self.checked_at < RECHECK_S:
                return self.marker
            self.checked_at = now
            try:
                status = os.stat(self.path)
            except OSError:
                self.identity, self.marker = None, {}
                return self.marker
            identity = (status.st_ino, status.st_mtime_ns, status.st_size)
            if identity != self.identity:
                try:
                    with open(self.path, encoding="utf-8") as handle:
                        self.marker = parse_marker(handle.read())
                except OSError:
                    self.marker = {}
                self.identity = identity
            return self.marker
