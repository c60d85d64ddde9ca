"""The store as the rollout_store role sets it up, against a real etcd: authentication on,
JWT tokens signed with a key of the store's own, and the store
exporter's role as the role grants it: what it exports, not the notification
sinks. The exporter's permissions are read from the role's vars/main.yml, so this test
judges the role's own grant."""

import ast
import base64
import datetime
import json
import os
import secrets
import subprocess
import time

import jinja2
import pytest
import yaml
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import format_timestamp
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import fence_watcher
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import (
    events_retention,
    rollout_events,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter

from .etcd_member import running_etcd
from .test_store_exporter import stuck_wave

ROLE_VARS = os.path.join(
    os.path.dirname(__file__), "..", "..", "roles", "rollout_store", "vars", "main.yml"
)
PREFIX = "/zlt-auth/"
TOKEN_TTL_S = 2
PASSWORDS = {name: secrets.token_hex(12) for name in ("root", "controller", "exporter", "node")}
# zl-node-1 and zl-node-10: a permission on a bare prefix of the first would cover the second.
NODES = ["zl-node-1", "zl-node-10"]
PERM_TYPES = {"read": "READ", "write": "WRITE", "readwrite": "READWRITE"}


def b64(text):
    return base64.b64encode(text.encode()).decode()


def prefix_end(key):
    return key[:-1] + chr(ord(key[-1]) + 1)


def exporter_permissions(aborts=False, watch_interval=10, retention_days=30):
    """The permissions of the role's _rollout_store_exporter_role, rendered as Ansible
    would for these settings."""
    with open(ROLE_VARS) as handle:
        role_vars = yaml.safe_load(handle)
    env = jinja2.Environment(autoescape=False)  # noqa: S701 (a YAML value, not HTML)
    env.filters["bool"] = lambda value: str(value).strip().lower() in ("true", "1", "yes")
    settings = {
        "rollout_store_prefix": PREFIX,
        "rollout_store_exporter_aborts_stuck": aborts,
        "rollout_store_exporter_deadline_watch_interval": watch_interval,
        "rollout_store_events_retention_days": retention_days,
    }
    settings["_rollout_store_exporter_aborts"] = env.from_string(
        role_vars["_rollout_store_exporter_aborts"]
    ).render(settings)
    rendered = env.from_string(role_vars["_rollout_store_exporter_role"]["permissions"])
    return ast.literal_eval(rendered.render(settings).strip())


def node_permissions(nodes):
    """{node: its role's permissions} of the role's _rollout_store_node_roles, rendered as
    Ansible would for these nodes."""
    with open(ROLE_VARS) as handle:
        role_vars = yaml.safe_load(handle)
    env = jinja2.Environment(autoescape=False)  # noqa: S701 (a YAML value, not HTML)
    rendered = env.from_string(role_vars["_rollout_store_node_roles"]).render(
        {"rollout_store_prefix": PREFIX, "_rollout_store_node_hosts": nodes}
    )
    roles = ast.literal_eval(rendered.strip())
    return {role["name"][len("zerolayer-node-") :]: role["permissions"] for role in roles}


def token_keys(directory):
    key, pub = os.path.join(directory, "token-key.pem"), os.path.join(directory, "token.pub.pem")
    subprocess.run(
        ["openssl", "ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", key],
        check=True,
        capture_output=True,
    )
    subprocess.run(
        ["openssl", "ec", "-in", key, "-pubout", "-out", pub], check=True, capture_output=True
    )
    return key, pub


def add_user(root, name, password, role, permissions):
    root.call("/v3/auth/role/add", {"name": role})
    for perm in permissions:
        grant = {"permType": PERM_TYPES[perm["type"]], "key": b64(perm["key"])}
        if perm["prefix"]:
            grant["range_end"] = b64(prefix_end(perm["key"]))
        ans = root.call("/v3/auth/role/grant", {"name": role, "perm": grant})
        assert "header" in ans, ans
    root.call("/v3/auth/user/add", {"name": name, "password": password})
    root.call("/v3/auth/user/grant", {"user": name, "role": role})


@pytest.fixture(scope="module")
def jwt_member(tmp_path_factory):
    """A member with authentication on and the role's token settings (JWT, ES256, a key of
    its own), with a short TTL; users: root, the controller (readwrite on PREFIX), the
    exporter (the role's grant) and the exporter that may abort."""
    key, pub = token_keys(str(tmp_path_factory.mktemp("token-key")))
    token = "jwt,pub-key=%s,priv-key=%s,sign-method=ES256,ttl=%ds" % (pub, key, TOKEN_TTL_S)
    with running_etcd(["--auth-token", token]) as member:
        anonymous = EtcdClient(member.url, timeout=3)
        anonymous.call("/v3/auth/user/add", {"name": "root", "password": PASSWORDS["root"]})
        anonymous.call("/v3/auth/role/add", {"name": "root"})
        anonymous.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
        anonymous.call("/v3/auth/enable", {})
        root = EtcdClient(member.url, timeout=3, user="root", password=PASSWORDS["root"])
        add_user(
            root, "controller", PASSWORDS["controller"], "controller",
            [{"type": "readwrite", "key": PREFIX, "prefix": True}],
        )  # fmt: skip
        add_user(root, "exporter", PASSWORDS["exporter"], "exporter", exporter_permissions())
        add_user(
            root, "exporter-aborts", PASSWORDS["exporter"], "exporter-aborts",
            exporter_permissions(aborts=True),
        )  # fmt: skip
        for node, permissions in node_permissions(NODES).items():
            add_user(root, node, PASSWORDS["node"], "zerolayer-node-" + node, permissions)
        member.root = root
        yield member


def store_as(member, user):
    password = PASSWORDS.get(user, PASSWORDS["node" if user in NODES else "exporter"])
    return RolloutStore(EtcdClient(member.url, timeout=3, user=user, password=password), PREFIX)


def jwt_parts(token):
    parts = token.split(".")
    assert len(parts) == 3 and all(parts), token
    return [json.loads(base64.urlsafe_b64decode(p + "=" * (-len(p) % 4))) for p in parts[:2]]


def test_the_role_grants_the_exporter_what_it_exports_and_nothing_more():
    assert exporter_permissions() == [
        {"type": "read", "key": PREFIX + "fence", "prefix": False},
        {"type": "read", "key": PREFIX + "owners/", "prefix": True},
        {"type": "read", "key": PREFIX + "rollouts/", "prefix": True},
        {"type": "read", "key": PREFIX + "presence/", "prefix": True},
        {"type": "readwrite", "key": PREFIX + "events/", "prefix": True},
    ]
    aborts = exporter_permissions(aborts=True)
    assert {(p["key"], p["type"]) for p in aborts} == {
        (PREFIX + "fence", "readwrite"),
        (PREFIX + "owners/", "read"),
        (PREFIX + "rollouts/", "readwrite"),
        (PREFIX + "presence/", "read"),
        (PREFIX + "events/", "readwrite"),
    }
    quiet = exporter_permissions(watch_interval=0, retention_days=0, aborts=True)
    assert [p["key"] for p in quiet] == [
        PREFIX + "fence",
        PREFIX + "owners/",
        PREFIX + "rollouts/",
        PREFIX + "presence/",
    ]
    assert all(p["type"] == "read" for p in quiet), "no watch: no abort either"


def test_tokens_are_es256_jwts(jwt_member):
    store = store_as(jwt_member, "controller")
    store.client.put(PREFIX + "probe", "1")
    header, claims = jwt_parts(store.client._token)
    assert header["alg"] == "ES256"
    assert claims["username"] == "controller"


def test_an_expired_jwt_is_renewed(jwt_member):
    store = store_as(jwt_member, "controller")
    store.client.put(PREFIX + "probe", "1")
    first = store.client._token
    time.sleep(TOKEN_TTL_S + 1.5)
    store.client.put(PREFIX + "probe", "2")
    assert store.client._token not in (None, first), "the token was not renewed"
    assert store.client.get(PREFIX + "probe").value == b"2"


def test_a_jwt_signed_before_a_change_of_users_is_renewed(jwt_member):
    """etcd refuses a JWT whose auth revision predates a change of users or roles
    ("revision of auth store is old"); the role changes users whenever a node comes or goes,
    and a long-running client (a node's watcher, the exporter) must sign in again."""
    store = store_as(jwt_member, "controller")
    store.client.put(PREFIX + "probe", "1")
    first = store.client._token
    jwt_member.root.call(
        "/v3/auth/user/add", {"name": "node-%s" % secrets.token_hex(3), "password": "x" * 16}
    )
    store.client.put(PREFIX + "probe", "3")
    assert store.client._token not in (None, first)
    assert store.client.get(PREFIX + "probe").value == b"3"


def test_the_exporters_user_cannot_read_the_sinks(jwt_member, webhook_receiver):
    controller = store_as(jwt_member, "controller")
    notify.write_sinks(
        controller,
        [{"name": "oncall", "url": webhook_receiver.url("/oncall"), "allow_http": True,
          "headers": {"Authorization": "Bearer secret"}}],
    )  # fmt: skip
    exporter = store_as(jwt_member, "exporter")
    for read in (
        lambda: notify.read_sinks(exporter),
        lambda: exporter.client.get(notify.config_key(exporter)),
        lambda: exporter.client.get_prefix(PREFIX),
        lambda: exporter.client.get_prefix(PREFIX + "acks/"),
    ):
        with pytest.raises(FleetError, match="permission denied"):
            read()
    with pytest.raises(FleetError, match="permission denied"):
        exporter.client.put(notify.cursor_key(exporter, "oncall"), "{}")


def test_the_exporter_still_exports_announces_and_prunes_with_its_own_user(
    jwt_member, webhook_receiver
):
    controller = store_as(jwt_member, "controller")
    notify.write_sinks(
        controller, [{"name": "oncall", "url": webhook_receiver.url("/oncall"), "allow_http": True}]
    )
    records = stuck_wave(controller, False, "chat-s")
    exporter = store_as(jwt_member, "exporter")

    state = store_exporter.collect(exporter)
    assert state.get("up") is not False, state
    text = store_exporter.render(state)
    assert "zerolayer_rollout_store_up 1" in text
    assert 'zerolayer_rollout_store_wave_stuck{rollout_id="chat-s",wave="wave_canary"} 1' in text

    announced = store_exporter.watch_deadlines(exporter, actor="exporter@m1")
    assert announced == [{"record_key": "chat-s/wave_canary", "action": "announce"}]
    assert store_exporter.watch_deadlines(exporter, actor="exporter@m2") == []
    stuck = [
        e for e in rollout_events.list_events(controller, "chat-s", with_fleet=False)
        if e["type"] == "stuck"
    ]  # fmt: skip
    assert len(stuck) == 1 and stuck[0]["actor"] == "exporter@m1"
    # The exporter sent nothing (it cannot read where to): the fleet's next sender does.
    assert webhook_receiver.bodies("/oncall") == []
    assert notify.send_now(controller) == "caught up"
    sent = [body for body in webhook_receiver.bodies("/oncall") if body["type"] == "stuck"]
    assert len(sent) == 1 and sent[0]["rollout_id"] == "chat-s"
    assert records.read()[0]["outcome"] == "running"

    # The events' retention, with the exporter's user.
    old = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(days=40)
    rollout_events.emit(
        controller,
        rollout_events.event("paused", "chat-old", format_timestamp(old), "op"),
    )
    done = events_retention.prune(exporter, 30 * 86400.0)
    assert done["deleted"] == 1 and done["kept"] >= 1, done


def test_the_exporter_that_may_abort_aborts_with_its_own_user(jwt_member):
    controller = store_as(jwt_member, "controller")
    stuck_wave(controller, True, "chat-t")
    exporter = store_as(jwt_member, "exporter")
    # Without rollout_store_exporter_aborts_stuck its user may not raise the fence.
    with pytest.raises(FleetError, match="permission denied"):
        store_exporter.watch_deadlines(exporter, may_abort=True)
    assert controller.fence()["epoch"] == 0
    aborts = store_as(jwt_member, "exporter-aborts")
    other = stuck_wave(controller, True, "chat-u")
    announced = store_exporter.watch_deadlines(aborts, may_abort=True, actor="exporter@m1")
    assert {"record_key": "chat-u/wave_canary", "action": "abort"} in announced
    assert other.read()[0]["outcome"] == "aborted"
    assert controller.fence()["epoch"] == 1


def test_a_node_keeps_its_own_watchers_presence_and_no_other_nodes(jwt_member):
    node = store_as(jwt_member, "zl-node-1")
    presence = fence_watcher.Presence(node, "zl-node-1")
    presence.beat()
    assert presence.keep() and presence.error is None
    controller = store_as(jwt_member, "controller")
    kv = controller.client.get(PREFIX + "presence/zl-node-1")
    assert kv is not None and kv.json()["node"] == "zl-node-1" and kv.lease
    assert presence.keep(), "renewing its lease"
    # Its credentials write no other node's presence, zl-node-10's neither (a bare prefix
    # zl-node-1 would have covered it), and no key below its own.
    for other in ("zl-node-10", "zl-node-2"):
        with pytest.raises(FleetError, match="permission denied"):
            node.client.put(PREFIX + "presence/" + other, "{}")
    with pytest.raises(FleetError, match="permission denied"):
        node.client.put(PREFIX + "presence/zl-node-1/x", "{}")
    impostor = fence_watcher.Presence(node, "zl-node-10")
    impostor.beat()
    assert not impostor.keep() and "permission denied" in impostor.error
    # A clean stop revokes the lease with the node's own credentials: the key goes at once.
    presence.stop()
    assert controller.client.get(PREFIX + "presence/zl-node-1") is None
    # The exporter's user reads the presence of every node.
    presence.keep()
    assert store_exporter.read_presence(store_as(jwt_member, "exporter")) == ["zl-node-1"]
    presence.stop()
