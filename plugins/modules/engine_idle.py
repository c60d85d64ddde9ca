#!/usr/bin/python
# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)

from __future__ import annotations

DOCUMENTATION = r"""
module: engine_idle
short_description: Wait, bounded, until a node's model engines have nothing left to serve
description:
  - Reads each engine's requests in flight from its own metrics (vLLM and the simulator
    C(vllm:num_requests_running) plus C(vllm:num_requests_waiting); Triton
    C(nv_inference_pending_request_count) on its metrics port) and counts the client
    connections its processes still hold on a service port (direct-path connections, whose
    local port is the public service port), every O(poll) seconds, until every engine has
    none of either or O(timeout) seconds have passed.
  - An engine whose unit has no process is idle.
  - Connections on the engine's own port are not counted - they are the proxy's and
    Prometheus's idle keep-alives, not clients.
  - Changes nothing. The caller decides what a timeout means; C(idle) says whether it came.
version_added: 0.2.0
author:
  - Zerolayer Fleet Maintainers (@zerolayer)
options:
  engines:
    description: The engines to wait for.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: Engine name, for the report.
        type: str
        required: true
      kind:
        description: Engine kind, which names the in-flight series.
        type: str
        required: true
        choices: [sim, triton, vllm]
      unit:
        description: The engine's systemd unit; its control group's processes are counted.
        type: str
        required: true
      port:
        description: The engine's own HTTP port.
        type: int
        required: true
      metrics_port:
        description:
          - Where its metrics are served; default O(engines[].port), and one above it for
            Triton.
        type: int
  service_ports:
    description: The public service ports the router steers to these engines.
    type: list
    elements: int
    required: true
  tls:
    description:
      - The engines serve HTTPS (their certificate is not checked - the request stays on the
        node's loopback).
    type: bool
    default: false
  api_key:
    description:
      - The key the engines' C(/metrics) is read with (their own port answers it only with
        one of the service's keys). Empty sends none, for engines that ask for no key.
    type: str
    default: ""
  timeout:
    description: Seconds to wait at most; 0 reads once and does not wait.
    type: int
    default: 120
  poll:
    description: Seconds between readings.
    type: float
    default: 1.0
attributes:
  check_mode:
    description: Reads once and does not wait.
    support: full
  diff_mode:
    description: Changes nothing, so has no diff.
    support: none
notes:
  - The zerolayer.fleet.node_drain role waits with it before it stops a node's engines.
"""

EXAMPLES = r"""
- name: Wait until the chat engine has finished what it was serving
  zerolayer.fleet.engine_idle:
    engines:
      - name: chat
        kind: vllm
        unit: zerolayer-engine-chat.service
        port: 8101
    service_ports: [8000]
    api_key: "{{ zerolayer_api_keys[0] }}"
    timeout: 120
  register: drain_wait
"""

RETURN = r"""
idle:
  description: Every engine had nothing in flight and no client connection at the last reading.
  type: bool
  returned: always
waited_s:
  description: Seconds from the first reading to the last.
  type: float
  returned: always
engines:
  description: The last reading of each engine.
  type: list
  elements: dict
  returned: always
  sample:
    - name: chat
      in_flight: 0.0
      connections: 0
      idle: true
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
    MODULE_FAILURES,
    FleetError,
    fail_module,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.engine_idle import (
    KINDS,
    metrics_reader,
    pids_in_cgroup,
    wait_until_idle,
)


def pid_reader(module):
    def read(unit):
        rc, out, err = module.run_command(
            ["systemctl", "show", "--property", "ControlGroup", "--value", unit],
            environ_update={"LANG": "C"},
        )
        if rc != 0:
            raise FleetError(
                "systemctl show %s failed" % unit,
                {"field": "engines", "unit": unit, "rc": rc, "stdout": out, "stderr": err},
            )
        group = out.strip()
        return pids_in_cgroup(group) if group else []

    return read


def engine_entries(params):
    entries = []
    for index, engine in enumerate(params["engines"]):
        default_metrics = engine["port"] + (1 if engine["kind"] == "triton" else 0)
        metrics_port = engine["metrics_port"] or default_metrics
        for field, port in (("port", engine["port"]), ("metrics_port", metrics_port)):
            if not 1 <= port <= 65535:
                raise FleetError(
                    "engines[%d].%s must be a TCP port from 1 to 65535; got %d"
                    % (index, field, port),
                    {"field": "engines[%d].%s" % (index, field)},
                )
        entries.append(
            {
                "name": engine["name"],
                "kind": engine["kind"],
                "unit": engine["unit"],
                "metrics_port": metrics_port,
                "service_ports": params["service_ports"],
            }
        )
    return entries


def main():
    module = AnsibleModule(
        argument_spec=dict(
            engines=dict(
                type="list",
                elements="dict",
                required=True,
                options=dict(
                    name=dict(type="str", required=True),
                    kind=dict(type="str", required=True, choices=list(KINDS)),
                    unit=dict(type="str", required=True),
                    port=dict(type="int", required=True),
                    metrics_port=dict(type="int"),
                ),
            ),
            service_ports=dict(type="list", elements="int", required=True),
            tls=dict(type="bool", default=False),
            api_key=dict(type="str", default="", no_log=True),
            timeout=dict(type="int", default=120),
            poll=dict(type="float", default=1.0),
        ),
        supports_check_mode=True,
    )
    params = module.params
    try:
        if params["timeout"] < 0:
            raise FleetError(
                "timeout must be 0 (read once) or more seconds; got %d" % params["timeout"],
                {"field": "timeout"},
            )
        if params["poll"] <= 0:
            raise FleetError("poll must be above 0; got %s" % params["poll"], {"field": "poll"})
        result = wait_until_idle(
            engine_entries(params),
            0 if module.check_mode else params["timeout"],
            params["poll"],
            metrics_reader(params["tls"], params["api_key"]),
            pid_reader(module),
        )
    except MODULE_FAILURES as exc:
        fail_module(module, exc)
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
