"""A rollback's store calls against a real etcd in each way a store fails: none of them stops
the rollback. rollout_fence raise reports the failure (store_updated false, store_error and its
kind) and the nodes get the push; the count after it, wait_acks and wait_direct count no node;
a best-effort event is a warning. read still fails, so a canary does not start on such a store.

Each test starts the etcd it needs (a cluster that lost its quorum, a member over its quota, a
member with authentication on), ended by process group and removed, always.
"""

import secrets
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_fence_core import (
    ARGUMENT_SPEC,
    fence_call,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.rollout_store import (
    RolloutStore,
)

from .adhoc import run_module
from .etcd_member import etcd_cluster, running_etcd

PREFIX = "/zlt-faults/"
ROOT_PASSWORD = secrets.token_hex(12)


def params(endpoint, **overrides):
    """rollout_fence's arguments with the module's defaults, as AnsibleModule hands them on."""
    given = {name: spec.get("default") for name, spec in ARGUMENT_SPEC.items()}
    given.update(endpoints=[endpoint], prefix=PREFIX, timeout=1.0, reason="test")
    given.update(overrides)
    return given


def rollback_raise(endpoint, **overrides):
    return fence_call(params(endpoint, action="raise", nodes=["n1", "n2"], wait_s=1.0, **overrides))


def assert_store_not_updated(result, *kinds):
    assert result["store_updated"] is False and result["fence"] is None, result
    assert result["store_error_kind"] in kinds, result
    assert result["store_error"], result
    assert "acked" not in result, "no count without a raised fence: %s" % result


def enable_auth(url):
    client = EtcdClient(url, timeout=3)
    client.call("/v3/auth/user/add", {"name": "root", "password": ROOT_PASSWORD})
    client.call("/v3/auth/role/add", {"name": "root"})
    client.call("/v3/auth/user/grant", {"user": "root", "role": "root"})
    client.call("/v3/auth/enable", {})


@pytest.fixture
def auth_member():
    """A member with authentication on and simple tokens that expire after 1 s."""
    with running_etcd(["--auth-token", "simple", "--auth-token-ttl", "1"]) as member:
        enable_auth(member.url)
        yield member


@pytest.fixture
def password_files(tmp_path):
    right, wrong = tmp_path / "right.password", tmp_path / "wrong.password"
    right.write_text(ROOT_PASSWORD + "\n")
    wrong.write_text("not-the-password\n")
    for path in (right, wrong):
        path.chmod(0o600)
    return {"right": str(right), "wrong": str(wrong), "missing": str(tmp_path / "none")}


def test_a_cluster_without_a_leader_does_not_stop_the_raise():
    with etcd_cluster(3) as members:
        healthy = RolloutStore(EtcdClient(members[0].url, timeout=3), PREFIX)
        assert healthy.raise_fence("fast", "before the outage", "test")["epoch"] == 1
        for member in members[1:]:
            member.stop()
        started = time.monotonic()
        result = rollback_raise(members[0].url)
        elapsed = time.monotonic() - started
        # The member answers nothing in time (etcd waits for a leader) or says it has none.
        assert_store_not_updated(result, "unavailable", "refused")
        # A read and its one retry, each within the 1 s timeout, and no write attempted.
        assert elapsed < 10, elapsed
        with pytest.raises(FleetError):
            fence_call(params(members[0].url, action="read"))


def test_a_store_over_its_quota_does_not_stop_the_raise():
    with running_etcd(["--quota-backend-bytes", str(1 << 20)]) as member:
        client = EtcdClient(member.url, timeout=3)
        with pytest.raises(FleetError, match="database space exceeded"):
            for index in range(40):
                client.put("/filler/%d" % index, "x" * (256 << 10))
        result = rollback_raise(member.url)
        assert_store_not_updated(result, "refused")
        assert "database space exceeded" in result["store_error"], result
        # The fence is as it was: the store took no write.
        assert RolloutStore(client, PREFIX).fence()["epoch"] == 0


def test_a_refused_login_or_an_unreadable_password_does_not_stop_the_raise(
    auth_member, password_files
):
    refused = rollback_raise(auth_member.url, user="root", password_file=password_files["wrong"])
    assert_store_not_updated(refused, "refused")
    assert "authentication failed" in refused["store_error"], refused
    unreadable = rollback_raise(
        auth_member.url, user="root", password_file=password_files["missing"]
    )
    assert_store_not_updated(unreadable, "unusable")
    assert "password_file" in unreadable["store_error"], unreadable
    # The right password raises it, and a canary's read with the wrong one fails.
    raised = rollback_raise(auth_member.url, user="root", password_file=password_files["right"])
    assert raised["store_updated"] is True and raised["fence"]["epoch"] == 1, raised
    with pytest.raises(FleetError, match="authentication failed"):
        fence_call(
            params(
                auth_member.url, action="read", user="root", password_file=password_files["wrong"]
            )
        )


def test_an_expired_token_is_renewed_and_the_raise_goes_through(auth_member):
    store = RolloutStore(
        EtcdClient(auth_member.url, timeout=3, user="root", password=ROOT_PASSWORD), PREFIX
    )
    assert store.raise_fence("fast", "first", "test")["epoch"] == 1
    first_token = store.client._token
    time.sleep(2.5)  # past --auth-token-ttl 1
    assert store.raise_fence("fast", "second", "test")["epoch"] == 2
    assert store.client._token not in (None, first_token), "the token was not renewed"


def test_the_counts_after_a_raise_count_no_node_when_the_store_fails(auth_member, password_files):
    wrong = {"user": "root", "password_file": password_files["wrong"]}
    acks = fence_call(params(auth_member.url, action="wait_acks", epoch=1, nodes=["n1"], **wrong))
    assert acks["acked"] == {} and acks["lagging"] == ["n1"], acks
    assert acks["store_error_kind"] == "refused", acks
    direct = fence_call(
        params(auth_member.url, action="wait_direct", epoch=1, nodes=["n1"], wait_s=1, **wrong)
    )
    assert direct["direct"] == {} and direct["unreported"] == ["n1"], direct
    assert direct["store_error_kind"] == "refused", direct


def test_a_best_effort_event_on_a_refusing_store_is_a_warning(auth_member, password_files):
    common = {"type": "fleet_rolled_back", "reason": "test", "user": "root"}
    warned = run_module(
        "rollout_event", auth_member.url, PREFIX, best_effort=True,
        password_file=password_files["wrong"], **common,
    )  # fmt: skip
    assert not warned.get("failed") and warned["stored"] is False, warned
    assert any("authentication failed" in w for w in warned.get("warnings", [])), warned
    failed = run_module(
        "rollout_event", auth_member.url, PREFIX, password_file=password_files["wrong"], **common
    )
    assert failed.get("failed") and "authentication failed" in failed["msg"], failed
    # A bad event type is still refused with best_effort: it is input, not the store.
    refused = run_module(
        "rollout_event", auth_member.url, PREFIX, best_effort=True,
        password_file=password_files["right"], **{**common, "type": "no_such_event"},
    )  # fmt: skip
    assert refused.get("failed") and refused.get("field") == "type", refused


def test_zerolayer_says_a_refused_login_is_bad_input_naming_the_password_file(
    auth_member, password_files, capsys
):
    argv = ["--endpoints", auth_member.url, "--user", "root", "rollout", "status"]
    wrong = rollout_cli.main([*argv, "--password-file", str(password_files["wrong"])])
    said = capsys.readouterr().err
    assert wrong == rollout_cli.EXIT_BAD_INPUT, said
    assert "login of user root" in said and "password_file" in said, said
    assert said.count("\n") == 1, "one line"
    assert rollout_cli.main([*argv, "--password-file", str(password_files["right"])]) == 0
