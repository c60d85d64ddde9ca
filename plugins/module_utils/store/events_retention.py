# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Old rollout events out of the store: every event older than a retention is deleted.

events/<rollout_id>/... gains a key for every transition of every rollout and nothing
rewrites or removes them; kept forever they fill etcd up to its quota, after which etcd
raises its NOSPACE alarm and refuses every write (a rollback's fence included). The
store's exporter runs prune() on each member every hour (store_exporter.EventsPrune).
Members that prune at the same moment only repeat each other's deletes: each delete
compares the key's revision first, so a key already gone is left alone.

  event_time()      when an event happened, from its value or its key (pure)
  expired_events()  which of a page of keys are past the retention (pure)
  prune()           reads the events page by page and deletes the expired ones

An event's time is its `at`. One whose `at` cannot be read falls back to the time its key
carries, where it has one (an emitted event: ~<time_ns>.<random>); one with neither is
kept and counted as undated: nothing says it is old.
"""

from __future__ import annotations

import datetime
import json
import math
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
    parse_timestamp,
    utc_now,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

# Keys read per request: a page of events stays well below etcd's response limits, however
# many events the store has gathered.
PAGE_SIZE = 500
# Deletes per transaction: below etcd's --max-txn-ops (128 by default), which counts the
# compares and the deletes of a transaction separately.
DELETE_BATCH = 100
# An upper bound that keeps the cutoff a date Python can hold, whatever the clock says.
MAX_RETENTION_S = 10000 * 86400
_EMITTED_NAME = re.compile(r"^~(\d{1,20})\.")


def validate_retention(value, field="events_retention_s"):
    """Seconds an event is kept: a finite number above 0 (at most about 27 years)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or not 0 < value < MAX_RETENTION_S
    ):
        raise FleetError(
            "%s must be a number of seconds above 0 and below %d; got %r"
            % (field, MAX_RETENTION_S, value),
            {"field": field, "value": value},
        )
    return float(value)


def event_time(key, value):
    """When the event at key happened (an aware datetime), or None when nothing says."""
    try:
        entry = json.loads(value.decode() if isinstance(value, bytes) else value)
        if isinstance(entry, dict) and entry.get("at") is not None:
            return parse_timestamp(entry["at"], "at")
    except (ValueError, FleetError, OverflowError, OSError):
        pass  # the key may still say
    match = _EMITTED_NAME.match(key.rsplit("/", 1)[-1])
    if match:
        seconds = int(match.group(1)) / 1e9
        return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return None


def expired_events(entries, now, retention_s):
    """([(key, mod_revision)] of the entries older than retention_s at now, undated count).

    entries: (key, mod_revision, value) of event keys. An event exactly retention_s old is
    kept: only older ones go."""
    cutoff = now - datetime.timedelta(seconds=validate_retention(retention_s))
    expired, undated = [], 0
    for key, mod_revision, value in entries:
        at = event_time(key, value)
        if at is None:
            undated += 1
        elif at < cutoff:
            expired.append((key, mod_revision))
    return expired, undated


def delete_events(client, expired, batch=DELETE_BATCH):
    """Delete [(key, mod_revision)]; returns how many were deleted.

    A batch whose compare fails (another member deleted one of its keys first) is retried
    key by key, so one key gone does not keep the others."""
    deleted = 0
    for start in range(0, len(expired), batch):
        keys = expired[start : start + batch]
        if client.delete_if_unchanged(keys):
            deleted += len(keys)
            continue
        deleted += sum(1 for one in keys if client.delete_if_unchanged([one]))
    return deleted


def prune(store, retention_s, now=None, page_size=PAGE_SIZE):
    """Delete every event of the store older than retention_s at now.

    Returns {"deleted", "kept", "undated"}: the events deleted, those kept, and of those
    the ones with no time to judge them by."""
    retention_s = validate_retention(retention_s)
    now = now or utc_now()
    result = {"deleted": 0, "kept": 0, "undated": 0}
    for page in store.client.get_prefix_pages(store.key("events", ""), page_size):
        expired, undated = expired_events(
            ((kv.key, kv.mod_revision, kv.value) for kv in page), now, retention_s
        )
        deleted = delete_events(store.client, expired)
        result["deleted"] += deleted
        result["kept"] += len(page) - deleted
        result["undated"] += undated
    return result
