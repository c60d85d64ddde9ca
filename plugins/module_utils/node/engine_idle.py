# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Whether a node's engines are idle: nothing in flight, no client connection left.

A drain sends new connections elsewhere and then waits here before it stops the engines.
Two measures, because neither is enough alone:

- requests in flight, from the engine's own metrics (vLLM and the simulator: running plus
  waiting; Triton: pending), which counts requests from every path;
- client connections the engine's processes still hold on a service port. A direct-path
  connection was handed to the engine's listening socket by the router, so its local port
  is the public service port, not the engine's: a keep-alive client on it may send another
  request at any moment. Connections on the engine's own port are not counted: those are
  the proxy's and Prometheus's idle keep-alives, which the drain has already moved or which
  never carry a client's request.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.proc_sockets import (
    TCP_ESTABLISHED,
    socket_fds,
    tcp_rows,
)

# The series that count requests in flight, by engine kind.
IN_FLIGHT_SERIES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    # The simulator exports vLLM's names (roles/model_engine/files/zerolayer_engine_sim.py).
    "sim": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "triton": ("nv_inference_pending_request_count",),
}
KINDS = tuple(sorted(IN_FLIGHT_SERIES))
PROC_NET_TCP = ("net/tcp", "net/tcp6")


def metrics_reader(tls=False, api_key="", host="127.0.0.1"):
    """read(port): the engine's /metrics text, or None when it cannot be read.

    The engine's own port serves /metrics behind the service's key, so the key goes with
    the request. Over TLS the certificate is not checked: the request stays on the node.
    """
    headers = {"Authorization": "Bearer " + api_key} if api_key else {}

    def read(port):
        if tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            connection = http.client.HTTPSConnection(host, port, timeout=3, context=context)
        else:
            connection = http.client.HTTPConnection(host, port, timeout=3)
        try:
            connection.request("GET", "/metrics", headers=headers)
            response = connection.getresponse()
            body = response.read().decode("utf-8", "replace")
            return body if response.status == 200 else None
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    return read


def requests_in_flight(metrics_text, kind):
    """The sum of the kind's in-flight series in a Prometheus text exposition.

    None when none of them is there: an answer that cannot be read is not "idle".
    """
    if kind not in IN_FLIGHT_SERIES:
        raise FleetError(
            "kind must be one of %s; got %r" % (", ".join(KINDS), kind),
            {"field": "kind", "value": kind},
        )
    names = IN_FLIGHT_SERIES[kind]
    total, seen = 0.0, False
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = re.split(r"[{ ]", line, maxsplit=1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                continue
            seen = True
    return total if seen else None


def established_by_inode(proc_net_texts):
    """{socket inode: local port} of the ESTABLISHED sockets in /proc/net/tcp and tcp6."""
    return {
        inode: local_port
        for text in proc_net_texts
        for local_port, state, inode in tcp_rows(text)
        if state == TCP_ESTABLISHED
    }


def pids_in_cgroup(group, proc="/proc"):
    """Pids of the processes whose control group is `group` (systemd's ControlGroup).

    Read from /proc/<pid>/cgroup, which names the group on every hierarchy layout: the
    unified one ("0::/path") and the hybrid one, where /sys/fs/cgroup/<path> does not exist
    but the name=systemd line does.
    """
    pids = []
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "cgroup")) as handle:
                lines = handle.read().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if any(line.split(":", 2)[-1] == group for line in lines):
            pids.append(int(entry))
    return sorted(pids)


def read_established(proc="/proc"):
    """{socket inode: local port} of this netns's established TCP sockets, now."""
    texts = []
    for path in PROC_NET_TCP:
        try:
            with open(os.path.join(proc, path)) as handle:
                texts.append(handle.read())
        except FileNotFoundError:
            continue
    return established_by_inode(texts)


def client_connections(pids, service_ports, proc="/proc", established=None):
    """How many established connections the processes hold on one of the service ports.

    established: a read_established() answer to count against (read now when None)."""
    if established is None:
        established = read_established(proc)
    ports = set(service_ports)
    return sum(
        1 for pid in pids for inode in socket_fds(pid, proc) if established.get(inode) in ports
    )


def engine_left(engine, read_metrics, read_pids, proc="/proc", established=None):
    """{name, in_flight, connections, idle} of one engine now.

    engine: {name, kind, metrics_port, unit, service_ports}. A unit with no process left is
    idle whatever its metrics would have said (it cannot answer them).
    """
    pids = read_pids(engine["unit"])
    if not pids:
        return {"name": engine["name"], "in_flight": 0, "connections": 0, "idle": True}
    text = read_metrics(engine["metrics_port"])
    in_flight = None if text is None else requests_in_flight(text, engine["kind"])
    connections = client_connections(pids, engine["service_ports"], proc, established)
    return {
        "name": engine["name"],
        "in_flight": in_flight,
        "connections": connections,
        "idle": in_flight == 0 and connections == 0,
    }


def wait_until_idle(
    engines,
    timeout_s,
    poll_s,
    read_metrics,
    read_pids,
    proc="/proc",
    clock=time.monotonic,
    sleep=time.sleep,
):
    """Poll every engine until all are idle or timeout_s has passed.

    Returns {idle, waited_s, engines: [engine_left(...)]}, the last reading of each.
    """
    started = clock()
    while True:
        # One read of the netns's sockets a round, shared by every engine.
        established = read_established(proc)
        left = [
            engine_left(engine, read_metrics, read_pids, proc, established) for engine in engines
        ]
        waited = clock() - started
        if all(entry["idle"] for entry in left) or waited >= timeout_s:
            return {
                "idle": all(entry["idle"] for entry in left),
                "waited_s": round(waited, 2),
                "engines": left,
            }
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
