#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: router
short_description: Attach, upgrade or remove the sk_lookup router of a network namespace
description:
  - Loads the compiled sk_lookup router object with C(bpftool), pins the program and its maps under
    O(pin_dir)
    and attaches it to a network namespace through a pinned BPF link.
  - When the program pinned there has a different tag than O(object), the new program is swapped
    into the existing
    link atomically (C(BPF_LINK_UPDATE)); the maps are kept, so routes, weights, engine sockets and
    counters survive.
  - V(detached) is the deep rollback. It raises the node's fence (see O(epoch)), records the router
    mode C(detached) in O(fence_file), force-detaches the link (the kernel then delivers every
    connection to whoever binds the port, the proxy) and removes the program and map pins and
    O(pin_dir). It is the same action as C(zerolayer-routectl detach).
  - V(absent) is another name for V(detached), one and the same deep rollback; a node cannot drop
    its router without keeping it detached.
  - The detached mode is sticky, because a deep rollback is for a program that misbehaves in the
    kernel. It lives in O(fence_file), outside bpffs, so a reboot keeps it; O(state=attached), the
    boot unit C(zerolayer-routectl attach), C(systemctl restart zerolayer-router) and every run of
    the C(zerolayer.fleet.ebpf_router) role leave the router detached and say so (a warning here,
    O(state=attached) then returns ok, not changed, with RV(kept_detached)). Only O(restore=true)
    attaches it again (C(zerolayer-routectl attach --restore), C(playbooks/restore.yml)).
  - Mounting the bpffs is not this module's job; it fails clearly when O(pin_dir) is not on one.
  - Deciding whether O(object) differs from the running program loads it once, pinned briefly under
    O(pin_dir) and
    removed again, also in check mode.
version_added: 0.1.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
requirements:
  - Linux 5.9 or later with BPF links for sk_lookup
  - bpftool
  - CAP_BPF and CAP_NET_ADMIN (root)
options:
  state:
    description: Whether the router should run (V(attached)) or be rolled back deep and kept
      detached (V(detached), or its other name V(absent)).
    type: str
    choices: [attached, detached, absent]
    default: attached
  object:
    description:
      - Path, on the managed node, of the compiled router (C(zerolayer_router.bpf.o), built by
        C(make -C files/bpf)).
      - Required when O(state=attached).
    type: path
  netns:
    description:
      - Network namespace file to attach the router to, such as C(/run/netns/NAME) or
        C(/proc/PID/ns/net).
      - Defaults to the network namespace of the module's own process.
    type: path
    default: /proc/self/ns/net
  pin_dir:
    description: Directory on a bpffs for the router's pins; created with mode 0700. Its parent must
      be on a bpffs.
    type: path
    default: /sys/fs/bpf/zerolayer
  fence_file:
    description:
      - File, outside bpffs, where the node keeps the highest fence epoch it has seen, and the
        router mode (kept detached by a deep rollback, or active).
      - It is the node's, not the caller's. Where the node config C(/etc/zerolayer/router.json)
        (written by the P(zerolayer.fleet.ebpf_router#role) role) is this router's (it names this
        O(pin_dir), or none and O(pin_dir) is the default), its C(fence_file) is used (the default
        stands for it), and any other value fails naming both, changing nothing. Elsewhere (a
        router attached by hand) the value given stands.
    type: path
    default: /var/lib/zerolayer/fence.json
  epoch:
    description:
      - With O(state=detached) or O(state=absent) (a deep rollback), the fence epoch the rollback
        raised in the rollout store. The node's fence goes to the higher of it and its own before
        the link is detached; omitted, it goes one above the node's own.
      - Ignored with O(state=attached).
    type: int
  reason:
    description:
      - With O(state=detached) or O(state=absent), why the router is detached; kept with the
        detached mode in O(fence_file) and shown to whoever tries to attach it.
    type: str
    default: deep rollback
  restore:
    description:
      - With O(state=attached), leave the detached mode a deep rollback recorded and attach the
        router again. Without it a detached node stays detached.
      - On a node that is not detached it changes nothing.
    type: bool
    default: false
  keep_seeds:
    description:
      - With O(restore=true), make the router's maps again with the hash seeds the deep
        rollback kept, so every connection's 4-tuple takes the path it took before. Without it
        the restored router draws new seeds (a client that learned the old ones learns
        nothing).
    type: bool
    default: false
  move_netns:
    description:
      - With O(state=attached), allow moving the router's link from the network namespace it is
        attached to into O(netns). Without it attaching to another netns with the same O(pin_dir)
        fails and changes nothing, since that would leave the first netns without the router.
    type: bool
    default: false
notes:
  - The pin layout is C(prog), C(link) and C(maps/zl_routes), C(maps/zl_sockets),
    C(maps/zl_counters),
    C(maps/zl_latency) under O(pin_dir).
seealso:
  - module: zerolayer.fleet.route
  - module: zerolayer.fleet.engine_socket
  - module: zerolayer.fleet.route_info
extends_documentation_fragment:
  - zerolayer.fleet.router.changes
"""

EXAMPLES = r"""
- name: Attach the router to the node's network namespace
  zerolayer.fleet.router:
    object: /usr/local/lib/zerolayer/zerolayer_router.bpf.o

- name: Upgrade the router program, keeping routes and weights
  zerolayer.fleet.router:
    object: /usr/local/lib/zerolayer/zerolayer_router-2.bpf.o
    pin_dir: /sys/fs/bpf/zerolayer

- name: Deep rollback, every new connection goes to the proxy, fenced at the store's epoch
  zerolayer.fleet.router:
    state: detached
    epoch: 7
    reason: p99 decision time above 1 us after the upgrade

- name: Put the router back after a deep rollback (leaves the detached mode)
  zerolayer.fleet.router:
    object: /usr/local/lib/zerolayer/zerolayer_router.bpf.o
    restore: true
"""

RETURN = r"""
actions:
  description: What was done (or, in check mode, would be done), in order.
  returned: always
  type: list
  elements: str
  sample: ["load program", "create link in netns 4026531840"]
fence:
  description: The node's fence epoch before and after a deep rollback raised it.
  returned: when O(state) is V(detached) or V(absent)
  type: dict
  sample: {epoch_before: 3, epoch: 4}
mode:
  description: The router mode recorded in O(fence_file) after the deep rollback.
  returned: when O(state) is V(detached) or V(absent)
  type: dict
  sample: {mode: detached, epoch: 4, at: "2025-05-01T12:00:00Z", reason: deep rollback}
kept_detached:
  description:
    - With O(state=attached), the detached mode record that kept the router from attaching
      (nothing was changed; give O(restore=true) to attach), or null when it was not kept detached.
  returned: when O(state=attached)
  type: dict
  sample: {mode: detached, epoch: 4, at: "2025-05-01T12:00:00Z", reason: deep rollback}
router:
  description: State of the router after the change.
  returned: always
  type: dict
  contains:
    pin_dir:
      description: The pin directory.
      type: str
    attached:
      description: Whether the pinned link runs the pinned program in a live netns.
      type: bool
    program:
      description: Pinned program (id, tag, name, run_cnt, run_time_ns), or null.
      type: dict
    link:
      description: Pinned link (id, prog_id, netns_ino, attached), or null.
      type: dict
    maps_pinned:
      description: Whether all four maps are pinned.
      type: bool
  sample:
    pin_dir: /sys/fs/bpf/zerolayer
    attached: true
    program: {id: 42, tag: 40d0f0c4b441b2b2, name: zerolayer_route, run_cnt: 0, run_time_ns: 0}
    link: {id: 7, prog_id: 42, netns_ino: 4026531840, attached: true}
    maps_pinned: true
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
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_lifecycle import (
    SELF_NETNS,
    attach,
    deep_rollback,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_mode import (
    kept_detached_message,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            state=dict(type="str", choices=["attached", "detached", "absent"], default="attached"),
            object=dict(type="path"),
            netns=dict(type="path", default=SELF_NETNS),
            epoch=dict(type="int"),
            reason=dict(type="str", default="deep rollback"),
            restore=dict(type="bool", default=False),
            move_netns=dict(type="bool", default=False),
            keep_seeds=dict(type="bool", default=False),
            **layout_options(),
        ),
        required_if=[("state", "attached", ["object"])],
        supports_check_mode=True,
    )

    def runner(argv):
        return module.run_command(argv, environ_update={"LANG": "C", "LC_ALL": "C"})

    params = module.params
    try:
        layout = layout_from_params(params)
        if params["state"] == "attached":
            result = attach(
                layout,
                params["object"],
                params["netns"],
                module.check_mode,
                runner,
                restore=params["restore"],
                move_netns=params["move_netns"],
                keep_seeds=params["keep_seeds"],
            )
            if result["kept_detached"]:
                module.warn(kept_detached_message(result["kept_detached"], layout.fence_file))
        else:
            result = deep_rollback(
                layout, params["epoch"], params["reason"], check_mode=module.check_mode
            )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)

    output = {"changed": result["changed"], "actions": result["actions"], "router": result["after"]}
    for key in ("fence", "mode", "kept_detached"):
        if key in result:
            output[key] = result[key]
    if module._diff:
        output["diff"] = {"before": result["before"], "after": result["after"]}
    module.exit_json(**output)


if __name__ == "__main__":
    main()
