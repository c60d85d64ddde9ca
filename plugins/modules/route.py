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
    connection's addresses and ports, so a given client address and port always takes the same path)
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
  sample: {name: chat, port: 8080, weight: 5, weight_bp: 500, generation: 3, route_index: 0}
before:
  description: Weight (percent and basis points) and generation before the change; null if the route
    did not exist.
  returned: always
  type: dict
  sample: {weight: 1, weight_bp: 100, generation: 2}
after:
  description: Weight (percent and basis points) and generation after the change; null if the route
    is absent.
  returned: always
  type: dict
  sample: {weight: 5, weight_bp: 500, generation: 3}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import (
    layout_from_params,
    layout_options,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import remove_route, set_route


def _summary(route):
    if route is None:
        return None
    data = route.as_dict()
    return {
        "weight": data["weight"],
        "weight_bp": data["weight_bp"],
        "generation": data["generation"],
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            port=dict(type="int"),
            weight=dict(type="raw"),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            epoch=dict(type="int"),
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
            )
        else:
            result = remove_route(layout, params["name"], module.check_mode)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    # The node could not ask the rollout store about a new epoch: said, not refused.
    for warning in result.get("warnings", []):
        module.warn(warning)

    after = result["after"]
    output = {
        "changed": result["changed"],
        "route": after.as_dict() if after is not None else None,
        "before": _summary(result["before"]),
        "after": _summary(after),
    }
    if module._diff:
        output["diff"] = {
            "before": result["before"].as_dict() if result["before"] is not None else {},
            "after": after.as_dict() if after is not None else {},
        }
    module.exit_json(**output)


if __name__ == "__main__":
    main()
