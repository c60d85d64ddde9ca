"""Notification sinks: validation naming the field, routing by type and rollout, the two
formats, retries with backoff, and a bounded wait, against a real HTTP receiver on loopback."""

import socket
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.reports import notify
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import rollout_events as ev

AT = "2026-12-01T12:00:00Z"


def an_event(kind="paused", rollout_id="chat-1", **detail):
    return ev.event(kind, rollout_id, AT, "oncall@laptop", wave="canary", stage=2, weight=5,
                    reason="look at p99", **detail)  # fmt: skip


def sink(url, **fields):
    """A valid sink; the receivers these tests start listen on loopback, over http."""
    allowed = {"allow_http": True} if url.startswith("http://") else {}
    return notify.validate_sink(dict({"name": "oncall", "url": url}, **allowed, **fields))


def closed_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize(
    "raw, field, hint",
    [
        ({"url": "https://x"}, "notifications[0].name", "letters"),
        ({"name": "a b", "url": "https://x"}, "notifications[0].name", "letters"),
        ({"name": "a", "url": "ftp://x"}, "notifications[0].url", "http://"),
        ({"name": "a", "url": "https://x", "format": "teams"}, "notifications[0].format", "slack"),
        (
            {"name": "a", "url": "https://x", "events": ["boom"]},
            "notifications[0].events[0]",
            "paused",
        ),
        ({"name": "a", "url": "https://x", "events": []}, "notifications[0].events", "all"),
        (
            {"name": "a", "url": "https://x", "rollouts": "chat-*"},
            "notifications[0].rollouts",
            "glob",
        ),
        ({"name": "a", "url": "https://x", "attempts": 0}, "notifications[0].attempts", "1 to 10"),
        ({"name": "a", "url": "https://x", "timeout_s": True}, "notifications[0].timeout_s", "0.1"),
        ({"name": "a", "url": "https://x", "colour": "red"}, "notifications[0]", "allowed"),
    ],
)
def test_bad_sinks_name_the_field_and_allowed_values(raw, field, hint):
    with pytest.raises(FleetError) as caught:
        notify.validate_sinks([raw])
    assert caught.value.details["field"] == field, caught.value.message
    assert hint in caught.value.message


def test_a_sink_over_plain_http_needs_allow_http_by_name():
    with pytest.raises(FleetError) as caught:
        notify.validate_sinks([{"name": "a", "url": "http://hooks.internal/t0k3n"}])
    assert caught.value.details["field"] == "notifications[0].url"
    assert "allow_http: true" in caught.value.message and "t0k3n" not in caught.value.message
    (allowed,) = notify.validate_sinks(
        [{"name": "a", "url": "http://127.0.0.1:9/", "allow_http": True}]
    )
    assert allowed["allow_http"] is True
    assert notify.validate_sinks([{"name": "a", "url": "https://x"}])[0]["allow_http"] is False
    with pytest.raises(FleetError) as caught:
        notify.validate_sinks([{"name": "a", "url": "https://x", "allow_http": "yes"}])
    assert caught.value.details["field"] == "notifications[0].allow_http"


def test_a_bad_url_is_never_shown_in_the_error():
    with pytest.raises(FleetError) as caught:
        notify.validate_sinks([{"name": "a", "url": "gopher://secret-token@x"}])
    assert "secret-token" not in caught.value.message


def test_sink_names_are_unique():
    with pytest.raises(FleetError, match="twice: a"):
        notify.validate_sinks(
            [{"name": "a", "url": "https://x"}, {"name": "a", "url": "https://y"}]
        )


def test_redacted_hides_url_and_header_values():
    (shown,) = notify.redacted(
        [sink("https://hooks.example/T0/B0/s3cr3t", headers={"Authorization": "Bearer t"})]
    )
    assert shown["url"] == "<secret>" and shown["headers"] == {"Authorization": "<secret>"}


def test_a_sink_hears_its_types_and_rollouts_and_every_fleet_event():
    chosen = sink("http://x", events=["paused", "fleet_rolled_back"], rollouts=["chat-*"])
    assert notify.wants(chosen, an_event("paused", "chat-1"))
    assert not notify.wants(chosen, an_event("paused", "embed-1"))
    assert not notify.wants(chosen, an_event("resumed", "chat-1"))
    assert notify.wants(chosen, an_event("fleet_rolled_back", None))
    assert notify.wants(chosen, an_event("notification_test", None)), "a test reaches every sink"


def test_json_and_slack_bodies_reach_a_real_receiver_in_order(webhook_receiver):
    sinks = [
        sink(webhook_receiver.url("/json"), headers={"X-Token": "t0k"}),
        sink(webhook_receiver.url("/slack"), name="chat", format="slack"),
    ]
    events = [an_event("stage_started"), an_event("paused"), an_event("resumed")]
    report = notify.deliver(events, sinks, wait_s=5)
    assert report["delivered"] == 6 and report["failed"] == [], report
    as_json = webhook_receiver.bodies("/json")
    assert [body["type"] for body in as_json] == ["stage_started", "paused", "resumed"]
    assert as_json[1]["rollout_id"] == "chat-1" and as_json[1]["wave"] == "canary"
    assert as_json[1]["reason"] == "look at p99" and as_json[1]["source"] == "zerolayer.fleet"
    headers = [e["headers"] for e in webhook_receiver.received if e["path"] == "/json"]
    assert all(h.get("X-Token") == "t0k" for h in headers)
    as_slack = webhook_receiver.bodies("/slack")
    assert [body["text"].split(":")[0] for body in as_slack] == [
        "stage started",
        "paused",
        "resumed",
    ]
    assert as_slack[1]["blocks"][1]["elements"][0]["text"].startswith("rollout `chat-1`")


def test_a_refusing_receiver_is_retried_then_reported(webhook_receiver):
    webhook_receiver.behaviour["/hook"] = {"status": 503}
    report = notify.deliver([an_event()], [sink(webhook_receiver.url(), attempts=3)], wait_s=5)
    (failed,) = report["failed"]
    assert failed["attempts"] == 3 and "503" in failed["error"] and failed["sink"] == "oncall"
    assert len(webhook_receiver.received) == 3
    # Backoff: 0.25 s, then 0.5 s between the three tries.
    gaps = [
        b["at"] - a["at"] for a, b in zip(webhook_receiver.received, webhook_receiver.received[1:])
    ]
    assert gaps[0] >= 0.2 and gaps[1] >= 0.45, gaps


def test_a_down_or_slow_receiver_delays_nothing_beyond_the_wait(webhook_receiver):
    # The slow receiver answers after 30 s; the wait is 4 s. Ending well before the slow answer
    # shows nobody waited for it, with room for a loaded machine (no tight timing here).
    webhook_receiver.behaviour["/slow"] = {"delay_s": 30}
    sinks = [
        sink("http://127.0.0.1:%d/down" % closed_port(), name="down", attempts=2),
        sink(webhook_receiver.url("/slow"), name="slow", timeout_s=60),
        sink(webhook_receiver.url("/fine"), name="fine"),
    ]
    started = time.monotonic()
    report = notify.deliver([an_event("paused"), an_event("aborted")], sinks, wait_s=4.0)
    took = time.monotonic() - started
    assert took < 15.0, took
    assert report["delivered"] == 2, report
    failed = {(f["sink"], f["type"]): f for f in report["failed"]}
    assert set(failed) == {
        ("down", "paused"),
        ("down", "aborted"),
        ("slow", "paused"),
        ("slow", "aborted"),
    }
    assert (
        "Connection refused" in failed[("down", "paused")]["error"]
        or "refused" in failed[("down", "paused")]["error"]
    )
    assert "wait" in failed[("slow", "aborted")]["error"]
    assert [b["type"] for b in webhook_receiver.bodies("/fine")] == ["paused", "aborted"]


def test_deliver_never_raises_on_a_broken_post():
    def broken(_sink, _body, _timeout):
        raise RuntimeError("boom")

    report = notify.deliver([an_event()], [sink("http://x", attempts=1)], wait_s=1, post=broken)
    assert report["delivered"] == 0 and "boom" in report["failed"][0]["error"]


class SenderStore:
    """The sender's view of a store: its lease renewed, the lease revoked at the end."""

    def __init__(self):
        self.client = self
        self.revoked = []

    def keep_alive(self, _lease):
        return notify.SENDER_TTL_S

    def revoke_lease(self, lease):
        self.revoked.append(lease)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class ScriptedRounds:
    """_send_round answering each round as scripted: a count of events sent, or an error;
    0 once the script is over."""

    def __init__(self, answers):
        self.answers = list(answers)

    def __call__(self, _store, _lease, _post, _sleep):
        if not self.answers:
            return 0
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


def scripted_rounds(monkeypatch, *answers):
    monkeypatch.setattr(notify, "_send_round", ScriptedRounds(answers))
    monkeypatch.setattr(notify, "anything_pending", lambda _store: False)


BUSY = FleetError("the rollout store refused /v3/kv/range: etcdserver: request timed out")


def test_a_store_error_under_load_does_not_end_the_sender(monkeypatch):
    scripted_rounds(monkeypatch, BUSY, BUSY, 3)
    store, clock = SenderStore(), Clock()
    assert notify.run_sender(store, 7, sleep=clock.sleep, clock=clock) == "caught up"
    assert store.revoked == [7]


def test_a_store_that_keeps_failing_ends_the_sender_after_its_lease_time(monkeypatch):
    scripted_rounds(monkeypatch, *[BUSY] * 1000)
    clock = Clock()
    why = notify.run_sender(SenderStore(), 7, sleep=clock.sleep, clock=clock)
    assert "request timed out" in why
    assert notify.SENDER_TTL_S < clock.now < notify.SENDER_TTL_S + 1


@pytest.mark.parametrize(
    "lost",
    [
        notify.SenderLeaseLost("the sender's lease expired", {"field": "lease"}),
        FleetError("the rollout store refused /v3/lease/keepalive: requested lease not found"),
    ],
)
def test_a_lost_lease_ends_the_sender_at_once(monkeypatch, lost):
    scripted_rounds(monkeypatch, lost)
    clock = Clock()
    assert notify.run_sender(SenderStore(), 7, sleep=clock.sleep, clock=clock) == lost.message
    assert clock.now == 0
