"""Every decision of the fence watcher: what one fence record asks of one node."""

import socket
import subprocess

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import FenceRefused
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.fence_watcher import (
    LeasedKey,
    config_routes,
    confirmed,
    plan,
    probe_path,
    proxy_after_deep,
)

DETACHED = {"attached": False, "mode": "detached"}


@pytest.mark.parametrize(
    "fence, node_epoch, last_ack, expected",
    [
        # No rollback ever: nothing to do.
        ({"epoch": 0}, 0, 0, ("none", 0, None)),
        # The store is ahead of the node: act, for each action as the node knows it.
        ({"epoch": 3, "action": "fast"}, 2, 2, ("apply", 3, "fast")),
        ({"epoch": 3, "action": "abort"}, 2, 2, ("apply", 3, "fast")),
        ({"epoch": 3, "action": "deep"}, 0, 0, ("apply", 3, "deep")),
        # A push got there first (node at 3), the watcher has not acknowledged 3: ack only.
        ({"epoch": 3, "action": "fast"}, 3, 2, ("ack", 3, "fast")),
        # The node is ahead (its own epoch + 1 while the store was down): ack, no second act.
        ({"epoch": 3, "action": "fast"}, 5, 0, ("ack", 3, "fast")),
        # Acknowledged already (a repeat event, a restart of the watcher): nothing.
        ({"epoch": 3, "action": "deep"}, 3, 3, ("none", 3, "deep")),
        # A new rollout after the rollback raised weights at epoch 3: never zeroed again.
        ({"epoch": 3, "action": "fast", "reason": "p99"}, 3, 3, ("none", 3, "fast")),
        # The store caught up with nodes that fenced themselves: record it, or only ack it.
        ({"epoch": 6, "action": "catch_up"}, 5, 5, ("apply", 6, "catch_up")),
        ({"epoch": 6, "action": "catch_up"}, 6, 5, ("ack", 6, "catch_up")),
    ],
)
def test_plan(fence, node_epoch, last_ack, expected):
    assert plan(fence, node_epoch, last_ack) == expected


@pytest.mark.parametrize(
    "fence, field",
    [
        ({"action": "fast"}, "epoch"),
        ({"epoch": "7", "action": "fast"}, "epoch"),
        ({"epoch": True, "action": "fast"}, "epoch"),
        ({"epoch": -1, "action": "fast"}, "epoch"),
        ("not a record", "epoch"),
        ({"epoch": 4, "action": "sideways"}, "action"),
        ({"epoch": 4}, "action"),
    ],
)
def test_records_the_watcher_refuses(fence, field):
    with pytest.raises(FenceRefused) as refused:
        plan(fence, 0, 0)
    assert refused.value.details["field"] == field
    assert "nothing was changed" in refused.value.message.lower()


def test_an_epoch_below_an_acknowledged_one_is_refused():
    with pytest.raises(FenceRefused, match="below epoch 5 this node already acknowledged"):
        plan({"epoch": 4, "action": "fast"}, 5, 5)


@pytest.mark.parametrize(
    "action, seen, expected",
    [
        ("fast", {"weights_bp": {"chat": 0, "batch": 0}}, True),
        ("fast", {"weights_bp": {"chat": 0, "batch": 100}}, False),
        ("fast", {"weights_bp": {}}, True),
        # A catch-up asks only that the node hold the epoch; its weights are its own.
        ("catch_up", {"node_epoch": 6, "weights_bp": {"chat": 500}}, True),
        ("catch_up", {"node_epoch": 7, "weights_bp": {}}, True),
        ("catch_up", {"node_epoch": 5, "weights_bp": {"chat": 0}}, False),
        ("deep", {"attached": False, "mode": "detached"}, True),
        ("deep", {"attached": True, "mode": "detached"}, False),
        ("deep", {"attached": False, "mode": "active"}, False),
        ("deep", {**DETACHED, "proxy_running": True, "paths": {"chat": "proxy"}}, True),
        ("deep", {**DETACHED, "proxy_running": None, "paths": {"chat": "proxy"}}, True),
        ("deep", {**DETACHED, "proxy_running": False, "paths": {"chat": "proxy"}}, False),
        ("deep", {**DETACHED, "proxy_running": True, "paths": {"chat": "direct"}}, False),
        (
            "deep",
            {**DETACHED, "proxy_running": True, "paths": {"a": "proxy", "b": "no answer"}},
            False,
        ),
    ],
)
def test_confirmed(action, seen, expected):
    assert confirmed(action, seen, 6) is expected


@pytest.mark.parametrize(
    "config, expected",
    [
        ({"routes": [{"name": "chat", "port": 8080, "weight": 5}]}, [("chat", 8080)]),
        ({"routes": [{"name": "chat"}, {"port": 1}, "x", {"name": "b", "port": True}]}, []),
        ({"routes": None}, []),
        ({}, []),
    ],
)
def test_only_routes_with_a_name_and_port_are_probed(config, expected):
    assert [(r["name"], r["port"]) for r in config_routes(config)] == expected


def test_after_a_deep_rollback_the_proxy_unit_is_started_and_asked_if_active():
    calls = []

    def run(argv, **_kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 3 if argv[1] == "is-active" else 0)

    seen = proxy_after_deep([], "nginx.service", run=run)
    assert calls == [
        ["systemctl", "start", "nginx.service"],
        ["systemctl", "is-active", "--quiet", "nginx.service"],
    ]
    assert seen == {"proxy_running": False, "paths": {}}
    assert proxy_after_deep([], None, run=run) == {"proxy_running": None, "paths": {}}
    assert len(calls) == 2, "no proxy unit: nothing is started"


def test_a_port_nobody_answers_is_named_not_counted_as_the_proxy():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    assert probe_path(port).startswith("no answer: ")


class RenewingClient:
    """A store client whose lease renewals answer as scripted: a TTL, or an error to raise."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.granted = 0

    def keep_alive(self, lease):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def grant_lease(self, ttl_s):
        self.granted += 1
        return 100 + self.granted

    def put(self, key, value, lease):
        pass


def leased(client):
    key = LeasedKey(client, "/zl/presence/n1", 6)
    key.put({"node": "n1"})
    return key


def test_a_renewal_the_store_fails_keeps_the_lease_for_the_next_turn():
    busy = FleetError(
        "the rollout store refused /v3/lease/keepalive: etcdserver: request timed out"
    )
    client = RenewingClient(busy, 6)
    key = leased(client)
    with pytest.raises(FleetError):
        key.renew()
    assert key.lease == 101, "a request the store failed is not a lost lease"
    assert key.renew() is True and client.granted == 1


@pytest.mark.parametrize(
    "answer",
    [0, FleetError("the rollout store refused /v3/lease/keepalive: requested lease not found")],
)
def test_a_lease_the_store_no_longer_holds_is_let_go_and_the_next_put_takes_a_new_one(answer):
    client = RenewingClient(answer)
    key = leased(client)
    assert key.renew() is False and key.lease == 0
    key.put({"node": "n1"})
    assert key.lease == 102 and client.granted == 2
