# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollout store's layer of module_utils: what talks to the store and nothing above it.

etcd_v3 (etcd's v3 API over HTTP), rollout_store (the store's keys: fence, owners, acks,
presence), rollout_events (a rollout's events in it), events_retention (old events out of
it), store_settings (where the operator's command finds it) and heartbeat (the process
that keeps a runner's lease alive). Its modules import the standard library, common/ and
one another only (tests/unit/plugins/module_utils/test_module_utils_layers.py checks it),
so that the node's commands can take what they need of it: what decides a rollout and
what keeps its record sit above.
"""
