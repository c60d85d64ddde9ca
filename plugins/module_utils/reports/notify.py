# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Notifications of rollout events: a generic JSON webhook or a Slack-compatible one.

The sinks are one list kept in the rollout store (config/notifications), so every actor
(the canary's runner, rollback.yml, a person's `zerolayer rollout pause`) tells the same
receivers without a configuration of its own. A sink:

    name: oncall            # letters, digits, '_' and '-'; shown in reports (the url is not)
    url: https://...        # a secret: Slack's incoming-webhook address is its own key
    allow_http: false       # true lets this sink's url be http:// (a receiver on loopback)
    format: json            # json (the event as it is stored) or slack ({"text", "blocks"})
    events: [all]           # event types (rollout_events.EVENT_TYPES) or "all"
    rollouts: ["*"]         # glob patterns of rollout ids; fleet-wide events go to every sink
    headers: {}             # secret too (Authorization, ...)
    timeout_s: 3            # one attempt
    attempts: 3             # tries of one event, with a doubling pause in between

Delivery comes after the act it tells of and never holds it up. The act has already put
its events in the store; it hands them off (hand_off: one store write and a fork) to the
one sender of the fleet, a short-lived process on a lease that sends every sink the events
after its cursor, in the store's order, each tried `attempts` times with a doubling pause,
and ends once every sink is caught up. A receiver that is down or slow delays no act; what
it missed is in its cursor (`zerolayer notifications show`), never raised.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import socket
import threading
import time
import urllib.request

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    format_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (
    StoreUnavailable,
    lease_gone,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.heartbeat import run_detached

FORMATS = ("json", "slack")
SINK_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
SINK_FIELDS = (
    "name", "url", "allow_http", "format", "events", "rollouts", "headers", "timeout_s", "attempts",
)  # fmt: skip
FIRST_RETRY_PAUSE_S = 0.25
DEFAULT_WAIT_S = 5.0


def _bad(message, field):
    return FleetError(message, {"field": field})


def _number(value, field, low, high, integer=False):
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        raise _bad(
            "%s must be a%s number from %s to %s; got %r"
            % (field, "n integer" if integer else "", low, high, value),
            field,
        )
    return value


def validate_sink(raw, field="notifications[0]"):
    """The sink with its defaults, or a FleetError naming the field (never the url)."""
    if not isinstance(raw, dict):
        raise _bad(
            "%s must be a dict with name and url; got %s" % (field, type(raw).__name__), field
        )
    unknown = sorted(set(raw) - set(SINK_FIELDS))
    if unknown:
        raise _bad(
            "%s has unknown keys %s (allowed: %s)"
            % (field, ", ".join(unknown), ", ".join(SINK_FIELDS)),
            field,
        )
    name = raw.get("name")
    if not isinstance(name, str) or not SINK_NAME.match(name):
        raise _bad(
            "%s.name must be 1-64 letters, digits, '_' or '-'; got %r" % (field, name),
            field + ".name",
        )
    allow_http = raw.get("allow_http", False)
    if not isinstance(allow_http, bool):
        raise _bad("%s.allow_http must be true or false; got %r" % (field, allow_http),
                   field + ".allow_http")  # fmt: skip
    url = raw.get("url")
    # The url and the headers are secrets, and the events say what the fleet does: sent in
    # clear only to a receiver a person named as such.
    scheme = r"^https?://[^\s/]+" if allow_http else r"^https://[^\s/]+"
    if not isinstance(url, str) or not re.match(scheme, url):
        raise _bad(
            "%s.url must be an https:// address, or http:// with allow_http: true on this sink "
            "(not shown: it is a secret)" % field,
            field + ".url",
        )
    fmt = raw.get("format", "json")
    if fmt not in FORMATS:
        raise _bad(
            "%s.format must be one of %s; got %r" % (field, ", ".join(FORMATS), fmt),
            field + ".format",
        )
    events = raw.get("events", ["all"])
    if not isinstance(events, list) or not events:
        raise _bad(
            "%s.events must be a non-empty list of event types or [all]" % field, field + ".events"
        )
    if events != ["all"]:
        for index, kind in enumerate(events):
            rollout_events.validate_event_type(kind, "%s.events[%d]" % (field, index))
    rollouts = raw.get("rollouts", ["*"])
    if (
        not isinstance(rollouts, list)
        or not rollouts
        or not all(isinstance(p, str) and p for p in rollouts)
    ):
        raise _bad(
            "%s.rollouts must be a non-empty list of glob patterns of rollout ids" % field,
            field + ".rollouts",
        )
    headers = raw.get("headers", {})
    if not isinstance(headers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
    ):
        raise _bad("%s.headers must be a dict of strings" % field, field + ".headers")
    return {
        "name": name,
        "url": url,
        "allow_http": allow_http,
        "format": fmt,
        "events": list(events),
        "rollouts": list(rollouts),
        "headers": dict(headers),
        "timeout_s": float(_number(raw.get("timeout_s", 3), field + ".timeout_s", 0.1, 60)),
        "attempts": _number(raw.get("attempts", 3), field + ".attempts", 1, 10, integer=True),
    }


def validate_sinks(raw, field="notifications"):
    if not isinstance(raw, list):
        raise _bad("%s must be a list of sinks; got %s" % (field, type(raw).__name__), field)
    sinks = [validate_sink(item, "%s[%d]" % (field, index)) for index, item in enumerate(raw)]
    names = [sink["name"] for sink in sinks]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise _bad("%s: sink names must be unique; twice: %s" % (field, ", ".join(twice)), field)
    return sinks


def redacted(sinks):
    """The sinks as a report or a diff may show them: no url, no header values."""
    return [
        dict(sink, url="<secret>", headers={key: "<secret>" for key in sink["headers"]})
        for sink in sinks
    ]


def config_key(store):
    return store.key("config", "notifications")


def read_config(store):
    """(sinks, revision the configuration was written at); ([], 0) when none are set."""
    kv = store.client.get(config_key(store))
    if kv is None:
        return [], 0
    return validate_sinks(kv.json(), "store key %s" % config_key(store)), kv.mod_revision


def read_sinks(store):
    """The sinks kept in the store ([] when none are set)."""
    return read_config(store)[0]


def write_sinks(store, sinks):
    store.client.put(config_key(store), json.dumps(validate_sinks(sinks), sort_keys=True))


def wants(sink, entry):
    if entry["type"] == "notification_test":
        return True
    if sink["events"] != ["all"] and entry["type"] not in sink["events"]:
        return False
    rollout_id = entry.get("rollout_id")
    if not rollout_id:
        return True
    return any(fnmatch.fnmatchcase(rollout_id, pattern) for pattern in sink["rollouts"])


def body(sink, entry):
    if sink["format"] == "json":
        return dict(entry, source="zerolayer.fleet", summary=rollout_events.summary_line(entry))
    context = "rollout `%s`" % (entry.get("rollout_id") or "fleet")
    if entry.get("wave"):
        context += " · wave `%s`" % entry["wave"]
    context += " · %s" % entry.get("at")
    return {
        "text": rollout_events.summary_line(entry),
        "blocks": [
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": rollout_events.summary_line(entry)},
            },
            {"type": "context", "elements": [{"type": "mrkdwn", "text": context}]},
        ],
    }


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A sink's redirect is its fault, not a second address to send a secret to."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


# The standard library's client (certificates checked against the system's CAs): the
# store's exporter sends from the node artifact, where nothing else is installed.
_OPENER = urllib.request.build_opener(_NoRedirect)


def _post(sink, payload, timeout_s):
    headers = dict(sink["headers"], **{"Content-Type": "application/json"})
    # validate_sink admits https:// addresses, and http:// where a sink allows it (no file:,
    # no other scheme).
    request = urllib.request.Request(  # noqa: S310
        sink["url"], data=json.dumps(payload, sort_keys=True).encode(), headers=headers,
        method="POST",
    )  # fmt: skip
    with _OPENER.open(request, timeout=timeout_s) as response:
        response.read()


def send_one(sink, entry, post=_post, sleep=time.sleep, clock=time.monotonic, deadline=None):
    """One event to one sink, tried sink["attempts"] times with a doubling pause; the outcome."""
    outcome = {"sink": sink["name"], "type": entry["type"], "at": entry.get("at"), "attempts": 0}
    pause = FIRST_RETRY_PAUSE_S
    while outcome["attempts"] < sink["attempts"]:
        left = sink["timeout_s"] if deadline is None else min(sink["timeout_s"], deadline - clock())
        if left <= 0:
            outcome.setdefault("error", "not sent within the wait")
            break
        outcome["attempts"] += 1
        try:
            post(sink, body(sink, entry), left)
        except Exception as exc:  # a receiver's fault is reported, never raised
            outcome["error"] = "%s: %s" % (type(exc).__name__, exc)
        else:
            outcome.pop("error", None)
            outcome["delivered"] = True
            return outcome
        if outcome["attempts"] < sink["attempts"]:
            sleep(pause if deadline is None else min(pause, max(deadline - clock(), 0)))
            pause *= 2
    outcome["delivered"] = False
    return outcome


def _send_in_turn(sink, entries, report, post, sleep, clock, deadline):
    for entry in entries:
        report.append(send_one(sink, entry, post, sleep, clock, deadline))


def deliver(
    entries, sinks, wait_s=DEFAULT_WAIT_S, post=_post, sleep=time.sleep, clock=time.monotonic
):
    """Send entries now to every sink that wants them, waiting at most wait_s; never raises.

    For `zerolayer notifications test`: the acts of a rollout hand their events to the
    sender (hand_off) and do not wait. Returns {"delivered", "failed", "seconds"}.
    """
    started = clock()
    deadline = started + max(float(wait_s), 0.0)
    reports, threads = [], []
    for sink in sinks:
        chosen = [entry for entry in entries if wants(sink, entry)]
        report = []
        reports.append((sink, chosen, report))
        thread = threading.Thread(
            target=_send_in_turn,
            args=(sink, chosen, report, post, sleep, clock, deadline),
            name="notify-%s" % sink["name"],
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    for thread in threads:
        thread.join(max(deadline - clock(), 0) + 0.05)
    outcomes = []
    for sink, chosen, report in reports:
        done = list(report)
        outcomes.extend(done)
        for entry in chosen[len(done) :]:
            outcomes.append(
                {"sink": sink["name"], "type": entry["type"], "at": entry.get("at"),
                 "attempts": 0, "delivered": False, "error": "not sent within the wait"}
            )  # fmt: skip
    failed = [outcome for outcome in outcomes if not outcome["delivered"]]
    return {
        "delivered": len(outcomes) - len(failed),
        "failed": failed,
        "seconds": round(clock() - started, 3),
    }


# ---------------------------------------------------------------- the sender
#
# Each sink has a cursor in the store: the revision of the last event it was sent (or given
# up on after its attempts). One sender at a time, on a lease, sends every sink the events
# after its cursor, oldest first, so every receiver gets them in the store's order, whoever
# wrote them. An act hands its events off (one store write and a fork) and never waits.

SENDER_TTL_S = 10
SENDER_IDLE_S = 2.0


def sender_key(store):
    return store.key("notifications", "sender")


def cursor_key(store, sink_name):
    return store.key("notifications", "cursor", sink_name)


def read_cursor(store, sink_name, config_revision):
    """Where a sink stands; a sink with none starts at its configuration (no old history)."""
    kv = store.client.get(cursor_key(store, sink_name))
    if kv is not None:
        return kv.json()
    return {"revision": config_revision, "delivered": 0, "failed": 0, "last": None}


def pending_events(store, after_revision):
    """[(revision, event)] created after after_revision, in the store's order."""
    found = store.client.get_prefix(store.key("events", ""), min_create_revision=after_revision + 1)
    return sorted(((kv.create_revision, kv.json()) for kv in found), key=lambda item: item[0])


def send_pending(store, sink, config_revision, post=_post, sleep=time.sleep):
    """Send sink what it has not been sent yet; moves its cursor; returns how many were sent."""
    cursor = read_cursor(store, sink["name"], config_revision)
    sent = 0
    for revision, entry in pending_events(store, cursor["revision"]):
        cursor["revision"] = revision
        if not wants(sink, entry):
            continue
        outcome = send_one(sink, entry, post, sleep)
        outcome["sent_at"] = format_timestamp(utc_now())
        cursor["delivered" if outcome["delivered"] else "failed"] += 1
        cursor["last"] = outcome
        if not outcome["delivered"]:
            cursor["last_failure"] = outcome
        store.client.put(cursor_key(store, sink["name"]), json.dumps(cursor, sort_keys=True))
        sent += 1
    return sent


def anything_pending(store):
    sinks, config_revision = read_config(store)
    for sink in sinks:
        cursor = read_cursor(store, sink["name"], config_revision)
        if any(wants(sink, entry) for _r, entry in pending_events(store, cursor["revision"])):
            return True
    return False


def _send_round(store, lease, post, sleep):
    """Every sink's pending events, each sink in a thread; the lease kept alive meanwhile."""
    sinks, config_revision = read_config(store)
    counts = {}

    def send(sink):
        counts[sink["name"]] = send_pending(store, sink, config_revision, post, sleep)

    threads = [threading.Thread(target=send, args=(sink,), daemon=True) for sink in sinks]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(SENDER_TTL_S / 3.0)
            if thread.is_alive() and store.client.keep_alive(lease) <= 0:
                raise SenderLeaseLost("the sender's lease expired", {"field": "lease"})
    return sum(counts.values())


class SenderLeaseLost(FleetError):
    """The sender's lease is gone: another sender may hold the key now."""


def run_sender(store, lease, post=_post, sleep=time.sleep, clock=time.monotonic):
    """Send until every sink is caught up and nothing new came for SENDER_IDLE_S.

    Only a lost lease ends it at once. A store that fails a request (unreachable, or an
    error under load: a timeout, a leader change) is tried again until it has failed for
    SENDER_TTL_S, when the lease is surely gone too."""
    while lease:
        quiet_since = clock()
        failing_since = None
        while True:
            try:
                if store.client.keep_alive(lease) <= 0:
                    return "lease expired"
                if _send_round(store, lease, post, sleep):
                    quiet_since = clock()
                failing_since = None
            except SenderLeaseLost as exc:
                return exc.message
            except FleetError as exc:
                if lease_gone(exc):
                    return exc.message
                failing_since = failing_since or clock()
                if clock() - failing_since > SENDER_TTL_S:
                    return "store unreachable" if isinstance(exc, StoreUnavailable) else exc.message
            # Caught up only by a round that went through, not by rounds the store failed.
            if failing_since is None and clock() - quiet_since >= SENDER_IDLE_S:
                break
            sleep(0.2)
        store.client.revoke_lease(lease)
        # An event written while this sender held the lease found it taken and relied on
        # this sender: look once more now that the lease is gone.
        lease = _take_sender(store) if anything_pending(store) else None
    return "caught up"


def _take_sender(store):
    """A lease on the sender key, or None when another sender holds it."""
    lease = store.client.grant_lease(SENDER_TTL_S)
    holder = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "since": format_timestamp(utc_now()),
    }
    taken, _current = store.client.put_if(sender_key(store), json.dumps(holder), 0, lease=lease)
    if taken:
        return lease
    store.client.revoke_lease(lease)
    return None


def send_now(store, post=_post):
    """Send every sink the events pending, in this thread (a long-running process that has
    nothing else to do meanwhile); never raises: "caught up", "running" (another sender is),
    "none needed" or why it stopped."""
    try:
        sinks, _revision = read_config(store)
        if not sinks:
            return "none needed"
        lease = _take_sender(store)
        if lease is None:
            return "running"
        return run_sender(store, lease, post)
    except FleetError as exc:
        return exc.message


def hand_off(store, post=_post):
    """Make sure a sender will send the events just stored; returns at once, never raises.

    {"sinks": n, "sender": "started" | "running" | "none needed" | "not started", ...}
    """
    try:
        sinks, _revision = read_config(store)
        if not sinks:
            return {"sinks": 0, "sender": "none needed"}
        lease = _take_sender(store)
        if lease is None:
            return {"sinks": len(sinks), "sender": "running"}
        pid = run_detached(lambda: run_sender(store, lease, post))
        return {"sinks": len(sinks), "sender": "started", "pid": pid}
    except FleetError as exc:
        return {"sinks": None, "sender": "not started", "error": exc.message}


def sink_states(store):
    """Each sink with its cursor: delivered and failed counts, the last send, the last failure."""
    sinks, config_revision = read_config(store)
    return [
        dict(sink, cursor=read_cursor(store, sink["name"], config_revision))
        for sink in redacted(sinks)
    ]
