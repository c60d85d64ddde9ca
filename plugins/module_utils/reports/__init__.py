# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The reports' layer of module_utils: what people read about a rollout.

drill (the rollback drill's report, JUnit file and plot), rollout_timeline (a rollout's
timeline from its events) and notify (events told to webhooks). Its modules import common/,
store/, rollout/ and telemetry/ only
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
