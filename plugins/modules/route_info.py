#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: route_info
short_description: Read the routes, engine sockets, counters and state of the sk_lookup router
description:
  - Reads, without changing anything, the router pinned under O(pin_dir) - whether its link is
    attached, the
    program's id and tag, the network namespace; every route with its weight, generation, hash and
    registered engine
    socket cookies per slot; per-route counters summed over CPUs (and, for a route that hashes by
    client, its client addresses per path); and the decision-time histogram
    with p50 and p99.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  name:
    description: Only report the route with this name (an unknown name fails).
    type: str
attributes:
  check_mode:
    description: Can run in check_mode and return the same information.
    support: full
    details: The module never changes anything.
  diff_mode:
    description: Will return details on what has changed (or possibly needs changing in check_mode),
      when in diff mode.
    support: none
notes:
  - Percentiles are upper bounds of log2 buckets - a reported p99 of 4096 ns means at most 4096 ns.
  - C(router.program.run_cnt) and C(run_time_ns) only grow while something keeps run-time statistics
    enabled.
seealso:
  - module: zerolayer.fleet.route
  - module: zerolayer.fleet.router
extends_documentation_fragment:
  - zerolayer.fleet.router
"""

EXAMPLES = r"""
- name: Read the router
  zerolayer.fleet.route_info:
  register: router_info

- name: Show the engine share of the chat route
  ansible.builtin.debug:
    msg: "{{ (router_info.routes | selectattr('name', 'equalto', 'chat') | first).counters }}"

- name: Read one route
  zerolayer.fleet.route_info:
    name: chat
    pin_dir: /sys/fs/bpf/zerolayer
"""

RETURN = r"""
router:
  description: Router state (pin_dir, attached, program, link, maps_pinned) as returned by
    M(zerolayer.fleet.router).
  returned: always
  type: dict
  sample:
    pin_dir: /sys/fs/bpf/zerolayer
    attached: true
    program: {id: 42, tag: 40d0f0c4b441b2b2, name: zerolayer_route, run_cnt: 0, run_time_ns: 0}
    link: {id: 7, prog_id: 42, netns_ino: 4026531840, attached: true}
    maps_pinned: true
fence:
  description: The highest fence epoch this node has seen (0 before its first), and what raised it.
  returned: always
  type: dict
  sample: {epoch: 4, action: fast rollback, at: "2026-12-01T10:02:03Z"}
routes:
  description: Every route (or the one named), ordered by port.
  returned: always
  type: list
  elements: dict
  contains:
    name:
      description: Route name.
      type: str
    port:
      description: Local TCP port.
      type: int
    weight:
      description: Weight in percent.
      type: float
    weight_bp:
      description: Weight in basis points.
      type: int
    generation:
      description: Bumped on every write of the route.
      type: int
    route_index:
      description: Index of the route's slots and counters.
      type: int
    hash:
      description: What the route's split hashes - V(connection) (the 4-tuple) or V(client) (the
        client's address alone; see M(zerolayer.fleet.route)).
      type: str
    clients:
      description:
        - Returned for a route that hashes by client only, on pins of layout 4. The client
          addresses the weight decided at the route's current weight word (weight and opt-in
          bit), by the path they took - C(to_engine) (handed to an engine socket) and C(to_proxy).
        - An address decided at another weight counts again once it connects at this one, so
          after a weight change the counts grow from the clients that come (an earlier stretch
          at the same weight counts too - an address takes the same path at the same weight).
          Clients of a cohort are not counted (their path does not follow the weight). The
          router keeps the 65536 most recently seen addresses of the node; older ones no longer
          count.
      type: dict
      sample: {to_engine: 12, to_proxy: 230}
    slot_limit:
      description: The program looks for engine sockets only in slots below this; kept one
        above the highest registered slot by M(zerolayer.fleet.engine_socket). 0 means not
        known, every slot is looked at.
      type: int
    slots:
      description: Socket cookie of each live registered engine socket, by slot number (as a
        string).
      type: dict
    counters:
      description: lookups, to_engine, to_proxy_by_weight, fallback_no_socket and assign_errors,
        summed over CPUs; on pins with cohorts also to_engine_opt_in (the always_direct cohort's
        connections handed to an engine, a part of to_engine) and to_proxy_opt_out (the
        never_direct cohort's connections, left to the proxy).
      type: dict
    opt_in:
      description: Whether the route's always_direct cohort applies (the opt-in bit of its weight
        word; a rollback clears it with the weight).
      type: bool
    always_direct:
      description: The route's opt-in cohort (source CIDRs) as the router applies it; returned on
        pins with cohorts only.
      type: list
      elements: str
    never_direct:
      description: The route's opt-out cohort (source CIDRs); returned on pins with cohorts only.
      type: list
      elements: str
  sample:
    - name: chat
      port: 8080
      weight: 5
      weight_bp: 500
      generation: 3
      route_index: 0
      hash: connection
      slot_limit: 1
      slots: {"0": 16451}
      counters: {lookups: 2000, to_engine: 97, to_proxy_by_weight: 1903, fallback_no_socket: 0,
        assign_errors: 0, to_engine_opt_in: 0, to_proxy_opt_out: 0}
      opt_in: false
      always_direct: []
      never_direct: []
latency:
  description: Decision time of routed lookups - count, p50_ns, p99_ns and the non-empty log2
    buckets; null when the maps are not pinned. The program times one decision in
    sampled_one_in (chosen by the connection's 4-tuple, so the sample is unbiased), because
    reading the clock costs more than the decision itself; count is the number of timed
    decisions.
  returned: always
  type: dict
  sample: {count: 125, sampled_one_in: 16, p50_ns: 256, p99_ns: 1024, buckets: [{le_ns: 256,
    count: 100}, {le_ns: 512, count: 24}, {le_ns: 1024, count: 1}]}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    FleetError,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    layout_from_params,
    layout_options,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.report import router_report


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str"),
            **layout_options(),
        ),
        supports_check_mode=True,
    )
    try:
        report = router_report(layout_from_params(module.params))
        name = module.params["name"]
        if name is not None:
            report["routes"] = [route for route in report["routes"] if route["name"] == name]
            if not report["routes"]:
                raise FleetError(
                    "name %r is not a known route under %s" % (name, module.params["pin_dir"]),
                    {"field": "name", "value": name},
                )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(changed=False, **report)


if __name__ == "__main__":
    main()
