# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The controller's layer of module_utils: the operator's commands, at the top.

rollout_cli (`zerolayer`), rollback_command (its rollback, which raises the fence itself and
pushes only to the nodes that did not confirm), source_addresses (the addresses this
machine reaches nodes from); hold_evaluation (one evaluation of a stage's gates, the
canary_gate module's work: it queries the telemetry and hands events to the reports) and
record_change (one change of a rollout record, rollout_state's work, which hands its events
to the reports too).
It may import every other layer; nothing imports it
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
