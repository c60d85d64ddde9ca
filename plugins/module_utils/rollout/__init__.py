# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The rollout's layer of module_utils: what a canary decides and keeps.

rollout (the record: schedule, stage, confirmations, verdicts, and every change to it),
rollout_steps (what the canary does next at each point of a stage), gates (the verdict
of a hold), rollout_guard and rollout_ops (the store's side of a run: its scope, a
person's decisions), rollout_records (where records are kept: the store or a file),
rollout_fence_core (raising the fence), rollback_confirmation and push_shards (who confirmed
a rollback and the push to those who did not), stage_table and traffic_split (a stage as
people read it, and its measured split).

Its modules import the standard library, common/, store/ and dataplane/ (a weight's and a
cohort's codec) only: never a node's command, the telemetry, the reports or the controller
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
