# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The telemetry layer of module_utils: what is measured and exported.

prometheus_api (the gates' queries) and store_exporter (the rollout store's series, which
share the route exporter's rendering). Its modules import the layers below: common/,
store/, dataplane/, node/ and rollout/
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
