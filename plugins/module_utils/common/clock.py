# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Moments in UTC: now, written as ISO 8601 with a Z, read back from text or Unix seconds;
and spans of time as people write them (2h, 30m, 90s, 1h30m).

Every record, event and report of the collection writes its times with format_timestamp
and reads them with parse_timestamp, so that they compare and sort the same everywhere;
every duration given as input (a stage's hold, a progress deadline, a gate's hold,
`--since`) is read with parse_duration.
"""

from __future__ import annotations

import datetime
import math
import re

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

DURATION_PATTERN = re.compile(r"^(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s?)?$")
DURATION_ALLOWED = (
    "whole seconds >= 0 (7200) or a string such as 2h, 30m, 90s or 1h30m (units d, h, m, s)"
)


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


def parse_duration(value, field):
    """Whole seconds from an int or a string like "2h", "30m", "90s", "1h30m", "120"."""
    if isinstance(value, bool):
        raise FleetError(
            "%s must be %s; got %r" % (field, DURATION_ALLOWED, value), {"field": field}
        )
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        if value < 0:
            raise FleetError(
                "%s must be %s; got %r" % (field, DURATION_ALLOWED, value), {"field": field}
            )
        return value
    if isinstance(value, str):
        match = DURATION_PATTERN.match(value.strip())
        if match and value.strip() and any(part is not None for part in match.groups()):
            days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
            return ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    raise FleetError("%s must be %s; got %r" % (field, DURATION_ALLOWED, value), {"field": field})
