# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The data plane's layer of module_utils: the router's maps and what writes them on a node.

bpf_syscall (the bpf(2) calls), loader (loading and attaching the sk_lookup program),
pins (the pinned maps and their layout), route_codec (a route's bytes in the maps), routes
(weights, cohorts and hashes: plan, write, read back), engine_sockets (an engine's listening
socket in a route's slot), router_lifecycle (attach, detach, restore), router_mode,
metrics (the counters), proc_sockets (who holds which socket), direct_drain (closing the
direct path's idle connections after a rollback) and fence (the node's epoch, which every
weight write passes).

Its modules import the standard library, common/, store/ (the fence's second opinion: a
weight write checks the store's fence epoch where the node has a store) and one another
only; never the rollout, the controller or the reports
(tests/unit/plugins/module_utils/test_module_utils_layers.py checks it).
"""
