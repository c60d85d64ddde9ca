#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: route
short_description: Set the share of new connections a port sends straight to its model engine
description:
  - Creates, changes or removes one route of the sk_lookup router pinned under O(pin_dir).
  - A route maps a local TCP O(port) to a O(weight); that share of new connections (decided by a
    hash of the
    connection's addresses and ports, so a given client address and port always takes the same path;
    or of the client's address alone with O(hash=client))
    goes to the
    engine sockets registered with M(zerolayer.fleet.engine_socket); the rest goes to the proxy
    bound to the port.
  - Each change is one atomic map write that bumps the route's generation; established connections
    never move.
  - Invalid input fails naming the field and the allowed values, before anything is written.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
requirements:
  - The router attached (or at least loaded) with M(zerolayer.fleet.router) under the same
    O(pin_dir).
options:
  name:
    description: Route name, 1-31 characters of letters, digits, C(.), C(_) or C(-).
    type: str
    required: true
  port:
    description:
      - Local TCP port the proxy listens on. Required to create a route; a route's port cannot
        change in place.
    type: int
  weight:
    description:
      - Percentage of new connections sent to the engine, from 0 to 100 with at most two decimals
        (stored as basis points, so V(12.34) is 1234 bp). An integer, a float or a string.
      - Defaults to 0 when the route is created; left unchanged when omitted for an existing route.
    type: raw
  always_direct:
    description:
      - The route's opt-in cohort - client networks (source CIDRs, IPv4 or IPv6, no host bits set,
        e.g. V(10.1.0.0/16) or V(2001:db8::/48)) whose new connections go to the engine at any
        weight while the route has a live engine socket (else to the proxy).
      - V([]) clears it; left unchanged when omitted. Replaces the whole list.
      - Adding to it sends more traffic direct, so it is fenced like a weight raise (O(epoch)).
        A fast rollback clears it together with the weight, in the same single map write; so
        does O(weight=0) given without O(always_direct) (a drain).
      - A prefix that O(never_direct) holds or covers is refused (O(never_direct) wins). At most
        1024 prefixes per address family on the node, every route's lists together.
    type: list
    elements: str
    version_added: 0.3.0
  never_direct:
    description:
      - The route's opt-out cohort - client networks (source CIDRs, as O(always_direct)) whose new
        connections go to the proxy at any weight. Wins over O(always_direct) and the weight.
      - V([]) clears it (fenced like a weight raise, as that sends more traffic direct); left
        unchanged when omitted. Replaces the whole list. A rollback leaves it in place.
    type: list
    elements: str
    version_added: 0.3.0
  hash:
    description:
      - What the route's split hashes. V(connection) - the connection's addresses and ports, each
        new connection decided on its own (a client's connections spread over both paths at the
        weight). V(client) - the client's address alone, with the node's secret seed - at a
        given weight one client takes one path, and one engine socket among several, on all its
        connections (prefix and KV-cache locality, one experience per user).
      - With V(client) the split is one of client addresses, not of connections - clients behind
        one NAT share an address and so a path - and the router notes each address's path, which
        M(zerolayer.fleet.route_info) counts (C(clients)) for the canary's measured split.
      - Left unchanged when omitted; a new route hashes by V(connection). Not fenced, and a
        rollback leaves it as it is (weight 0 sends every client to the proxy either way).
      - V(client) needs the router's map layout 4 and a program that reads it - refused,
        changing nothing, until M(zerolayer.fleet.router) has attached the current object.
    type: str
    choices: [connection, client]
    version_added: 0.3.0
  state:
    description: Whether the route should exist.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: zerolayer.fleet.router
  - module: zerolayer.fleet.engine_socket
extends_documentation_fragment:
  - zerolayer.fleet.router
  - zerolayer.fleet.router.epoch
  - zerolayer.fleet.router.changes
"""

EXAMPLES = r"""
- name: Create the route of the chat service, all traffic still through the proxy
  zerolayer.fleet.route:
    name: chat
    port: 8080
    weight: 0

- name: Canary step, 5 percent of new connections straight to the engine
  zerolayer.fleet.route:
    name: chat
    weight: 5

- name: Fast rollback, no new connection to the engine
  zerolayer.fleet.route:
    name: chat
    weight: 0

- name: Staff networks always straight to the engine, one customer network never
  zerolayer.fleet.route:
    name: chat
    always_direct: [10.20.0.0/16, "2001:db8:20::/48"]
    never_direct: [198.51.100.0/24]

- name: One path per client at the weight (all its connections to the same engine or proxy)
  zerolayer.fleet.route:
    name: chat
    hash: client

- name: Clear the opt-in cohort
  zerolayer.fleet.route:
    name: chat
    always_direct: []

- name: Remove the route
  zerolayer.fleet.route:
    name: chat
    state: absent
"""

RETURN = r"""
route:
  description: The route after the change, or null when it is absent.
  returned: always
  type: dict
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
      description: Weight in basis points (10000 is 100%).
      type: int
    generation:
      description: Bumped on every write of the route.
      type: int
    route_index:
      description: Index of the route's engine slots and counters.
      type: int
    hash:
      description: What the route's split hashes - V(connection) or V(client).
      type: str
      sample: client
    opt_in:
      description: Whether the route's O(always_direct) cohort applies (the opt-in bit of its
        weight word; a rollback clears it).
      type: bool
    always_direct:
      description: The opt-in cohort's networks (empty on pins without cohorts).
      type: list
      elements: str
    never_direct:
      description: The opt-out cohort's networks (empty on pins without cohorts).
      type: list
      elements: str
  sample: {name: chat, port: 8080, weight: 5, weight_bp: 500, generation: 3, route_index: 0,
    hash: connection, opt_in: true, always_direct: [10.20.0.0/16], never_direct: []}
before:
  description: Weight (percent and basis points), generation, hash and cohorts before the change;
    null if the route did not exist.
  returned: always
  type: dict
  sample: {weight: 1, weight_bp: 100, generation: 2, hash: connection, always_direct: [],
    never_direct: []}
after:
  description: Weight (percent and basis points), generation, hash and cohorts after the change;
    null if the route is absent.
  returned: always
  type: dict
  sample: {weight: 5, weight_bp: 500, generation: 3, hash: connection,
    always_direct: [10.20.0.0/16], never_direct: []}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    layout_from_params,
    layout_options,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
    remove_route,
    set_route,
)


def _summary(route, cohorts):
    if route is None:
        return None
    data = route.as_dict()
    summary = {
        "weight": data["weight"],
        "weight_bp": data["weight_bp"],
        "generation": data["generation"],
        "hash": data["hash"],
    }
    summary.update(cohorts or {"always_direct": [], "never_direct": []})
    return summary


def _full(route, cohorts):
    if route is None:
        return None
    data = route.as_dict()
    data["opt_in"] = route.opt_in
    data.update(cohorts or {"always_direct": [], "never_direct": []})
    return data


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            port=dict(type="int"),
            weight=dict(type="raw"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            epoch=dict(type="int"),
            always_direct=dict(type="list", elements="str"),
            never_direct=dict(type="list", elements="str"),
            hash=dict(type="str", choices=["connection", "client"]),
            **layout_options(),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        layout = layout_from_params(params)
        if params["state"] == "present":
            result = set_route(
                layout,
                params["name"],
                params["port"],
                params["weight"],
                module.check_mode,
                epoch=params["epoch"],
                always_direct=params["always_direct"],
                never_direct=params["never_direct"],
                hash_mode=params["hash"],
            )
        else:
            result = remove_route(layout, params["name"], module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    # The node could not ask the rollout store about a new epoch: said, not refused.
    for warning in result.get("warnings", []):
        module.warn(warning)

    after = result["after"]
    cohorts_before = result.get("cohorts_before")
    cohorts_after = result.get("cohorts_after") if after is not None else None
    output = {
        "changed": result["changed"],
        "route": _full(after, cohorts_after),
        "before": _summary(result["before"], cohorts_before),
        "after": _summary(after, cohorts_after),
    }
    if module._diff:
        output["diff"] = {
            "before": _full(result["before"], cohorts_before) or {},
            "after": _full(after, cohorts_after) or {},
        }
    module.exit_json(**output)


if __name__ == "__main__":
    main()
