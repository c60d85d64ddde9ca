"""Records made step by step with the rollout module's own actions, minute by minute from
T0, for the tests of what reads them (the report's table, the timeline)."""

import datetime

from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r

T0 = datetime.datetime(2026, 12, 1, 10, 0, tzinfo=datetime.timezone.utc)
ME = "runner@ctl"


def at(minutes):
    return T0 + datetime.timedelta(minutes=minutes)


def unix(minutes):
    return at(minutes).timestamp()


def act(record, action, minutes, **params):
    return r.apply(record, action, params, at(minutes), ME)[0]
