# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The node's fence: the highest rollout epoch this node has seen, and the rule it enforces.

Rollback and abort raise the fleet's fence epoch in the rollout store before they touch a
node; every writer of weights carries the epoch it took. A node keeps the highest epoch it
has seen in a small JSON file (outside bpffs, so a reboot or a router upgrade keeps it) and
refuses a write that would send more traffic to the engine with an older epoch. A paused,
stale or resumed runner can therefore never undo a rollback, whatever it believes.

The safe direction is never fenced: weight 0, a lower weight or a write that changes
nothing goes through with any epoch (a rollback must never be refused). Callers hold the
router's writer lock around admit() and their map write, so a rollback that raises the
epoch cannot slip between the check and the write.

The node's own record is not the whole truth where the node has a store (its fence
watcher's store.json): a writer's epoch above the node's may be made up (a typo, a test's
10**9), and once recorded it would refuse every honest writer; a node whose fence file
is gone (a reimage, an rm, /var/lib restored) would read as epoch 0 and admit a stale
writer. So before admit() records a higher epoch, and before a raise on a node with no
fence file, it asks the store (only then: the usual write never leaves the node). A
store that does not answer does not stop the write: it is admitted as before, with a
warning, as an outage of the store must never become an outage of the fleet's writers.
"""

from __future__ import annotations

import contextlib
import json
import os
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.atomic_files import (
    write_atomic,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.locks import flock_within

DEFAULT_FENCE_FILE = "/var/lib/zerolayer/fence.json"
# The fence watcher's store client settings (rollout_store's node_client writes them): a
# writer's epoch is checked against the store they name.
DEFAULT_STORE_CONFIG = "/etc/zerolayer/store.json"
FENCE_LOCK_TIMEOUT_S = 5.0
# A writer asking the store holds the router's writer lock meanwhile: a store that does not
# answer costs it this long per request, not the client's default.
STORE_CHECK_TIMEOUT_S = 2.0
REREAD_ACTION = "re-read from the rollout store (no fence file on this node)"


class FenceRefused(FleetError):
    """The fence refused: a write whose epoch is older than the node's fence (or above any
    the store ever had), or a fence record of the store the node's watcher will not act on
    (no epoch, an unknown action, an epoch below one it already acknowledged)."""


def _validate_epoch(epoch, field="epoch"):
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise FleetError(
            "%s must be a whole number >= 0 (the rollout store's fence epoch); got %r"
            % (field, epoch),
            {"field": field, "value": epoch},
        )
    return epoch


def parse_epoch(value, field="epoch"):
    """An epoch from an int or a string of digits; None stays None (no epoch carried)."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    return _validate_epoch(value, field)


def read_fence(path):
    """{"epoch": int, ...} as recorded on this node; epoch 0 when nothing was recorded."""
    try:
        with open(path) as handle:
            data = json.load(handle)
    except FileNotFoundError:
        return {"epoch": 0}
    except (OSError, ValueError) as exc:
        # A fence that cannot be read must not read as "no fence": refuse every raise.
        raise FleetError(
            "fence file %s cannot be read (%s); fix or remove it by hand after checking the "
            "rollout store's fence epoch" % (path, exc),
            {"field": "fence_file", "path": path},
        ) from None
    epoch = data.get("epoch") if isinstance(data, dict) else None
    # true is an int to Python and a negative epoch no fence ever wrote: neither is an epoch.
    if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
        raise FleetError(
            "fence file %s holds no epoch (a whole number from 0) but %r; fix it by hand after "
            "checking the rollout store" % (path, epoch),
            {"field": "fence_file", "path": path},
        )
    return data


def write_fence(path, fence):
    """Replace the fence file atomically (temp file in the same directory, fsync, rename,
    fsync of the directory): after a crash the node has the old fence or the new one."""
    os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
    text = json.dumps(fence, sort_keys=True) + "\n"
    write_atomic(path, lambda out: out.write(text.encode()), mode=0o600)


@contextlib.contextmanager
def fence_file_lock(path, timeout=FENCE_LOCK_TIMEOUT_S):
    """Serialise the read-modify-writes of one fence file (never held for longer than one).

    A rollback raising the fence and a writer recording its higher epoch must not lose
    each other's write. The lock is held only around a read and an atomic replace, so a
    rollback waits microseconds for it; the bound is a guard against the impossible.
    """
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, mode=0o700, exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not flock_within(fd, timeout, poll_s=0.001):
            raise FleetError(
                "the fence file %s stayed locked for %.0f s; a process holding %s.lock is "
                "stuck: find it with fuser and end it" % (path, timeout, path),
                {"field": "fence_file", "path": path},
            )
        yield
    finally:
        os.close(fd)


def admit(path, epoch, raises_traffic, what, check_mode=False, store_epoch=None, warnings=None):
    """Check a write of epoch against the node's fence; record a higher epoch.

    epoch None means the writer carries no epoch (0). Raises FenceRefused, naming both
    epochs, when the write would send more traffic to the engine with an older epoch.

    store_epoch (store_epoch_reader()) reads the rollout store's fence epoch; None: this
    node has no store. It is asked only when the write carries an epoch above the node's,
    or raises traffic on a node without a fence file: a raise with an epoch above the
    store's is refused (naming both), a lowering one goes through without recording it,
    and a missing fence file is recorded at the store's epoch first. What could not be
    checked (the store did not answer) is appended to warnings, a list.

    Returns the node's epoch after the check.
    """
    carried = 0 if epoch is None else _validate_epoch(epoch)
    store = None
    if store_epoch is not None and _store_is_needed(path, carried, raises_traffic):
        # Outside the fence file's lock: a rollback must never wait for the store's answer.
        store = _ask_store(store_epoch, warnings, what)
    with fence_file_lock(path):
        return _admit_locked(path, carried, raises_traffic, what, check_mode, store)


def _read_fence_if_present(path):
    """The fence as read_fence() reads it, or None when the node has no fence file."""
    if not os.path.lexists(path):
        return None
    return read_fence(path)


def _store_is_needed(path, carried, raises_traffic):
    fence = _read_fence_if_present(path)
    if fence is None:
        return raises_traffic or carried > 0
    return carried > fence["epoch"]


def _ask_store(store_epoch, warnings, what):
    """The store's fence epoch, or None (said in warnings) when the store gave none."""
    try:
        epoch = store_epoch()
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise FleetError("its fence record holds no whole epoch >= 0 but %r" % (epoch,))
        return epoch
    except (FleetError, OSError) as exc:
        if warnings is not None:
            warnings.append(
                "%s: the rollout store's fence epoch could not be read (%s); the write was "
                "checked against this node's fence only" % (what, getattr(exc, "message", exc))
            )
        return None


def _admit_locked(path, carried, raises_traffic, what, check_mode, store):
    fence = _read_fence_if_present(path)
    if fence is None:
        fence = {"epoch": 0}
        if store is not None:
            # A node that lost its fence (reimaged, removed, restored) takes the fleet's
            # before it judges a write: a writer that took its epoch before the last
            # rollback is then refused here too.
            fence = {"epoch": store, "action": REREAD_ACTION, "at": _now()}
            if not check_mode:
                write_fence(path, fence)
    if carried < fence["epoch"] and raises_traffic:
        raise FenceRefused(
            "%s refused: the write carries epoch %d, older than this node's fence epoch %d "
            "(raised by %s at %s). A rollback or abort happened after this writer took its "
            "epoch; nothing was changed. Start a new rollout, which takes the store's "
            "current epoch."
            % (
                what,
                carried,
                fence["epoch"],
                fence.get("action", "a rollback"),
                fence.get("at", "an unknown time"),
            ),
            {"field": "epoch", "epoch": carried, "node_epoch": fence["epoch"]},
        )
    if store is not None and carried > max(store, fence["epoch"]):
        if raises_traffic:
            raise FenceRefused(
                "%s refused: the write carries epoch %d, above the rollout store's fence "
                "epoch %d (this node's is %d). No writer can have taken an epoch the store "
                "never had; nothing was changed. Take the epoch from the store (a new "
                "rollout does)." % (what, carried, store, fence["epoch"]),
                {
                    "field": "epoch",
                    "epoch": carried,
                    "store_epoch": store,
                    "node_epoch": fence["epoch"],
                },
            )
        # The safe direction goes through, but its made-up epoch is not kept: recorded, it
        # would refuse every writer that holds the store's real one.
        carried = max(store, fence["epoch"])
    if carried > fence["epoch"] and not check_mode:
        write_fence(path, dict(fence, epoch=carried, action="write", at=_now()))
        return carried
    return fence["epoch"]


def store_epoch_reader(store_config):
    """A function that reads the fleet's fence epoch from the rollout store, as the node's
    fence watcher reaches it (its store_config, e.g. DEFAULT_STORE_CONFIG); None where the
    node has no store (no store_config, or no such file: the store's node_client never ran
    here). Reading nothing until called keeps the usual write off the store."""
    if not store_config or not os.path.exists(store_config):
        return None

    def read():
        # Imported when a write first checks: a node without a store never loads the client.
        from ansible_collections.zerolayer.fleet.plugins.module_utils.store.node_client import (
            node_store,
        )

        store, _node = node_store(store_config, timeout=STORE_CHECK_TIMEOUT_S)
        return store.fence()["epoch"]

    return read


def raise_fence(path, epoch=None, action="rollback", check_mode=False, record=None):
    """The node side of a rollback: the fence goes to max(epoch, node's) or node's + 1.

    With no epoch (the store could not be reached, or a person on the node) the node's own
    epoch goes up by one, which is above every writer that took its epoch before. record,
    when given, is called with the raised epoch and returns more keys to keep in the same
    write (the router's mode), so no other writer can come between the two. Returns
    (before, after) epochs.
    """
    wanted = None if epoch is None else _validate_epoch(epoch)
    with fence_file_lock(path):
        return _raise_fence_locked(path, wanted, action, check_mode, record)


def _raise_fence_locked(path, epoch, action, check_mode, record):
    fence = read_fence(path)
    before = fence["epoch"]
    after = max(before, before + 1 if epoch is None else epoch)
    changes = {}
    if after != before:
        changes.update(epoch=after, action=action, at=_now())
    if record is not None:
        changes.update(record(after))
    if changes and not check_mode:
        # Merged into what the file holds: keys other writers keep there survive.
        write_fence(path, dict(fence, **changes))
    return before, after


def _now():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
