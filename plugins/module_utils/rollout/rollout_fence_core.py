# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""What one call of rollout_fence does: read the fleet's fence, raise it, count the nodes'
acknowledgements, and collect the nodes' reports of their direct connections leaving.

Shared by the module (plugins/modules/rollout_fence.py), which runs it where a task is
delegated, and by its action plugin (plugins/action/rollout_fence.py), which runs it in the
controller's own process when the task runs on the controller: a rollback's first step is
then one compare-and-swap, not the start of a Python process and its imports (0.2-0.4 s of
a loaded 2-core controller, measured with profile_tasks).
"""

from __future__ import annotations

import getpass
import socket
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    FleetError,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    FENCE_ACTIONS,
    next_epoch,
    read_presence,
    store_failure,
    store_from_params,
    store_options,
)

ARGUMENT_SPEC = dict(
    action=dict(type="str", choices=["read", "raise", "wait_acks", "wait_direct"], default="read"),
    epoch=dict(type="int"),
    nodes=dict(type="list", elements="str", default=[]),
    wait_s=dict(type="float", default=2.0),
    quiet_s=dict(type="float"),
    rollback_mode=dict(type="str", choices=list(FENCE_ACTIONS), default="fast"),
    reason=dict(type="str", default="requested"),
    actor=dict(type="str"),
    at_least=dict(type="int", default=0),
    catch_up_to=dict(type="int"),
    require_store=dict(type="bool", default=False),
    **store_options(),
)
REQUIRED_IF = [("action", "wait_acks", ["epoch"]), ("action", "wait_direct", ["epoch"])]
# How often wait_direct reads the nodes' reports again.
DIRECT_POLL_S = 0.1


def fence_call(params, check_mode=False, diff=False, on_absent=None):
    """The result of one call with validated params; FleetError when it fails.

    on_absent(epoch, nodes): called after the raise and before the count with the nodes
    asked whose watcher keeps no presence (none to call it for: not called), so that a
    caller can push them at once, beside the count that cannot hear from them.

    A store that fails read, of any kind, fails the call (a canary must not start or
    advance then). raise reports every store failure (store_updated false, store_error and
    its kind) unless require_store is set: a rollback goes on and fences the nodes itself,
    whatever the store answered; so does the count of acknowledgements after the raise.
    """
    if params["quiet_s"] is not None and params["quiet_s"] <= 0:
        raise FleetError(
            "quiet_s must be above 0 seconds (or left out); got %r" % params["quiet_s"],
            {"field": "quiet_s"},
        )
    if params["at_least"] < 0:
        raise FleetError(
            "at_least must be a whole number >= 0; got %r" % params["at_least"],
            {"field": "at_least", "value": params["at_least"]},
        )
    _check_catch_up(params)
    if params["action"] == "wait_acks":
        return wait_acks(params)
    if params["action"] == "wait_direct":
        return wait_direct(params)
    actor = params["actor"] or "%s@%s" % (getpass.getuser(), socket.gethostname())
    try:
        store = store_from_params(params)
        before = store.fence()
        if params["action"] == "read":
            return {"changed": False, "fence": before, "store_updated": False}
        counting = bool(params["nodes"]) and params["wait_s"] > 0 and not check_mode
        present = None
        if check_mode:
            epoch = next_epoch(before["epoch"], params["at_least"], params["catch_up_to"])
            after = None if epoch is None else dict(before, epoch=epoch)
        else:
            after = store.raise_fence(
                params["rollback_mode"], params["reason"], actor, params["at_least"],
                presence=counting, catch_up_to=params["catch_up_to"],
            )  # fmt: skip
            if after is None:
                before = store.fence()
            else:
                present = after.pop("present", None)
        if after is None:
            # A catch-up to where the store already is: nothing written.
            return {"changed": False, "fence": before, "store_updated": False}
    except MODULE_FAILURES as exc:
        if params["action"] == "read" or params["require_store"]:
            raise
        return dict(store_failure(exc), changed=False, fence=None, store_updated=False)
    result = {"changed": True, "fence": after, "store_updated": not check_mode}
    if counting:
        result["absent"] = absent_watchers(params["nodes"], present)
        _tell_absent(on_absent, after["epoch"], result["absent"])
        result.update(count_acks_or_none(store, params, after["epoch"], enough_of(params, present)))
    if diff:
        result["diff"] = {"before": before, "after": after}
    return result


def _check_catch_up(params):
    """catch_up_to is the nodes' epoch for a catch-up raise, and nothing else."""
    wanted = params["catch_up_to"]
    if wanted is None:
        return
    if params["action"] != "raise" or params["rollback_mode"] != "catch_up":
        raise FleetError(
            "catch_up_to goes with action=raise and rollback_mode=catch_up; got action=%s,"
            " rollback_mode=%s" % (params["action"], params["rollback_mode"]),
            {"field": "catch_up_to"},
        )
    if wanted < 1 or params["at_least"]:
        raise FleetError(
            "catch_up_to must be an epoch >= 1, without at_least; got catch_up_to=%r,"
            " at_least=%r" % (wanted, params["at_least"]),
            {"field": "catch_up_to", "value": wanted},
        )


def _require_epoch_and_wait(params):
    if params["wait_s"] < 0 or params["epoch"] < 1:
        raise FleetError(
            "%s needs epoch >= 1 and wait_s >= 0; got epoch %r, wait_s %r"
            % (params["action"], params["epoch"], params["wait_s"]),
            {"field": "epoch" if params["epoch"] < 1 else "wait_s"},
        )


def wait_direct(params, clock=time.monotonic, sleep=time.sleep):
    """The nodes' direct-drain reports of epoch, as they arrive, for at most wait_s: each
    watcher writes one once its node's direct connections are gone or its own wait is over.
    A store that fails, of any kind, ends the wait with what was read; never fails on it."""
    _require_epoch_and_wait(params)
    wanted = set(params["nodes"])
    deadline = clock() + params["wait_s"]
    found, failure = {}, {}
    try:
        store = store_from_params(params)
        while True:
            found = store.direct_drains(params["epoch"], wanted)
            if len(found) == len(wanted) or clock() >= deadline:
                break
            sleep(DIRECT_POLL_S)
    except MODULE_FAILURES as exc:
        failure = store_failure(exc)
    return dict(failure, changed=False, direct=found, unreported=sorted(wanted - set(found)))


def wait_acks(params, on_absent=None):
    """Count acknowledgements; never fails on the store (the caller pushes to the laggards).
    on_absent: as fence_call's, called before the count."""
    _require_epoch_and_wait(params)
    try:
        store = store_from_params(params)
    except MODULE_FAILURES as exc:
        return dict(_none_counted(params, exc), changed=False)
    try:
        # Raised elsewhere (an abort): presence is read now, not in the raise's transaction.
        present = read_presence(store)
    except MODULE_FAILURES:
        present = None
    absent = absent_watchers(params["nodes"], present)
    _tell_absent(on_absent, params["epoch"], absent)
    counted = count_acks_or_none(store, params, params["epoch"], enough_of(params, present))
    return dict(counted, changed=False, absent=absent)


def _tell_absent(on_absent, epoch, absent):
    if on_absent is not None and absent:
        on_absent(epoch, absent)


def absent_watchers(nodes, present):
    """The nodes asked whose watcher keeps no presence key, or None where presence tells
    nothing: not read, or no key in the whole store (watchers of a release before presence,
    which the count waits for as it always did: see enough_of)."""
    if not present:
        return None
    return sorted(set(nodes) - set(present))


def enough_of(params, present):
    """The nodes the count must wait for, of those asked: the ones whose watcher is present
    (None: all of them, as before presence). With no presence key in the whole store (its
    watchers are of a release before presence) or none read, the count is what it was."""
    if not present:
        return None
    return set(params["nodes"]) & set(present)


def count_acks_or_none(store, params, epoch, enough=None):
    """count_acks, or, when the store fails it in any way, no node counted (each gets the
    push) and the failure said."""
    try:
        return count_acks(store, params, epoch, enough)
    except MODULE_FAILURES as exc:
        return _none_counted(params, exc)


def _none_counted(params, exc):
    return dict(
        store_failure(exc),
        acked={},
        lagging=list(params["nodes"]),
        waited_s=0.0,
        ended_at_unix=time.time(),
    )


def count_acks(store, params, epoch, enough=None):
    acked, lagging, waited = store.wait_for_acks(
        epoch, params["nodes"], params["wait_s"],
        deep=params["rollback_mode"] == "deep", quiet_s=params["quiet_s"], enough=enough,
    )  # fmt: skip
    # When the count ended, on the controller's clock: with no node lagging, the moment the
    # last acknowledgement was seen, which is when a rollback without a push is confirmed.
    return {"acked": acked, "lagging": lagging, "waited_s": waited, "ended_at_unix": time.time()}
