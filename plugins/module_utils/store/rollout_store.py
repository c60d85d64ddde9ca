# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollout store's records: the fleet's fence epoch and the owner of a rollout scope.

Keys under the store's prefix (default /zerolayer/):
  fence            {"epoch", "action", "reason", "actor", "at"}: raised only by compare-and-swap
  owners/<scope>   the runner that holds the scope, on a lease its heartbeat keeps alive
  acks/<node>      what a node acknowledged (written by the node, with its own identity)
  acks/<node>/direct  after that, how long the node's direct connections took to leave
  acks/<node>/live    the node's weights as its watcher last read them, on a lease the
                      watcher renews (gone when the watcher stops)
  presence/<node>  {node, pid, started_at_unix, at_unix}: the node's watcher is running and
                   its loop goes on, on a short lease of its own (fence_watcher.Presence)

Rollback and abort call raise_fence() before they touch a node; every weight write to a
node carries the epoch its writer took (dataplane/fence.py enforces it there). See
docs/rollout-store.md.
"""

from __future__ import annotations

import os
import re
import socket
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import (
    EtcdClient,
    StoreUnavailable,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.heartbeat import LOG_TAG

DEFAULT_PREFIX = "/zerolayer/"
FENCE_ACTIONS = ("fast", "deep", "abort", "catch_up")
CAS_ATTEMPTS = 8
SCOPE_PATTERN = re.compile(r"^[A-Za-z0-9_.:,!&*\[\]-]{1,200}$")


class OwnerLost(FleetError):
    """A runner whose lease on its scope is gone (expired, or the scope taken since)."""


class OwnerConflict(FleetError):
    """Another runner holds the scope."""


def store_options(required=True):
    """The argument_spec entries of the modules that talk to the rollout store; not
    required, an empty endpoints list means no store (and the Prometheus-style timeout
    option stays the module's own)."""
    options = {
        "endpoints": {"type": "list", "elements": "str", "required": True},
        "ca_file": {"type": "path"},
        "cert_file": {"type": "path"},
        "key_file": {"type": "path", "no_log": False},
        "user": {"type": "str"},
        "password_file": {"type": "path", "no_log": False},
        "prefix": {"type": "str", "default": DEFAULT_PREFIX},
        # The one name every store module shares, so a play's module_defaults can set it
        # for the group (canary_gate's own timeout is Prometheus').
        "store_timeout": {"type": "float"},
    }
    if required:
        options["timeout"] = {"type": "float", "default": 3.0}
    else:
        options["endpoints"] = {"type": "list", "elements": "str", "default": []}
    return options


def read_password(path, field="password_file"):
    """The first line of a password file (0600, written by the rollout_store role)."""
    try:
        with open(path) as handle:
            return handle.readline().rstrip("\n")
    except OSError as exc:
        raise FleetError(
            "%s %s cannot be read: %s" % (field, path, exc.strerror), {"field": field, "path": path}
        ) from None


def store_from_params(params):
    password = None
    if params.get("user"):
        password = read_password(params["password_file"]) if params.get("password_file") else None
    client = EtcdClient(
        params["endpoints"],
        params.get("ca_file"),
        params.get("cert_file"),
        params.get("key_file"),
        params.get("store_timeout") or params.get("timeout"),
        user=params.get("user"),
        password=password,
    )
    return RolloutStore(client, params.get("prefix") or DEFAULT_PREFIX)


def store_failure(exc):
    """What a rollback reports of a store that failed it: the message and its kind.

    unavailable: no endpoint answered in time; refused: the store answered with an error
    (no leader, NOSPACE, authentication failed, permission denied) or the fence kept
    changing under the compare-and-swap; unusable: the settings cannot make a client (an
    unreadable password file, TLS files that do not load, endpoints that are not URLs) or
    the store holds what this code cannot read.
    """
    if isinstance(exc, StoreUnavailable):
        return {"store_error": exc.message, "store_error_kind": "unavailable"}
    if not isinstance(exc, FleetError):
        return {"store_error": "%s: %s" % (type(exc).__name__, exc), "store_error_kind": "unusable"}
    answered = "status" in exc.details or "store_error" in exc.details
    kind = "refused" if answered or exc.details.get("field") == "fence" else "unusable"
    return {"store_error": exc.message, "store_error_kind": kind}


def _whole_number(value):
    """An epoch as JSON carries it: an int, not a bool (true is 1 to Python)."""
    return isinstance(value, int) and not isinstance(value, bool)


def validate_scope(scope, field="scope"):
    if not isinstance(scope, str) or not SCOPE_PATTERN.match(scope):
        raise FleetError(
            "%s must be 1-200 characters of an inventory pattern (letters, digits and "
            "_ . : , ! & * [ ] -); got %r" % (field, scope),
            {"field": field, "value": scope},
        )
    return scope


def runner_identity(rollout_id, pid=None, pid_started=None):
    """Who a runner is, as a second runner is told: host, pid, rollout id, since.
    pid_started (the process's start time) lets a runner on the same host tell that a
    holder died."""
    return {
        "host": socket.gethostname(),
        "pid": pid or os.getpid(),
        "pid_started": pid_started,
        "rollout_id": rollout_id,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


OVERLAP_READS = 5
HOST_PATTERN = re.compile(r"\A[A-Za-z0-9_.:\[\]-]{1,255}\Z")


def validate_hosts(hosts, field="hosts"):
    """None, or the sorted distinct inventory host names of a scope."""
    if hosts is None:
        return None
    if isinstance(hosts, (str, bytes)) or not isinstance(hosts, (list, tuple)) or not hosts:
        raise FleetError(
            "%s must be a non-empty list of inventory host names; got %r" % (field, hosts),
            {"field": field},
        )
    for host in hosts:
        if not isinstance(host, str) or not HOST_PATTERN.match(host):
            raise FleetError(
                "%s must hold inventory host names (letters, digits and _ . : [ ] -); got %r"
                % (field, host),
                {"field": field, "value": host},
            )
    return sorted(set(hosts))


def _refuse_overlap(scope, hosts, owners, prefix):
    """OwnerConflict when a scope under another name is held with hosts among these."""
    wanted = set(hosts)
    for kv in owners:
        other_scope = kv.key[len(prefix) :]
        if other_scope == scope:
            continue
        other = kv.json()
        shared = sorted(wanted.intersection(other.get("hosts") or ()))
        if shared:
            raise OwnerConflict(
                "scope %s overlaps scope %s, held by another runner: host %s, pid %s, rollout "
                "%s, since %s; hosts in both: %s. One node has one rollout owner at a time; "
                "nothing was changed."
                % (
                    scope,
                    other_scope,
                    other.get("host"),
                    other.get("pid"),
                    other.get("rollout_id"),
                    other.get("since"),
                    ", ".join(shared),
                ),
                {"field": "scope", "holder": other, "ttl_left_s": None, "overlap": shared},
            )


def _dead_here(holder, alive):
    """Whether holder is a runner of this host that no longer runs."""
    return (
        holder.get("host") == socket.gethostname()
        and holder.get("pid_started") is not None
        and not alive(holder.get("pid", 0), holder["pid_started"])
    )


def _nodes_under(prefix, kvs):
    """The sorted node names of presence keys (prefix + node; nothing deeper is one)."""
    return sorted({kv.key[len(prefix) :] for kv in kvs if "/" not in kv.key[len(prefix) :]})


def _refused_by_permission(exc):
    """Whether the store answered that this user may not do it (a role of a release before
    presence): not a store that cannot be reached, nor any other refusal."""
    return not isinstance(exc, StoreUnavailable) and "permission denied" in exc.message


def read_presence(store):
    """The sorted nodes whose fence watcher keeps presence/<node> now, or None when this
    user may not read presence/. store: anything with .key() and .client (a RolloutStore,
    the store exporter's reader)."""
    prefix = store.key("presence", "")
    try:
        return _nodes_under(prefix, store.client.get_prefix(prefix))
    except FleetError as exc:
        if not _refused_by_permission(exc):
            raise
        return None


def next_epoch(current, at_least=0, catch_up_to=None):
    """The epoch a raise writes over the store's current one: above both it and at_least;
    for a catch-up exactly catch_up_to, or None (nothing to write) when current is there."""
    if catch_up_to is None:
        return max(current, at_least) + 1
    return catch_up_to if current < catch_up_to else None


class RolloutStore:
    def __init__(self, client, prefix=DEFAULT_PREFIX):
        if not prefix.startswith("/") or not prefix.endswith("/"):
            raise FleetError(
                "prefix must start and end with '/', e.g. %s; got %r" % (DEFAULT_PREFIX, prefix),
                {"field": "prefix", "value": prefix},
            )
        self.client = client
        self.prefix = prefix

    def key(self, *parts):
        return self.prefix + "/".join(parts)

    # ------------------------------------------------------------ the fence

    def fence(self):
        """The fleet's fence: epoch 0 before the first rollback."""
        kv = self.client.get(self.key("fence"))
        if kv is None:
            return {"epoch": 0, "mod_revision": 0}
        fence = kv.json()
        if not isinstance(fence, dict) or not isinstance(fence.get("epoch"), int):
            raise FleetError(
                "store key %s holds no fence epoch: %r" % (kv.key, fence), {"key": kv.key}
            )
        fence["mod_revision"] = kv.mod_revision
        return fence

    def raise_fence(self, action, reason, actor, at_least=0, presence=False, catch_up_to=None):
        """One compare-and-swap: epoch = max(current, at_least) + 1. Returns the new fence.

        at_least lets a rollback that had to fence the nodes without the store (their own
        epoch + 1) bring the store above what the nodes saw once it is back.

        catch_up_to (a catch-up's nodes' epoch) makes the epoch exactly that, or writes
        nothing and returns None when the store holds it already: next_epoch() decides, on
        the read the compare-and-swap checks.

        presence: the fence also gets key "present", the sorted nodes whose watcher kept its
        presence key at the revision of the raise (read in the same transaction, so no
        watcher can come or go between the two), or None when the store would not let this
        user read them (the fence is raised all the same). Those are the watchers the
        rollback may wait for; the others get the push at once.
        """
        if action not in FENCE_ACTIONS:
            raise FleetError(
                "action must be one of %s; got %r" % (", ".join(FENCE_ACTIONS), action),
                {"field": "action", "value": action},
            )
        if isinstance(at_least, bool) or not isinstance(at_least, int) or at_least < 0:
            raise FleetError(
                "at_least must be a whole number >= 0; got %r" % (at_least,),
                {"field": "at_least", "value": at_least},
            )
        for _attempt in range(CAS_ATTEMPTS):
            current = self.fence()
            epoch = next_epoch(current["epoch"], at_least, catch_up_to)
            if epoch is None:
                return None
            raised = {
                "epoch": epoch,
                "action": action,
                "reason": reason,
                "actor": actor,
                "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "at_unix": round(time.time(), 3),
            }
            if presence:
                done, present = self._put_fence_reading_presence(raised, current["mod_revision"])
            else:
                done, _now = self.client.put_if(self.key("fence"), raised, current["mod_revision"])
            if done:
                return dict(raised, present=present) if presence else raised
        raise FleetError(
            "the fence changed under %d attempts to raise it; another rollback is raising it "
            "too. Read it again with zerolayer.fleet.rollout_fence action=read" % CAS_ATTEMPTS,
            {"field": "fence"},
        )

    def _put_fence_reading_presence(self, raised, mod_revision):
        """(done, sorted present nodes or None): the fence's compare-and-swap with the read
        of presence/ in it. A store that refuses the read (a user without read on presence/)
        refuses the whole transaction: the fence is then raised alone, as before presence."""
        prefix = self.key("presence", "")
        try:
            done, _revision, kvs = self.client.put_if_reading(
                self.key("fence"), raised, mod_revision, prefix
            )
        except FleetError as exc:
            if not _refused_by_permission(exc):
                raise
            done, _now = self.client.put_if(self.key("fence"), raised, mod_revision)
            return done, None
        return done, _nodes_under(prefix, kvs)

    # ------------------------------------------------------------ acknowledgements

    def acknowledged(self, epoch, nodes, deep=False):
        """{node: ack} of the nodes whose watcher confirmed epoch (or a later one).

        An ack counts once per node (its own key), only for a node asked about, and only
        when it is for this epoch or later and says the node reads back the fence's state;
        its own timestamps (a node's clock) are not used for anything. With deep, only a
        deep rollback's ack counts: a later fast fence's ack says nothing of the router.
        """
        return self._acknowledged_since(epoch, set(nodes), deep)[0]

    def direct_drains(self, epoch, nodes):
        """{node: its watcher's direct-drain report (acks/<node>/direct)} of the nodes asked
        about whose report is for epoch or a later one: how long the direct connections that
        pooled clients held took to leave after the fence, or how many were left."""
        return {
            node: report
            for node, report in self._node_reports("direct", nodes).items()
            if _whole_number(report.get("epoch")) and report["epoch"] >= epoch
        }

    def live_readings(self, nodes):
        """{node: what its watcher last read of the node (acks/<node>/live): node_epoch,
        attached, mode, weights_bp {route: weight in basis points}, at_unix} of the nodes
        asked about that have one. A node missing has no running watcher (the reading lives
        on the watcher's lease) or never had one."""
        return {
            node: reading
            for node, reading in self._node_reports("live", nodes).items()
            if isinstance(reading.get("weights_bp"), dict)
        }

    def _node_reports(self, leaf, nodes):
        """{node: the JSON object at acks/<node>/<leaf>} of the nodes asked about, from one
        read; a report that is no JSON object is left out (it tells nothing)."""
        wanted = set(nodes)
        found = {}
        prefix = self.key("acks") + "/"
        for kv in self.client.get_prefix(prefix):
            node, _slash, key_leaf = kv.key[len(prefix) :].partition("/")
            if key_leaf != leaf or node not in wanted:
                continue
            try:
                report = kv.json()
            except FleetError:
                continue
            if isinstance(report, dict):
                found[node] = report
        return found

    def _acknowledged_since(self, epoch, wanted, deep, revision=0):
        """(acknowledged() of the acks written at revision or later, the read's revision)."""
        found = {}
        kvs, read_at = self.client.get_prefix_at(self.key("acks") + "/", min_mod_revision=revision)
        for kv in kvs:
            node = kv.key[len(self.key("acks") + "/") :]
            if node not in wanted:
                continue
            try:
                ack = kv.json()
            except FleetError:
                continue  # a garbled ack confirms nothing; the push reaches that node
            ack_epoch = ack.get("epoch") if isinstance(ack, dict) else None
            if (
                _whole_number(ack_epoch)
                and ack_epoch >= epoch
                and ack.get("confirmed") is True
                and (not deep or ack.get("action") == "deep")
            ):
                found[node] = ack
        return found, read_at

    def wait_for_acks(
        self,
        epoch,
        nodes,
        wait_s,
        poll_s=0.02,
        clock=time.monotonic,
        sleep=None,
        deep=False,
        quiet_s=None,
        enough=None,
    ):
        """Count acknowledgements of epoch as they arrive, for at most wait_s seconds.

        enough (a set of the nodes, None: all of them): the count also ends once every node
        of it acknowledged. The rollback passes the nodes whose watcher is present: the
        others have no watcher to answer, and each moment waited for them only delays
        their push. An empty set ends the count after its first read.

        The count also ends once acknowledgements have come in and then a read, asked
        quiet_s or more after the last new one, finds none new (None: never): the watchers
        that answer do so within about 0.1 s of the fence, so a node still silent by then
        is down or cut off, and waiting longer only delays its push. A read that is slow
        (a busy store) never ends the count by itself. Returns (acked {node: ack with
        seen_after_s, the controller's own clock}, lagging [nodes], waited_s). A read that
        fails is tried again while wait_s lasts; the lagging nodes then get the push. After
        the first read, each read asks only for the acks written since the one before: at
        1,000 nodes a whole read every 20 ms kept the store and the controller busy decoding
        acknowledgements already counted.
        """
        sleep = sleep or time.sleep
        started = clock()
        acked = {}
        last_new = None
        wanted = set(nodes)
        since = 0
        while True:
            asked = clock()
            try:
                found, read_at = self._acknowledged_since(epoch, wanted, deep, since)
                since = read_at + 1
            except StoreUnavailable:
                found = {}
            now = clock()
            new = [node for node in found if node not in acked]
            for node in new:
                acked[node] = dict(found[node], seen_after_s=round(now - started, 3))
            if new:
                last_new = now
            if len(acked) == len(wanted) or now - started >= wait_s:
                break
            if enough is not None and all(node in acked for node in enough):
                break
            if quiet_s is not None and last_new is not None and not new:
                if asked - last_new >= quiet_s:
                    break
            sleep(poll_s)
        lagging = [node for node in nodes if node not in acked]
        return acked, lagging, round(clock() - started, 3)

    # ------------------------------------------------------------ one owner per scope

    def owner(self, scope):
        """The holder of scope with its lease's seconds left, or None."""
        kv = self.client.get(self.key("owners", validate_scope(scope)))
        if kv is None:
            return None
        holder = kv.json()
        holder["lease"] = kv.lease
        holder["ttl_left_s"] = self.client.lease_ttl(kv.lease) if kv.lease else -1
        return holder

    def acquire(self, scope, identity, ttl_s, alive=None, sleep=time.sleep, hosts=None):
        """Take scope for identity on a new lease; OwnerConflict names the holder.

        A holder that is a dead runner of this same host (alive(pid, started) false) keeps
        the scope until its lease expires, as everyone can see; acquire waits for that (at
        most its TTL) instead of refusing, so a resume after a crash just works.

        hosts, when given, are the scope's hosts: a scope under another name whose holder
        named hosts that overlap them is refused too (two patterns, one node), and they are
        kept with the holder for the scopes taken after it.
        """
        waited = 0.0
        limit = None
        while True:
            try:
                return self._acquire_once(scope, identity, ttl_s, hosts)
            except OwnerConflict as conflict:
                holder, left = conflict.details["holder"], conflict.details["ttl_left_s"]
                # Only the same scope's dead holder is waited for, never an overlapping one.
                if alive is None or "overlap" in conflict.details or not _dead_here(holder, alive):
                    raise
                # The wait is bounded once, by the lease time left at the first conflict:
                # etcd removes an expired lease's keys a moment after its TTL (seconds on a
                # busy store, when the lease reads as -1), so a few tries more after that.
                if limit is None:
                    limit = max(left, 0) + 10
                if waited > limit:
                    raise
                pause = max(0.5, min(left, 3600))
                sleep(pause)
                waited += pause

    def _acquire_once(self, scope, identity, ttl_s, hosts=None):
        scope = validate_scope(scope)
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int) or not 5 <= ttl_s <= 3600:
            raise FleetError(
                "ttl must be whole seconds from 5 to 3600; got %r" % (ttl_s,),
                {"field": "ttl", "value": ttl_s},
            )
        hosts = validate_hosts(hosts)
        for _attempt in range(OVERLAP_READS):
            if hosts is not None:
                owners, read_at = self.client.get_prefix_at(self.key("owners", ""))
                _refuse_overlap(scope, hosts, owners, self.key("owners", ""))
            lease = self.client.grant_lease(ttl_s)
            holder = dict(identity, lease=lease, ttl_s=ttl_s)
            if hosts is not None:
                holder["hosts"] = hosts
            # The owners read above must still hold: a scope taken meanwhile, under another
            # name, may overlap this one (read again and decide again).
            done, current = self.client.put_if(
                self.key("owners", scope),
                holder,
                0,
                lease=lease,
                unchanged_since=(self.key("owners", ""), read_at) if hosts is not None else None,
            )
            if done:
                return holder
            self.client.revoke_lease(lease)
            if current is not None:
                break
        else:
            raise FleetError(
                "scope %s: the owners in the store kept changing over %d reads; nothing was "
                "changed, try again" % (scope, OVERLAP_READS),
                {"field": "scope"},
            )
        other = current.json() if current is not None else {}
        left = self.client.lease_ttl(current.lease) if current is not None and current.lease else -1
        raise OwnerConflict(
            "scope %s is held by another runner: host %s, pid %s, rollout %s, since %s (its "
            "lease has %s s left; a runner that died lets it expire). Nothing was changed."
            % (
                scope,
                other.get("host"),
                other.get("pid"),
                other.get("rollout_id"),
                other.get("since"),
                left,
            ),
            {"field": "scope", "holder": other, "ttl_left_s": left},
        )

    def confirm_owner(self, scope, lease):
        """The holder, when it is still the runner of lease; OwnerLost otherwise.

        A runner's lease expires when its heartbeat could not renew it for the TTL (a
        partition, a stalled controller); its owner key goes with it, and another runner
        may have taken the scope since. A runner confirms before each write that raises
        traffic, so that it never writes on a scope it no longer holds.
        """
        holder = self.owner(scope)
        if holder is not None and holder.get("lease") == int(lease):
            return holder
        if holder is None:
            now = "nobody holds it now"
        else:
            now = "it is held now by host %s, pid %s, rollout %s, since %s" % (
                holder.get("host"),
                holder.get("pid"),
                holder.get("rollout_id"),
                holder.get("since"),
            )
        raise OwnerLost(
            "this runner no longer owns scope %s: its lease %s expired (its heartbeat could "
            "not renew it for the lease's TTL: a partition or a stalled controller; the "
            "controller's journal says why, journalctl -t %s), and %s. Nothing was written; "
            "the nodes keep their weights. Find out who runs the rollout (zerolayer rollout "
            "status) before starting or resuming one." % (scope, lease, LOG_TAG, now),
            {"field": "lease", "holder": holder, "outcome": "refused"},
        )

    def release(self, scope, lease):
        """Give scope up: revoking the lease removes the owner key with it."""
        validate_scope(scope)
        self.client.revoke_lease(int(lease))


__all__ = [
    "OwnerConflict",
    "OwnerLost",
    "RolloutStore",
    "StoreUnavailable",
    "store_failure",
    "store_from_params",
]
