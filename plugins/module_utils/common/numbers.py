# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Numbers given as input (a gate's threshold, a measured split's counts), checked once."""

from __future__ import annotations

import math

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError


def parse_number(value, field):
    """A finite number from an int, float or numeric string (booleans refused)."""
    allowed = "a finite number (int, float or numeric string)"
    if isinstance(value, bool):
        raise FleetError("%s must be %s; got %r" % (field, allowed, value), {"field": field})
    try:
        number = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise FleetError(
            "%s must be %s; got %r" % (field, allowed, value), {"field": field}
        ) from None
    if not math.isfinite(number):
        raise FleetError("%s must be %s; got %r" % (field, allowed, value), {"field": field})
    return number
