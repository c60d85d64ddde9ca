"""The events' retention against a real etcd: events older than the retention go, the newer
ones, the undated ones and every other key stay, whoever wrote them and however many pages
they take."""

import datetime
import json

from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import (
    events_retention,
    rollout_events,
)

# Whole seconds: the events carry their time to the second, and one is exactly 30 days old.
NOW = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
RETENTION_S = 30 * 86400
SCHEDULE = [{"weight": 5, "hold": 600}, {"weight": 100, "hold": 0}]


def ago(days):
    return NOW - datetime.timedelta(days=days)


def stamp(moment):
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def planned_wave(store, rollout_id, when):
    """A wave planned and started at `when`: its record and the events its write makes."""
    record, _c, _n = rollout.plan(
        None, "%s:wave_canary" % rollout_id, SCHEDULE, None, False, when, "runner@ctl", epoch=0
    )
    record, _c = rollout.apply(record, "stage_started", {"stage": 0}, when, "runner@ctl")
    StoreRecords(store, "%s/wave_canary" % rollout_id).write(record, 0)


def event_keys(store):
    return sorted(kv.key for kv in store.client.get_prefix(store.key("events", "")))


def test_old_events_go_and_new_ones_stay(store):
    planned_wave(store, "chat-old", ago(45))  # two events, 45 days old
    planned_wave(store, "chat-new", ago(2))  # two events, 2 days old
    old_fleet = rollout_events.event("fleet_rolled_back", None, stamp(ago(31)), "oncall")
    new_fleet = rollout_events.event("fleet_rolled_back", None, stamp(ago(29)), "oncall")
    rollout_events.emit(store, old_fleet)
    rollout_events.emit(store, new_fleet)
    undated = store.key("events", "chat-odd", "wave_canary.000000000001.000")
    store.client.put(undated, json.dumps({"type": "stage_started"}))
    record_key = store.key("rollouts", "chat-old", "wave_canary")
    before = event_keys(store)
    assert len(before) == 7

    done = events_retention.prune(store, RETENTION_S, now=NOW)

    assert done == {"deleted": 3, "kept": 4, "undated": 1}
    left = event_keys(store)
    assert all("/chat-old/" not in key for key in left), left
    assert sum("/chat-new/" in key for key in left) == 2
    kept_fleet = [store.client.get(key).json() for key in left if "/_fleet/" in key]
    assert [entry["at"] for entry in kept_fleet] == [new_fleet["at"]]
    assert undated in left
    # Only events: the record of the rollout whose events went is still there.
    assert store.client.get(record_key) is not None
    # The newer rollout's history reads as before, with the fleet's rollback kept after it.
    history = rollout_events.list_events(store, "chat-new")
    assert [entry["type"] for entry in history] == ["started", "stage_started", "fleet_rolled_back"]


def test_a_second_prune_finds_nothing_and_other_prefixes_are_untouched(store):
    other = type(store)(store.client, store.prefix.rstrip("/") + "-other/")
    for each in (store, other):
        planned_wave(each, "chat-old", ago(60))
    assert events_retention.prune(store, RETENTION_S, now=NOW)["deleted"] == 2
    # Another member's exporter, a moment later: nothing left to delete, nothing fails.
    assert events_retention.prune(store, RETENTION_S, now=NOW) == {
        "deleted": 0,
        "kept": 0,
        "undated": 0,
    }
    assert len(event_keys(other)) == 2, "another store prefix is not this store's events"


def test_many_events_are_read_and_deleted_page_by_page(store):
    for day in range(7):
        entry = rollout_events.event("drill_finished", "drills", stamp(ago(20 + 5 * day)), "ci")
        rollout_events.emit(store, entry)
    # Ages 20, 25, 30 stay; 35, 40, 45, 50 go; pages of two keys take four reads.
    done = events_retention.prune(store, RETENTION_S, now=NOW, page_size=2)
    assert done == {"deleted": 4, "kept": 3, "undated": 0}
    ages = sorted(
        round((NOW - datetime.datetime.strptime(entry["at"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)).total_seconds() / 86400)
        for entry in rollout_events.list_events(store, "drills", with_fleet=False)
    )  # fmt: skip
    assert ages == [20, 25, 30]
