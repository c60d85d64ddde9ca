# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""One read-only snapshot of a router: the shape route_info returns and exporters read."""

from __future__ import annotations

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_mode
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    read_slots,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import read_fence
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
    count_client_addresses,
    latency_summary,
    read_client_entries,
    read_latency_buckets,
    read_route_counters,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import missing_pins
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    HASH_BY_CLIENT,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_lifecycle import (
    router_state,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    has_cohorts,
    read_cohort_entries,
    read_routes,
    route_cohorts,
)


def route_report(layout, route, cohort_entries=None, clients=None):
    """A route with its weight (bp and percent), generation, hash, slots, counters, (layout 3)
    its cohorts: always_direct and never_direct as the program applies them, and for a route
    that hashes by client its client addresses at the current weight per path (clients:
    {to_engine, to_proxy}, from metrics.count_client_addresses)."""
    report = route.as_dict()
    report["slots"] = {
        str(slot): cookie for slot, cookie in sorted(read_slots(layout, route.route_index).items())
    }
    report["counters"], cohort_counters = read_route_counters(layout, route.route_index)
    if cohort_counters is not None:
        report["counters"].update(cohort_counters)
    if cohort_entries is not None:
        report["opt_in"] = route.opt_in
        report.update(route_cohorts(route, cohort_entries))
    if clients is not None:
        report["clients"] = clients
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
    entries = read_cohort_entries(layout) if has_cohorts(layout) else None
    routes = read_routes(layout)
    by_client = [route for route in routes if route.hash_mode == HASH_BY_CLIENT]
    clients = count_client_addresses(read_client_entries(layout), by_client) if by_client else {}
    report["routes"] = [
        route_report(layout, route, entries, clients.get(route.route_index)) for route in routes
    ]
    report["latency"] = latency_summary(read_latency_buckets(layout))
    return report
