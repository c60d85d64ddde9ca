# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Where a rollout record lives: the rollout store (one truth for every actor) or a file.

With the store, the record of one wave is the key rollouts/<rollout_id>/<wave>, and every
write is a compare-and-swap on the revision that was read: two actors that change it at the
same time cannot both win, the second is told who changed it. A file (a controller without
a store, and every node's read-only copy) is replaced atomically.
"""

from __future__ import annotations

import os
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    store_from_params,
)

RECORD_KEY_PATTERN = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}/[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
)


def validate_record_key(value, field="record_key"):
    if not isinstance(value, str) or not RECORD_KEY_PATTERN.match(value):
        raise FleetError(
            "%s must be <rollout_id>/<wave>, each 1-128 letters, digits, '.', '_', ':' or '-'; "
            "got %r" % (field, value),
            {"field": field, "value": value},
        )
    return value


def mirror_copies(directory):
    """The controller's copies of a rollout's wave records, {wave: record}, from
    <directory>/<wave>.json (what StoreRecords mirrors, or the records themselves without a
    store); {} when the directory is not there. For reports only: the store is the truth."""
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise FleetError(
            "the record copies in %s cannot be listed: %s" % (directory, exc.strerror),
            {"field": "directory", "path": directory},
        ) from None
    return {
        name[: -len(".json")]: record_codec.read_json_file(os.path.join(directory, name))
        for name in names
        # A dot file is a write in progress (record_codec writes beside, then renames).
        if name.endswith(".json")
        and not name.startswith(".")
        and os.path.isfile(os.path.join(directory, name))
    }


class FileRecords:
    """A record in a JSON file; the token is unused (one controller, one writer)."""

    def __init__(self, path):
        if not path:
            raise FleetError(
                "path is required when no rollout store is given (endpoints)", {"field": "path"}
            )
        self.where = path

    def read(self):
        return record_codec.read_record(self.where), None

    def write(self, record, _token):
        """Returns no events: a file has no history but the record's own transitions."""
        record_codec.write_record(self.where, record)
        return []


class StoreRecords:
    """A record in the rollout store; the token is the mod_revision it was read at.

    mirror, a file path, gets a copy after every write (the controller's local view for
    reports and people; the store stays the one truth every actor reads).
    """

    def __init__(self, store, record_key, mirror=None):
        self.store = store
        self.record_key = validate_record_key(record_key)
        self.where = store.key("rollouts", self.record_key)
        self.mirror = mirror
        # What read() last returned, so that write() can tell what changed: the events.
        self._read = (None, None)

    def read(self):
        kv = self.store.client.get(self.where)
        if kv is None:
            record, token = None, 0
        else:
            record = record_codec.decode_record(kv.value.decode(), self.where)
            token = kv.mod_revision
        self._read = (token, record)
        return record, token

    def write(self, record, token):
        """Compare-and-swap the record and put its events in the same transaction.

        Returns the events written: what changed since the read at token.
        """
        read_token, before = self._read
        if read_token != token:
            # Worked out from a read elsewhere: what it replaces is the record at token, if
            # that is still the stored one (otherwise the swap below fails anyway).
            before, _current = self.read() if token else (None, 0)
        events = rollout_events.record_events(self.record_key, before, record)
        done, current = self.store.client.put_if(
            self.where,
            record_codec.encode_record(record),
            token,
            also=rollout_events.record_event_keys(self.store, self.record_key, token, events),
        )
        if done:
            self._read = (None, None)
            if self.mirror:
                record_codec.write_record(self.mirror, record)
            return events
        other = {}
        if current is not None:
            try:
                other = record_codec.decode_record(current.value.decode(), self.where)
            except FleetError:
                other = {}
        last = (other.get("transitions") or [{}])[-1]
        raise FleetError(
            "the record %s changed while this action was worked out (%s by %s at %s); nothing "
            "was written. Read it again and decide anew."
            % (
                self.where,
                last.get("action", "a change"),
                last.get("by", "?"),
                last.get("at", "?"),
            ),
            {"field": "record", "key": self.where},
        )


def records_from_params(params):
    """The store's records when endpoints are given, else the file at path."""
    if params.get("endpoints"):
        if not params.get("record_key"):
            raise FleetError(
                "record_key (<rollout_id>/<wave>) is required with a rollout store (endpoints)",
                {"field": "record_key"},
            )
        return StoreRecords(store_from_params(params), params["record_key"], params.get("path"))
    return FileRecords(params.get("path"))


def list_records(store, rollout_id=None):
    """{"<rollout_id>/<wave>": record} of every record in the store (or of one rollout)."""
    prefix = store.key("rollouts", rollout_id, "") if rollout_id else store.key("rollouts", "")
    found = {}
    for kv in store.client.get_prefix(prefix):
        name = kv.key[len(store.key("rollouts", "")) :]
        found[name] = record_codec.decode_record(kv.value.decode(), kv.key)
    return found
