# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollout store's state in the Prometheus text exposition format (docs/metrics.md).

The route exporter on a node sees that node's copy of a record; only the store knows
whether a rollout still has a runner (its owner key, on a lease kept alive by the
runner's heartbeat), since when a wave is paused, and the fleet's fence epoch. This is
zerolayer-store-exporter, run on each member of the store by the rollout_store role:

  read_store()  one look at the store: the fence, the owners with their leases' time
                left, the records (the only part that does I/O)
  store_state() what those keys say, per wave (pure)
  render()      the exposition text of that state (pure, exposition.py's samples)
  serve()       the HTTP server: one look at the store per scrape
  watch_deadlines()  every few seconds, each wave past its progress deadline announced
                once (a `stuck` event in the store) and, where its record asks and this
                exporter may, aborted
  EventsPrune   every hour, the events older than the retention deleted
                (store/events_retention.py), so the store does not grow to its quota

A key the exporter does not understand (a record of another format, an owner that is not
JSON) is counted in zerolayer_rollout_store_unreadable_keys and left out; the other waves
are still exported. A store that cannot be read gives zerolayer_rollout_store_up 0 and
nothing else: an outage must not look like "no rollout, no owner".

The exporter's store user reads only what it exports (the fence, the owners, the records,
the watchers' presence) and writes only the events; it cannot read the notification sinks
(config/notifications: their urls and headers are secrets), so it sends nothing to them.
Whoever must know of a stuck wave now is paged by ZerolayerRolloutStuck (this exporter's
zerolayer_rollout_store_wave_stuck, through Alertmanager); the sinks get the `stuck` event
from the fleet's next sender (notify.hand_off), in the store's order.
"""

from __future__ import annotations

import json
import socket
import sys
import threading

from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    parse_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import (
    rollout,
    rollout_ops,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    validate_record_key,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import (
    events_retention,
    rollout_events,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    read_presence,
)

DEFAULT_PORT = 9465
DEFAULT_ADDRESS = exposition.DEFAULT_ADDRESS
# Keys a member's store.json may hold (the nodes' store.json layout, plus timeout).
CONFIG_KEYS = ("endpoints", "ca", "cert", "key", "user", "password_file", "prefix", "timeout")

_HELP = {
    "zerolayer_rollout_store_up": "1 when this scrape read the rollout store; 0 when it could "
    "not (then no other store series)",
    "zerolayer_rollout_store_unreadable_keys": "Keys under the store's prefix that are not what "
    "the fleet writes there (left out of the other series)",
    "zerolayer_rollout_store_fence_epoch": "The fleet's fence epoch in the store (0 before the "
    "first rollback or abort)",
    "zerolayer_rollout_store_alarm_active": "Members of the store that have raised this etcd "
    "alarm (NOSPACE: the store refuses every write until it is disarmed)",
    "zerolayer_rollout_store_wave_info": "A wave's record in the store and its outcome",
    "zerolayer_rollout_store_wave_running": "1 while the wave's record is running and not paused",
    "zerolayer_rollout_store_wave_paused": "1 while the wave is paused",
    "zerolayer_rollout_store_wave_paused_since_timestamp_seconds": "Unix time the wave was "
    "paused (only while it is)",
    "zerolayer_rollout_store_wave_owned": "1 while a runner holds a scope for the wave's "
    "rollout (its owner key and lease exist)",
    "zerolayer_rollout_store_wave_owner_lease_remaining_seconds": "Seconds left on the owner's "
    "lease (the heartbeat renews it every third of its TTL; -1 once it expired)",
    "zerolayer_rollout_store_wave_owner_lease_ttl_seconds": "The TTL the owner's lease was "
    "granted with (canary_owner_ttl)",
    "zerolayer_rollout_store_wave_fence_epoch": "The fence epoch the wave took when it was "
    "planned or resumed (a running wave below the fleet's was fenced by a rollback)",
    "zerolayer_rollout_store_wave_last_progress_timestamp_seconds": "Unix time of the wave's "
    "last record write (its last recorded progress)",
    "zerolayer_rollout_store_wave_progress_deadline_seconds": "How long the wave may go "
    "without progress and without an owner before it is stuck (canary_progress_deadline)",
    "zerolayer_rollout_store_wave_stuck": "1 while the wave is running with no live owner and "
    "no recorded progress for longer than its progress deadline",
    "zerolayer_rollout_store_watchers_present": "Nodes whose fence watcher keeps its presence "
    "key in the store (running, its watch loop turning)",
    "zerolayer_rollout_store_watcher_present": "1 while the node's fence watcher keeps its "
    "presence key in the store; 0 for a node this exporter knows whose watcher does not",
}


class StoreExporterError(FleetError):
    """A bad command line or store settings file."""


# Reading the store


def read_store(store):
    """The raw keys of one look: {"fence", "owners", "records"}; raises when the store fails.

    fence: the fence key's value (bytes) or None; owners: [(scope, value, seconds left on
    its lease or None without one)]; records: [(record key, value)].
    """
    fence = store.client.get(store.key("fence"))
    owners_prefix = store.key("owners", "")
    owners = []
    for kv in store.client.get_prefix(owners_prefix):
        left = store.client.lease_ttl(kv.lease) if kv.lease else None
        owners.append((kv.key[len(owners_prefix) :], kv.value, left))
    records_prefix = store.key("rollouts", "")
    records = [
        (kv.key[len(records_prefix) :], kv.value) for kv in store.client.get_prefix(records_prefix)
    ]
    return {"fence": None if fence is None else fence.value, "owners": owners, "records": records}


def watcher_state(present, known):
    """{node: 1 present, 0 not} of the nodes present and those known (sorted)."""
    present = set(present)
    return {node: 1 if node in present else 0 for node in sorted(present | set(known))}


# The alarms etcd has (etcdserverpb.AlarmType): each is exported, 0 while not raised, so a
# rule can tell "no alarm" from "not read".
ALARMS = ("NOSPACE", "CORRUPT")


def read_alarms(store):
    """{alarm: members that raised it} of the store's alarms; every one of ALARMS is there.

    NOSPACE is raised when a member's database reached --quota-backend-bytes; from then on
    the store refuses every write (puts, transactions, leases), a rollback's fence too, until
    an operator frees space and disarms it (docs/runbook.md#rollout-store-no-space)."""
    answer = store.client.call("/v3/maintenance/alarm", {"action": "GET"})
    counts = dict.fromkeys(ALARMS, 0)
    for entry in answer.get("alarms") or []:
        name = entry.get("alarm") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name != "NONE":
            counts[name] = counts.get(name, 0) + 1
    return counts


def collect(store, now=None, known=None):
    """store_state() of one look at the store with its alarms and its watchers, or
    {"up": False, "error"} when it failed.

    known: a set of the nodes this exporter has seen present, kept across scrapes (the
    nodes seen present are added to it): with the nodes of the unfinished waves, the
    nodes whose watcher_present is exported 0 when their presence is gone. A presence
    key lives on its watcher's lease, so a node whose watcher died is otherwise unknown."""
    try:
        state = store_state(read_store(store), now)
        state["alarms"] = read_alarms(store)
        # A user that may not read presence/ (a role of a release before it): its series
        # are left out, never the whole scrape.
        present = read_presence(store)
        if present is not None:
            if known is not None:
                known.update(present)
            state["watchers"] = watcher_state(present, set(state["wave_nodes"]) | set(known or ()))
    except FleetError as exc:  # StoreUnavailable, or the store refused (permission denied)
        state = {"up": False, "error": exc.message}
    state["node_artifact"] = exposition.node_artifact_version()
    return state


# What the keys say (pure)


def _json(value):
    return json.loads(value.decode() if isinstance(value, bytes) else value)


def _fence_epoch(value):
    """The fence's epoch (0 without a fence), or None when the key holds something else."""
    if value is None:
        return 0
    try:
        fence = _json(value)
    except ValueError:
        return None
    epoch = fence.get("epoch") if isinstance(fence, dict) else None
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        return None
    return epoch


def _owners_by_rollout(owners):
    """({rollout_id: (seconds left, granted TTL)}, unreadable count).

    An owner names the rollout it runs, not a wave: every wave of that rollout is owned.
    Of two scopes held for one rollout, the lease with the most time left counts.
    """
    found, unreadable = {}, 0
    for _scope, value, left in owners:
        try:
            holder = _json(value)
        except ValueError:
            unreadable += 1
            continue
        rollout_id = holder.get("rollout_id") if isinstance(holder, dict) else None
        if not isinstance(rollout_id, str) or not rollout_id:
            unreadable += 1
            continue
        remaining = -1 if left is None else left
        granted = holder.get("ttl_s")
        if isinstance(granted, bool) or not isinstance(granted, int):
            granted = None
        if rollout_id not in found or remaining > found[rollout_id][0]:
            found[rollout_id] = (remaining, granted)
    return found, unreadable


def paused_since(record):
    """Unix time of the pause the wave is in: its last pause transition (None: not paused).

    A record paused without a pause transition (none is written that way) falls back to
    its last change, so the wave is never exported as paused since the epoch.
    """
    if not record.get("paused"):
        return None
    at = record["updated_at"]
    for entry in reversed(record["transitions"]):
        if entry.get("action") == "pause":
            at = entry["at"]
            break
    return parse_timestamp(at, "transitions[].at").timestamp()


def wave_state(record_key, record, owners, now, fence_epoch=None):
    """The exported view of one wave's decoded record; owners from _owners_by_rollout."""
    rollout_id, wave = validate_record_key(record_key).split("/", 1)
    outcome = record["outcome"]
    state = {"rollout_id": rollout_id, "wave": wave, "outcome": outcome}
    if outcome in rollout.FINISHED:
        return state
    paused = record.get("paused") is True or outcome == "paused"
    owner = owners.get(rollout_id)
    taken = record.get("fence_epoch")
    state.update(
        running=outcome == "running" and not paused,
        paused=paused,
        paused_since=paused_since(record) if paused else None,
        owned=owner is not None,
        lease_remaining_s=owner[0] if owner else None,
        lease_ttl_s=owner[1] if owner else None,
        fence_epoch=taken if isinstance(taken, int) and not isinstance(taken, bool) else None,
    )
    # A key left with no lease (-1) or one that expired is no live owner.
    progress = rollout.progress_state(record, owner is not None and owner[0] >= 0, now, fence_epoch)
    state.update(
        last_progress=parse_timestamp(progress["last_progress_at"], "updated_at").timestamp(),
        deadline_s=progress["deadline_s"],
        stuck=progress["stuck"],
        abort_when_stuck=progress["abort"],
    )
    return state


def store_state(raw, now=None):
    """What read_store()'s keys say at now: {up, fence_epoch, unreadable, waves: [wave_state],
    wave_nodes: the sorted nodes of the unfinished waves}."""
    now = now or utc_now()
    owners, unreadable = _owners_by_rollout(raw["owners"])
    fence_epoch = _fence_epoch(raw["fence"])
    if fence_epoch is None:
        unreadable += 1
    waves = []
    wave_nodes = set()
    for record_key, value in sorted(raw["records"]):
        try:
            record = record_codec.decode_record(
                value.decode() if isinstance(value, bytes) else value, record_key
            )
            waves.append(wave_state(record_key, record, owners, now, fence_epoch))
            if "running" in waves[-1]:  # unfinished: its nodes are expected to watch
                wave_nodes.update(node for node in record.get("nodes") or {})
        except (FleetError, KeyError, IndexError, TypeError, ValueError, AttributeError):
            unreadable += 1
    return {
        "up": True,
        "fence_epoch": fence_epoch,
        "unreadable": unreadable,
        "waves": waves,
        "wave_nodes": sorted(wave_nodes),
    }


# Rendering (pure)


def _family(lines, name, samples):
    """One gauge family with this exporter's HELP, in exposition.py's format."""
    exposition._family(
        lines,
        name,
        "gauge",
        [exposition._sample(name, labels, value) for labels, value in samples],
        _HELP[name],
    )


def render(state):
    """The exposition text of a collect() result."""
    lines = []
    if state.get("node_artifact"):
        exposition.render_node_artifact(lines, state["node_artifact"])
    _family(lines, "zerolayer_rollout_store_up", [([], 1 if state["up"] else 0)])
    if not state["up"]:
        return "\n".join(lines) + "\n"
    _family(lines, "zerolayer_rollout_store_unreadable_keys", [([], state["unreadable"])])
    if state["fence_epoch"] is not None:
        _family(lines, "zerolayer_rollout_store_fence_epoch", [([], state["fence_epoch"])])
    if state.get("alarms") is not None:
        _family(
            lines,
            "zerolayer_rollout_store_alarm_active",
            [([("alarm", name)], count) for name, count in sorted(state["alarms"].items())],
        )
    watchers = state.get("watchers")
    if watchers is not None:
        _family(lines, "zerolayer_rollout_store_watchers_present", [([], sum(watchers.values()))])
        if watchers:
            _family(
                lines,
                "zerolayer_rollout_store_watcher_present",
                [([("node", node)], value) for node, value in watchers.items()],
            )
    waves = state["waves"]

    def per_wave(name, value_of, only=lambda wave: True, extra=()):
        samples = [
            (
                [("rollout_id", wave["rollout_id"]), ("wave", wave["wave"])]
                + [(label, wave[label]) for label in extra],
                value_of(wave),
            )
            for wave in waves
            if only(wave)
        ]
        if samples:
            _family(lines, name, samples)

    def unfinished(wave):
        return "running" in wave

    per_wave("zerolayer_rollout_store_wave_info", lambda wave: 1, extra=("outcome",))
    per_wave("zerolayer_rollout_store_wave_running", lambda w: 1 if w["running"] else 0, unfinished)
    per_wave("zerolayer_rollout_store_wave_paused", lambda w: 1 if w["paused"] else 0, unfinished)
    per_wave(
        "zerolayer_rollout_store_wave_paused_since_timestamp_seconds",
        lambda wave: wave["paused_since"],
        lambda wave: unfinished(wave) and wave["paused_since"] is not None,
    )
    per_wave("zerolayer_rollout_store_wave_owned", lambda w: 1 if w["owned"] else 0, unfinished)
    per_wave(
        "zerolayer_rollout_store_wave_owner_lease_remaining_seconds",
        lambda wave: wave["lease_remaining_s"],
        lambda wave: unfinished(wave) and wave["owned"],
    )
    per_wave(
        "zerolayer_rollout_store_wave_owner_lease_ttl_seconds",
        lambda wave: wave["lease_ttl_s"],
        lambda wave: unfinished(wave) and wave["owned"] and wave["lease_ttl_s"] is not None,
    )
    per_wave(
        "zerolayer_rollout_store_wave_fence_epoch",
        lambda wave: wave["fence_epoch"],
        lambda wave: unfinished(wave) and wave["fence_epoch"] is not None,
    )
    per_wave(
        "zerolayer_rollout_store_wave_last_progress_timestamp_seconds",
        lambda wave: wave["last_progress"],
        unfinished,
    )
    per_wave(
        "zerolayer_rollout_store_wave_progress_deadline_seconds",
        lambda wave: wave["deadline_s"],
        lambda wave: unfinished(wave) and wave["deadline_s"] is not None,
    )
    per_wave("zerolayer_rollout_store_wave_stuck", lambda w: 1 if w["stuck"] else 0, unfinished)
    return "\n".join(lines) + "\n"


# The progress deadline: who announces a stuck wave, and aborts it where asked
#
# Every member's exporter looks; the event's key names the wave and its last progress, and
# is created only where absent, so of all members exactly one announces each episode (a
# wave that moves and sticks again is a new one), and only that one aborts.

DEADLINE_WATCH_INTERVAL_S = 10.0


def _stuck_event_key(store, record_key, last_progress_at):
    rollout_id, wave = record_key.split("/", 1)
    stamp = last_progress_at.replace("-", "").replace(":", "")
    return store.key("events", rollout_id, "%s.stuck.%s" % (wave, stamp))


def _stuck_event(record_key, record, progress, now, actor, action):
    rollout_id, wave = record_key.split("/", 1)
    summary = rollout.summary(record, now)
    return rollout_events.event(
        "stuck",
        rollout_id,
        format_timestamp(now),
        actor,
        wave=wave,
        stage=summary["stage_number"],
        weight=summary["weight"],
        nodes=list(record.get("nodes") or {}),
        reason="no progress for %ds (deadline %ds) and no runner owns it"
        % (progress["idle_s"], progress["deadline_s"]),
        last_progress_at=progress["last_progress_at"],
        deadline_s=progress["deadline_s"],
        action=action,
    )


def watch_deadlines(store, may_abort=False, now=None, actor=None):
    """One look for stuck waves; each announced once (its `stuck` event) and, when its record
    asks for it (canary_progress_deadline_abort) and may_abort, its rollout aborted (the fence
    raised: every node's watcher puts it at weight 0). Returns [{record_key, action}] of what
    this call announced. Nothing is sent to the notification sinks from here (the module's
    docstring says why)."""
    now = now or utc_now()
    actor = actor or "zerolayer-store-exporter@%s" % socket.gethostname()
    raw = read_store(store)
    owners, _unreadable = _owners_by_rollout(raw["owners"])
    fence_epoch = _fence_epoch(raw["fence"])
    announced = []
    for record_key, value in sorted(raw["records"]):
        try:
            record = record_codec.decode_record(
                value.decode() if isinstance(value, bytes) else value, record_key
            )
            rollout_id = validate_record_key(record_key).split("/", 1)[0]
        except (FleetError, TypeError, ValueError):
            continue  # counted as unreadable by the scrape
        owner = owners.get(rollout_id)
        progress = rollout.progress_state(
            record, owner is not None and owner[0] >= 0, now, fence_epoch
        )
        if not progress["stuck"]:
            continue
        action = "abort" if progress["abort"] and may_abort else "announce"
        if progress["abort"] and not may_abort:
            action = "announce (abort asked, but this exporter may not abort)"
        entry = _stuck_event(record_key, record, progress, now, actor, action)
        key = _stuck_event_key(store, record_key, progress["last_progress_at"])
        taken, _revision = store.client.put_if(key, json.dumps(entry), 0)
        if not taken:
            continue  # another member announced this episode
        if action == "abort":
            rollout_ops.abort(
                store, rollout_id, "stuck past its progress deadline (%ss)"
                % progress["deadline_s"], actor,
            )  # fmt: skip
        announced.append({"record_key": record_key, "action": action})
    return announced


class DeadlineWatch(threading.Thread):
    """watch_deadlines() every interval until stop(); a failure is logged when it changes."""

    def __init__(self, store, may_abort, interval_s=DEADLINE_WATCH_INTERVAL_S, log=None):
        super().__init__(name="deadline-watch", daemon=True)
        self.store, self.may_abort, self.interval_s = store, may_abort, interval_s
        self.log = log or (lambda line: sys.stderr.write(line + "\n"))
        self.stopped = threading.Event()
        self.last_error = None

    def run(self):
        while not self.stopped.wait(self.interval_s):
            try:
                for done in watch_deadlines(self.store, self.may_abort):
                    self.log("stuck: %s, %s" % (done["record_key"], done["action"]))
                error = None
            except FleetError as exc:
                error = exc.message
            if error != self.last_error:
                self.log("deadline watch: %s" % (error or "store read again"))
                self.last_error = error

    def stop(self):
        self.stopped.set()


# The events' retention: every member prunes, an hour apart; a delete already done by another
# member is skipped (events_retention.delete_events compares each key's revision).

EVENTS_PRUNE_INTERVAL_S = 3600.0
# The first prune waits a little: the exporter has just started, with the member often
# (re)started just before it by the same run of the role.
EVENTS_PRUNE_FIRST_S = 60.0


class EventsPrune(threading.Thread):
    """events_retention.prune() every interval until stop(); logs what it deleted, and a
    failure when it changes."""

    def __init__(
        self,
        store,
        retention_s,
        interval_s=EVENTS_PRUNE_INTERVAL_S,
        first_s=EVENTS_PRUNE_FIRST_S,
        log=None,
    ):
        super().__init__(name="events-prune", daemon=True)
        self.store = store
        self.retention_s = events_retention.validate_retention(retention_s, "retention_s")
        self.interval_s, self.first_s = interval_s, first_s
        self.log = log or (lambda line: sys.stderr.write(line + "\n"))
        self.stopped = threading.Event()
        self.last_error = None

    def prune_once(self):
        try:
            done = events_retention.prune(self.store, self.retention_s)
            error = None
            if done["deleted"]:
                self.log(
                    "events pruned: %d older than %.0f s deleted, %d kept"
                    % (done["deleted"], self.retention_s, done["kept"])
                )
        except FleetError as exc:
            error = exc.message
        except ValueError as exc:  # a key that is not UTF-8: the thread must live on
            error = "the store's answer cannot be read: %s" % exc
        if error != self.last_error:
            self.log("events prune: %s" % (error or "store read again"))
            self.last_error = error

    def run(self):
        wait = self.first_s
        while not self.stopped.wait(wait):
            self.prune_once()
            wait = self.interval_s

    def stop(self):
        self.stopped.set()


# Settings


def store_from_config(path, timeout=None):
    """The rollout store as a store.json names it (the nodes' layout: endpoints, ca, cert,
    key, user, password_file, prefix; timeout optional)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
        store_from_params,
    )

    try:
        with open(path) as handle:
            settings = json.load(handle)
    except (OSError, ValueError) as exc:
        raise StoreExporterError(
            "store config %s cannot be read: %s" % (path, exc), {"field": "store_config"}
        ) from None
    if not isinstance(settings, dict):
        raise StoreExporterError(
            "store config %s must be a JSON object with the keys %s"
            % (path, ", ".join(CONFIG_KEYS)),
            {"field": "store_config"},
        )
    unknown = sorted(set(settings) - set(CONFIG_KEYS))
    if unknown:
        raise StoreExporterError(
            "store config %s has unknown key(s) %s; allowed: %s"
            % (path, ", ".join(unknown), ", ".join(CONFIG_KEYS)),
            {"field": "store_config"},
        )
    if not settings.get("endpoints"):
        raise StoreExporterError(
            "store config %s names no endpoints (a list of https://host:port URLs)" % path,
            {"field": "endpoints"},
        )
    names = {"ca": "ca_file", "cert": "cert_file", "key": "key_file"}
    params = {names.get(key, key): value for key, value in settings.items()}
    if timeout is not None:
        params["timeout"] = timeout
    return store_from_params(params)


# HTTP server


class StoreReader(exposition.LoggedReader):
    """collect() of one store per scrape; a failure is logged when its reason changes."""

    def __init__(self, store, log=None):
        # The nodes seen present since this exporter started (collect's known).
        self.known_nodes = set()
        super().__init__(
            lambda: collect(store, known=self.known_nodes),
            "rollout store not read",
            "rollout store read again",
            log,
        )
        self.store = store


def make_handler(read_state):
    """The /metrics handler: render(read_state()) on every GET of /metrics or /."""
    return exposition.metrics_handler(lambda: render(read_state()), "zerolayer-store-exporter")


def serve(store, address=DEFAULT_ADDRESS, port=DEFAULT_PORT, ready=None, watch=None, prune=None):
    """Serve /metrics until interrupted; ready(server) is called once it listens.

    watch: a DeadlineWatch run beside the server (None: no deadline watch); prune: an
    EventsPrune (None: events are kept)."""
    server = exposition.metrics_server(address, port, make_handler(StoreReader(store)))
    beside = [thread for thread in (watch, prune) if thread is not None]
    for thread in beside:
        thread.start()
    try:
        if ready is not None:
            ready(server)
        server.serve_forever()
    finally:
        for thread in beside:
            thread.stop()
        server.server_close()


def build_parser():
    import argparse

    parser = argparse.ArgumentParser(
        prog="zerolayer-store-exporter",
        description="Serve the rollout store's rollouts, owners and fence as Prometheus "
        "metrics on /metrics.",
    )
    parser.add_argument(
        "--store-config",
        required=True,
        help="JSON settings of the store client: endpoints, ca, cert, key, user, "
        "password_file, prefix (written by the rollout_store role)",
    )
    parser.add_argument(
        "--listen-address",
        default=DEFAULT_ADDRESS,
        help="IPv4 or IPv6 address to listen on (default %(default)s; 0.0.0.0 for all)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="seconds each request to the store may take (default: the settings' timeout, "
        "else 3); keep it below Prometheus' scrape timeout",
    )
    parser.add_argument(
        "--deadline-watch-interval",
        type=float,
        default=DEADLINE_WATCH_INTERVAL_S,
        help="seconds between looks for waves stuck past their progress deadline, each "
        "announced once by a stuck event in the store (default %(default)s; 0 turns it off)",
    )
    parser.add_argument(
        "--events-retention-days",
        type=float,
        default=0.0,
        help="delete the store's events older than this many days, every hour "
        "(default 0: keep every event); needs readwrite on the store's events/",
    )
    parser.add_argument(
        "--abort-stuck",
        action="store_true",
        help="abort a stuck wave's rollout where its record asks for it "
        "(canary_progress_deadline_abort); needs the store role that may raise the fence",
    )
    return parser


def exporter_main(argv=None):
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 1 <= args.port <= 65535:
        parser.error("--port must be a TCP port number from 1 to 65535; got %d" % args.port)
    if args.timeout is not None and not args.timeout > 0:
        parser.error("--timeout must be a number of seconds above 0; got %s" % args.timeout)
    if not args.deadline_watch_interval >= 0:
        parser.error(
            "--deadline-watch-interval must be seconds >= 0 (0: off); got %s"
            % args.deadline_watch_interval
        )
    max_days = events_retention.MAX_RETENTION_S // 86400
    if not 0 <= args.events_retention_days < max_days:
        parser.error(
            "--events-retention-days must be days from 0 (keep every event) to below %d; got %s"
            % (max_days, args.events_retention_days)
        )
    try:
        store = store_from_config(args.store_config, args.timeout)
        watch = prune = None
        if args.deadline_watch_interval > 0:
            watch = DeadlineWatch(store, args.abort_stuck, args.deadline_watch_interval)
        if args.events_retention_days > 0:
            prune = EventsPrune(store, args.events_retention_days * 86400.0)
        serve(store, args.listen_address, args.port, watch=watch, prune=prune)
    except (FleetError, OSError) as exc:
        message = getattr(exc, "message", None) or str(exc)
        sys.stderr.write("zerolayer-store-exporter: %s\n" % message)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
