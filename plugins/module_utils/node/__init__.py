# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The node's layer of module_utils: the commands a GPU node runs, from the node artifact.

node_cli (zerolayer-routectl and zerolayer-register-engine), fence_watcher (the watch on the
store's fence that rolls the node back by itself), exposition (the route exporter),
report (one read-only snapshot of the router, which route_info returns too), engine_idle
and engine_pressure (what the engines' slices say), node_artifact (the one zip application
that carries all of them to the node).

Its modules import the standard library, common/, store/ and dataplane/ only: a node never
imports the rollout, the controller or the reports; what it knows of a rollout is its copy
of the record, read with common/record_codec
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
