# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""One read-only snapshot of a router: the shape route_info returns and exporters read."""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils import router_mode
from ansible_collections.zerolayer.fleet.plugins.module_utils.engine_sockets import read_slots
from ansible_collections.zerolayer.fleet.plugins.module_utils.fence import read_fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.metrics import (
    latency_summary,
    read_counters,
    read_latency_buckets,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import missing_pins
from ansible_collections.zerolayer.fleet.plugins.module_utils.router_lifecycle import router_state
from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import read_routes


def route_report(layout, route):
    """A route with its weight (bp and percent), generation, slots and counters."""
    report = route.as_dict()
    report["slots"] = {
        str(slot): cookie for slot, cookie in sorted(read_slots(layout, route.route_index).items())
    }
    report["counters"] = read_counters(layout, route.route_index)
    return report


def router_report(layout):
    """Router state, every route, the decision-time histogram and the node's fence epoch;
    maps absent -> no routes."""
    report = {
        "router": router_state(layout),
        "routes": [],
        "latency": None,
        "fence": router_mode.shown_fence(read_fence(layout.fence_file)),
    }
    if missing_pins(layout):
        return report
    report["routes"] = [route_report(layout, route) for route in read_routes(layout)]
    report["latency"] = latency_summary(read_latency_buckets(layout))
    return report
