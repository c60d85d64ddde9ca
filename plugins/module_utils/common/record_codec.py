# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollout record's file format: what a record must hold to be read, and its JSON codec.

The controller writes the record (rollout/rollout.py decides what is in it), the store keeps
it, and each node keeps a copy that its route exporter reads. The format is the contract
between them, so it lives below both: a node reads its copy without importing the rollout.
"""

from __future__ import annotations

import json
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_text_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

RECORD_FORMAT = 1
OUTCOMES = ("running", "paused", "completed", "rolled_back", "aborted")
RECORD_KEYS = (
    "format",
    "rollout_id",
    "outcome",
    "schedule",
    "stage",
    "nodes",
    "verdicts",
    "transitions",
)

ROLLOUT_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def validate_rollout_id(value, field="rollout_id"):
    if not isinstance(value, str) or not ROLLOUT_ID_PATTERN.match(value):
        raise FleetError(
            "%s must be 1-128 characters of letters, digits, '.', '_', ':' or '-', starting with "
            "a letter or digit; got %r" % (field, value),
            {"field": field},
        )
    return value


def json_text(data):
    """The layout of every JSON file the collection writes (records, gate histories, the
    drill's report): indented, keys sorted, one final newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def encode_record(record):
    return json_text(record)


def decode_record(text, source="record"):
    """A record from JSON text; refuses anything that is not a rollout record of this format."""
    try:
        record = json.loads(text) if isinstance(text, str) else text
    except ValueError as error:
        raise FleetError("%s is not JSON: %s" % (source, error), {"field": "record"}) from None
    if not isinstance(record, dict):
        raise FleetError(
            "%s must be a JSON object (a rollout record)" % source, {"field": "record"}
        )
    missing = [key for key in RECORD_KEYS if key not in record]
    if missing:
        raise FleetError(
            "%s is not a rollout record: missing %s" % (source, ", ".join(missing)),
            {"field": "record"},
        )
    if record["format"] != RECORD_FORMAT:
        raise FleetError(
            "%s has format %r; this collection reads format %d"
            % (source, record["format"], RECORD_FORMAT),
            {"field": "record"},
        )
    if record["outcome"] not in OUTCOMES:
        raise FleetError(
            "%s has outcome %r; allowed: %s" % (source, record["outcome"], ", ".join(OUTCOMES)),
            {"field": "record"},
        )
    validate_rollout_id(record["rollout_id"], "record.rollout_id")
    return record


def read_json_file(path):
    """The decoded JSON of a file, or None when the file does not exist."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise FleetError("cannot read %s: %s" % (path, error.strerror), {"path": path}) from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise FleetError("%s is not valid JSON: %s" % (path, error), {"path": path}) from None


def read_record(path):
    data = read_json_file(path)
    return None if data is None else decode_record(data, path)


def write_json_atomic(path, data):
    write_text_atomic(path, json_text(data))


def write_record(path, record):
    write_json_atomic(path, record)
