"""Rollout records as a runner leaves them in the store, for the store's tests."""

import datetime

from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout.rollout_records import (
    StoreRecords,
)

SCHEDULE = [{"weight": 1, "hold": 60}, {"weight": 20, "hold": 60}, {"weight": 100}]
T0 = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(hours=1)


def planted(store, rollout_id="chat-a", waves=("wave_canary", "wave_rest"), epoch=0, hold=True):
    """Records as a runner leaves them: the first wave holding stage 1, the rest planned."""
    for index, wave in enumerate(waves):
        records = StoreRecords(store, "%s/%s" % (rollout_id, wave))
        record, _c, _n = rollout.plan(None, "%s:%s" % (rollout_id, wave), SCHEDULE, None, False,
                                      T0, "runner@ctl", epoch=epoch)  # fmt: skip
        if index == 0 and hold:
            record, _c = rollout.apply(record, "stage_started", {"stage": 0}, T0, "runner@ctl")
            record, _c = rollout.apply(record, "hold_started", {}, T0, "runner@ctl")
        records.write(record, 0)
    return store


def record_of(store, key):
    return StoreRecords(store, key).read()[0]


def completed(store, rollout_id, created_at, epoch=0):
    """One wave walked through every stage to completed, as a runner leaves it."""
    records = StoreRecords(store, "%s/wave_all" % rollout_id)
    record, _c, _n = rollout.plan(None, "%s:wave_all" % rollout_id, SCHEDULE, None, False,
                                  created_at, "runner@ctl", epoch=epoch)  # fmt: skip
    for index in range(len(SCHEDULE)):
        record, _c = rollout.apply(record, "stage_started", {"stage": index}, created_at, "r")
        record, _c = rollout.apply(record, "hold_started", {}, created_at, "r")
        record, _c = rollout.apply(record, "stage_completed", {}, created_at, "r")
    read_back = {"weight": 100, "generation": 9}
    confirmed = {"nodes": {"n1": read_back, "n2": read_back}}
    record, _c = rollout.apply(record, "weight_confirmed", confirmed, created_at, "r")
    record, _c = rollout.apply(record, "completed", {}, created_at, "r")
    records.write(record, 0)
    assert record["outcome"] == "completed"
