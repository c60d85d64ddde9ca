"""Which events the retention deletes: their time, the cutoff, and the deletes in batches."""

import base64
import datetime
import json

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import events_retention as er
from ansible_collections.zerolayer.fleet.plugins.module_utils.store.etcd_v3 import EtcdClient

NOW = datetime.datetime(2025, 6, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
DAY = 86400
PREFIX = "/zerolayer/events/"


def value(at):
    return json.dumps({"type": "stage_started", "at": at, "rollout_id": "chat-a"}).encode()


def days_ago(days):
    return (NOW - datetime.timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_an_event_is_dated_by_its_at():
    assert er.event_time(PREFIX + "chat-a/wave_canary.000000000012.000", value(days_ago(3))) == (
        NOW - datetime.timedelta(days=3)
    )
    # Unix seconds are a time too (parse_timestamp's grammar).
    assert er.event_time(PREFIX + "chat-a/x", value(NOW.timestamp())) == NOW


def test_an_emitted_event_without_a_readable_at_is_dated_by_its_key():
    stamp = int((NOW - datetime.timedelta(days=40)).timestamp() * 1e9)
    key = PREFIX + "_fleet/~%d.0a1b2c3d" % stamp
    for broken in (b"not json", json.dumps({"at": "yesterday"}).encode(), b"{}", b"[1]"):
        assert er.event_time(key, broken) == NOW - datetime.timedelta(days=40), broken


def test_an_event_with_no_time_anywhere_is_undated():
    assert er.event_time(PREFIX + "chat-a/wave_canary.000000000012.000", b"{}") is None
    assert er.event_time(PREFIX + "chat-a/~notanumber.x", b"garbage") is None


def test_only_events_older_than_the_retention_expire():
    entries = [
        (PREFIX + "a/w.000000000001.000", 11, value(days_ago(31))),
        (PREFIX + "a/w.000000000002.000", 12, value(days_ago(30))),  # exactly at the cutoff
        (PREFIX + "a/w.000000000003.000", 13, value(days_ago(29))),
        (PREFIX + "b/w.stuck.20250101T000000Z", 14, value(days_ago(400))),
        (PREFIX + "b/w.000000000004.000", 15, b"{}"),
        (PREFIX + "c/w.000000000005.000", 16, value(days_ago(-1))),  # a clock ahead: kept
    ]
    expired, undated = er.expired_events(entries, NOW, 30 * DAY)
    assert expired == [
        (PREFIX + "a/w.000000000001.000", 11),
        (PREFIX + "b/w.stuck.20250101T000000Z", 14),
    ]
    assert undated == 1


@pytest.mark.parametrize("bad", [0, -1, True, "30d", float("nan"), float("inf"), 10000 * DAY])
def test_a_bad_retention_is_refused_by_name(bad):
    with pytest.raises(FleetError, match="events_retention_s must be a number of seconds above 0"):
        er.expired_events([], NOW, bad)


class FakeClient:
    """Deletes in transactions: a key in `gone` fails its compare (another member deleted it)."""

    def __init__(self, gone=()):
        self.gone = set(gone)
        self.deleted = []
        self.transactions = []

    def delete_if_unchanged(self, expired):
        keys = [key for key, _mod_revision in expired]
        self.transactions.append(len(keys))
        if self.gone & set(keys):
            return False
        self.deleted.extend(keys)
        return True


def test_deletes_go_in_batches_below_etcds_transaction_limit():
    expired = [("k%03d" % n, n + 1) for n in range(250)]
    client = FakeClient()
    assert er.delete_events(client, expired) == 250
    assert client.transactions == [100, 100, 50]
    assert client.deleted == [key for key, _rev in expired]


def test_a_batch_with_a_key_already_gone_is_retried_key_by_key():
    expired = [("k%03d" % n, n + 1) for n in range(5)]
    client = FakeClient(gone={"k002"})
    assert er.delete_events(client, expired, batch=5) == 4
    assert client.transactions == [5, 1, 1, 1, 1, 1]
    assert client.deleted == ["k000", "k001", "k003", "k004"]


def test_each_delete_compares_the_revision_of_the_key_it_deletes():
    client = EtcdClient("http://127.0.0.1:9")
    sent = []
    client.call = lambda path, body: sent.append((path, body)) or {"succeeded": True}
    assert client.delete_if_unchanged([("k1", 4), ("k2", 7)]) is True
    ((path, body),) = sent
    assert path == "/v3/kv/txn"
    compared = [base64.b64decode(c["key"]).decode() for c in body["compare"]]
    deleted = [base64.b64decode(s["request_delete_range"]["key"]).decode() for s in body["success"]]
    assert compared == deleted == ["k1", "k2"]
    assert [(c["target"], c["result"], c["mod_revision"]) for c in body["compare"]] == [
        ("MOD", "EQUAL", "4"),
        ("MOD", "EQUAL", "7"),
    ]
