#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_fence
short_description: Read or raise the fleet's fence epoch in the rollout store
description:
  - The fence epoch is the fleet's rollback counter, kept in the rollout store (etcd). A rollback
    or an abort raises it, in one compare-and-swap, before it touches any node; every weight write
    to a node carries the epoch its writer took, and the node refuses a raise of traffic with an
    older epoch (see M(zerolayer.fleet.route) O(zerolayer.fleet.route#module:epoch)).
  - V(read) returns the fence. V(raise) raises it and returns the new one. V(wait_acks) counts the
    nodes' fence watchers' acknowledgements of O(epoch) as they arrive, for at most O(wait_s)
    seconds, and returns which nodes confirmed it and which lag (a rollback pushes to those).
    V(raise) with O(nodes) and O(wait_s) above 0 does both in one call, which saves a rollback the
    start of a second module.
  - V(raise) with O(nodes) reads, in the transaction that raises the fence, which nodes' fence
    watchers are present (each running watcher keeps a key on a lease of a few seconds while its
    loop turns). The count then ends once every present node confirmed; the others, in
    RV(absent), have no watcher to answer and are lagging at once, for the push. Present nodes
    that stay silent are waited for as before (O(quiet_s), O(wait_s)). A store with no presence
    key at all (watchers of a release before this one) is counted as before. V(wait_acks), the
    count after a fence raised elsewhere (C(zerolayer rollout abort)), reads presence as it starts.
  - V(wait_direct) collects, for at most O(wait_s) seconds, the reports the nodes' fence watchers
    write once their direct-path connections (pooled keep-alive clients the router handed to an
    engine) are gone after the rollback of O(epoch), or their own wait is over. Each says how
    long that took, or how many are left on which route.
  - A store that fails in any way (not reached, an error answered such as no leader, NOSPACE or
    a refused login, settings that cannot make a client) fails V(read); a canary must not start
    or advance then. With V(raise) it does not fail unless O(require_store) is set; it returns
    RV(store_updated=false), RV(store_error) and RV(store_error_kind), so that the rollback goes
    on and fences the nodes itself, one above each node's own epoch. A store that fails the count
    after the raise, V(wait_acks) or V(wait_direct) does not fail them either; no node is counted
    (each gets the push) and RV(store_error) says why.
  - On the controller (a task delegated to localhost, or any task with a local connection and no
    become) the call runs in the controller's own process, with the same arguments and results,
    so no module process has to start before the fence is raised. Delegated to another host, the
    module runs there.
version_added: 0.2.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  action:
    description: Read the fence, or raise it.
    type: str
    choices: [read, raise, wait_acks, wait_direct]
    default: read
  epoch:
    description: With V(wait_acks) or V(wait_direct), the fence epoch the nodes must acknowledge or
      report on (or a later one).
    type: int
  nodes:
    description:
      - With V(wait_acks) or V(wait_direct), the nodes (their inventory names, as their acks are
        named).
      - With V(raise), the nodes whose acknowledgements of the new epoch are then counted;
        empty, none are.
    type: list
    elements: str
    default: []
  wait_s:
    description:
      - With V(wait_acks), or V(raise) with O(nodes), how long to wait for the
        acknowledgements at most. A read the store fails is tried again while it lasts.
    type: float
    default: 2.0
  quiet_s:
    description:
      - With V(wait_acks), or V(raise) with O(nodes), end the count early once
        acknowledgements have arrived and then none for this long (the nodes still silent
        get the push sooner). Omitted, the count runs until every node confirmed or
        O(wait_s) is over.
    type: float
  rollback_mode:
    description:
      - What raised the fence, recorded with it, and what each node's fence watcher does with
        it; V(abort) is a canary abort (the watcher rolls back as for V(fast)).
      - V(catch_up) brings the store up to an epoch nodes took by themselves (a rollback that
        could not reach the store); each watcher records the epoch and acknowledges it, and
        changes no weight. A watcher of a release before this one refuses it and changes
        nothing.
      - With V(wait_acks) and V(deep), only the acknowledgements of a deep rollback count.
    type: str
    choices: [fast, deep, abort, catch_up]
    default: fast
  reason:
    description: Why, recorded with the fence and shown to whoever the fence stops.
    type: str
    default: requested
  actor:
    description: Who raised it; defaults to the controller user at the controller host.
    type: str
  at_least:
    description:
      - The new epoch is above both the store's and this, for a rollback that fenced the nodes
        without the store (their epochs are then known from their answers).
    type: int
    default: 0
  catch_up_to:
    description:
      - With V(raise) and O(rollback_mode=catch_up), the highest epoch the nodes hold (a rollback
        that could not reach the store fenced them itself). The store's fence is raised to it
        when it is lower; when it is not, nothing is written and the result is not changed.
      - Not with O(at_least).
    type: int
  require_store:
    description: With V(raise), fail when the store cannot be reached instead of reporting it.
    type: bool
    default: false
extends_documentation_fragment:
  - zerolayer.fleet.store
attributes:
  check_mode:
    description: In check mode V(raise) reads the fence and returns the epoch it would write.
    support: full
  diff_mode:
    description: Returns the fence before and after in diff mode.
    support: full
"""

EXAMPLES = r"""
- name: Raise the fence before any node is touched
  zerolayer.fleet.rollout_fence:
    action: raise
    rollback_mode: fast
    reason: p99 latency page
    endpoints: ["https://10.0.0.5:2379"]
    ca_file: /etc/zerolayer/pki/ca.pem
    cert_file: /etc/zerolayer/pki/controller.pem
    key_file: /etc/zerolayer/pki/controller-key.pem
  register: fence
  delegate_to: localhost
  run_once: true
"""

RETURN = r"""
fence:
  description: The fence after the call (epoch 0 before the first rollback); null when the store
    could not be reached.
  returned: always
  type: dict
  sample:
    epoch: 4
    action: fast
    reason: p99 latency page
    actor: ops@ctl-1
    at: "2026-12-01T10:02:03Z"
store_updated:
  description: Whether the store holds the raised fence (V(raise) only).
  returned: always
  type: bool
acked:
  description: With V(wait_acks), each node that confirmed the epoch, with its acknowledgement and
    C(seen_after_s), when the controller saw it (its own clock, never the node's).
  returned: with O(action=wait_acks), or V(raise) with O(nodes) once the store was updated
  type: dict
lagging:
  description: With V(wait_acks), the nodes that did not confirm in time.
  returned: with O(action=wait_acks), or V(raise) with O(nodes) once the store was updated
  type: list
  elements: str
absent:
  description:
    - With V(raise) and O(nodes), the nodes asked about whose fence watcher had no presence in the
      store when the fence was raised (stopped, killed, stuck, or never there). The count does
      not wait for them; they are in RV(lagging) unless a confirmation of theirs was already in.
    - With V(wait_acks), the nodes without presence when the count started.
    - Null when the store would not let this user read the presence.
  returned: with O(action=raise) and O(nodes) once the store was updated; with O(action=wait_acks)
  type: list
  elements: str
  sample: [gpu-node-7]
waited_s:
  description: With V(wait_acks), how long it waited.
  returned: with O(action=wait_acks), or V(raise) with O(nodes) once the store was updated
  type: float
ended_at_unix:
  description:
    - With V(wait_acks), when the count ended, in Unix seconds on the controller's clock. With no
      node lagging that is when the last acknowledgement was seen, the moment a rollback without
      a push is confirmed.
  returned: with O(action=wait_acks), or V(raise) with O(nodes) once the store was updated
  type: float
direct:
  description: With V(wait_direct), each node's report, by node. C(first) and C(left) are its
    direct connections by route at the first count and at the end; C(drained), C(drained_after_s)
    (seconds from the fence's arrival on the node, null when some were left) and C(at_unix).
  returned: with O(action=wait_direct)
  type: dict
unreported:
  description: With V(wait_direct), the nodes asked about that wrote no report in time.
  returned: with O(action=wait_direct)
  type: list
  elements: str
store_error:
  description: Why the store did not take the raise or the count, when it did not.
  returned: when the store failed a V(raise), V(wait_acks) or V(wait_direct)
  type: str
store_error_kind:
  description: >-
    V(unavailable): no endpoint answered in time; V(refused): the store answered with an error
    or the fence kept changing under the compare-and-swap; V(unusable): the settings cannot make
    a client (an unreadable password file, TLS files that do not load) or the store holds what
    cannot be read.
  returned: with RV(store_error)
  type: str
  sample: refused
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC,
    REQUIRED_IF,
    fence_call,
)


def main():
    # On the controller the action plugin of the same name runs fence_call in its own
    # process; this is what runs where the task is delegated to another host.
    module = AnsibleModule(
        argument_spec=ARGUMENT_SPEC, required_if=REQUIRED_IF, supports_check_mode=True
    )
    try:
        result = fence_call(module.params, module.check_mode, module._diff)
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
