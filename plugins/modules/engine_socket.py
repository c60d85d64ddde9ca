#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_socket
short_description: Register a model engine's listening socket in a route's slot
description:
  - Finds the TCP socket a model engine listens on (by O(pid) or by the main process of systemd
    O(unit)), waiting up
    to O(timeout) seconds for it to appear, takes a copy of it with C(pidfd_getfd), checks it and
    puts it into
    O(slot) of O(route) in the router's socket map, replacing whatever the slot held in one atomic
    write.
  - The module's own copy of the socket is closed at once, so an engine that exits takes its socket
    out of the map
    and new connections fall back to the proxy by themselves.
  - Refuses a socket that is not TCP, not listening, not of O(family), or not in the router's
    network namespace
    (the namespace of the attached link; the module's own when the router is detached).
  - A route may hold several engines (for example one per GPU), one per slot; each new connection on
    the engine
    path picks one of the live ones by a hash of its addresses and ports.
  - After each change the route's C(slot_limit) is set one above the highest live slot (one write
    of the route entry, which bumps its generation), so the program looks only at the slots in
    use; a socket that closed since only costs that look.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
requirements:
  - Linux 5.6 or later (pidfd_getfd), root or CAP_SYS_PTRACE over the engine
options:
  route:
    description: Name of the route (see M(zerolayer.fleet.route)); it must exist.
    type: str
    required: true
  slot:
    description: Slot of the route to fill or clear, from 0 to 7.
    type: int
    default: 0
  pid:
    description: Process that holds the engine's listening socket. Mutually exclusive with O(unit).
    type: int
  unit:
    description: systemd unit whose MainPID holds the engine's listening socket. Mutually exclusive
      with O(pid).
    type: str
  listen_port:
    description: TCP port the engine listens on. Required when O(state=present).
    type: int
  family:
    description: Address family the socket must have; any when omitted.
    type: str
    choices: [inet, inet6]
  timeout:
    description: Seconds to wait for the engine to start listening.
    type: int
    default: 30
  state:
    description: V(present) registers the socket; V(absent) empties the slot.
    type: str
    choices: [present, absent]
    default: present
seealso:
  - module: zerolayer.fleet.route
  - module: zerolayer.fleet.route_info
extends_documentation_fragment:
  - zerolayer.fleet.router
  - zerolayer.fleet.router.epoch
  - zerolayer.fleet.router.changes
"""

EXAMPLES = r"""
- name: Register the engine of GPU 0 for the chat route
  zerolayer.fleet.engine_socket:
    route: chat
    unit: vllm@0.service
    listen_port: 8000
    slot: 0

- name: Register the engine of GPU 1 by pid, IPv6 socket only
  zerolayer.fleet.engine_socket:
    route: chat
    pid: "{{ engine_pid }}"
    listen_port: 8001
    family: inet6
    slot: 1

- name: Take the engine of GPU 1 out of the route
  zerolayer.fleet.engine_socket:
    route: chat
    slot: 1
    state: absent
"""

RETURN = r"""
cookie:
  description: Socket cookie of the registered socket (null after O(state=absent)).
  returned: always
  type: int
  sample: 16451
route_index:
  description: Index of the route, which selects its slots and counters.
  returned: always
  type: int
  sample: 0
slot:
  description: The slot that was filled or cleared.
  returned: always
  type: int
  sample: 0
socket:
  description: What the registered socket was checked against (family, type, protocol, listening,
    netns_ino, cookie).
  returned: when O(state=present)
  type: dict
  sample: {family: 2, type: 1, protocol: 6, listening: true, netns_ino: 4026531840, cookie: 16451}
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    main_pid_of_unit,
    register_engine_socket,
    unregister_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
    layout_from_params,
    layout_options,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            route=dict(type="str", required=True),
            slot=dict(type="int", default=0),
            pid=dict(type="int"),
            unit=dict(type="str"),
            listen_port=dict(type="int"),
            family=dict(type="str", choices=["inet", "inet6"]),
            timeout=dict(type="int", default=30),
            state=dict(type="str", choices=["present", "absent"], default="present"),
            epoch=dict(type="int"),
            **layout_options(),
        ),
        mutually_exclusive=[("pid", "unit")],
        required_if=[
            ("state", "present", ["pid", "unit"], True),
            ("state", "present", ["listen_port"]),
        ],
        supports_check_mode=True,
    )

    def runner(argv):
        return module.run_command(argv, environ_update={"LANG": "C", "LC_ALL": "C"})

    params = module.params
    try:
        layout = layout_from_params(params)
        if params["state"] == "present":
            pid = (
                params["pid"]
                if params["pid"] is not None
                else main_pid_of_unit(params["unit"], runner)
            )
            result = register_engine_socket(
                layout,
                params["route"],
                pid,
                params["listen_port"],
                slot=params["slot"],
                family=params["family"],
                timeout=params["timeout"],
                check_mode=module.check_mode,
                epoch=params["epoch"],
            )
        else:
            result = unregister_engine_socket(
                layout, params["route"], params["slot"], module.check_mode
            )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    # The node could not ask the rollout store about a new epoch: said, not refused.
    for warning in result.get("warnings", []):
        module.warn(warning)

    output = {
        "changed": result["changed"],
        "cookie": result["cookie"],
        "route_index": result["route_index"],
        "slot": params["slot"],
    }
    if "socket" in result:
        output["socket"] = result["socket"]
    if module._diff:
        output["diff"] = {
            "before": {"cookie": result["before"]},
            "after": {"cookie": result["after"]},
        }
    module.exit_json(**output)


if __name__ == "__main__":
    main()
