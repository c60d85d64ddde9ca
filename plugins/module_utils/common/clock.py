# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Moments in UTC: now, written as ISO 8601 with a Z, read back from text or Unix seconds.

Every record, event and report of the collection writes its times with format_timestamp
and reads them with parse_timestamp, so that they compare and sort the same everywhere.
"""

from __future__ import annotations

import datetime
import math
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def utc_now():
    return datetime.datetime.now(datetime.timezone.utc)


def format_timestamp(moment):
    """UTC ISO 8601 with a Z: 2025-03-01T12:00:00Z (fractions kept when present)."""
    text = moment.astimezone(datetime.timezone.utc).replace(tzinfo=None).isoformat()
    return text + "Z"


def parse_timestamp(value, field):
    """A moment from an ISO 8601 string (UTC when no offset) or Unix seconds."""
    allowed = "an ISO 8601 time such as 2025-03-01T12:00:00Z, or Unix seconds"
    if isinstance(value, datetime.datetime):
        moment = value
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        if not math.isfinite(value):
            raise FleetError("%s must be %s; got %r" % (field, allowed, value), {"field": field})
        return datetime.datetime.fromtimestamp(value, datetime.timezone.utc)
    elif isinstance(value, str):
        text = value.strip()
        if re.match(r"^\d+(\.\d+)?$", text):
            return datetime.datetime.fromtimestamp(float(text), datetime.timezone.utc)
        if text.endswith(("Z", "z")):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            raise FleetError(
                "%s must be %s; got %r" % (field, allowed, value), {"field": field}
            ) from None
    else:
        raise FleetError("%s must be %s; got %r" % (field, allowed, value), {"field": field})
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)
    return moment


def seconds_between(start, end):
    return (end - start).total_seconds()
