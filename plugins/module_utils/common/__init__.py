# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The bottom layer of module_utils: errors, time, numbers, files replaced whole, file
locks and a rollout stage's cohort.

Its modules import the standard library and one another only, so every other layer,
the nodes' included, can import them
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
