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

import os
import re
import time

from ansible_collections.zerolayer.fleet.plugins.module_utils.errors import FleetError

# The series that count requests in flight, by engine kind.
IN_FLIGHT_SERIES = {
    "vllm": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    # The simulator exports vLLM's names (roles/model_engine/files/zerolayer_engine_sim.py).
    "sim": ("vllm:num_requests_running", "vllm:num_requests_waiting"),
    "triton": ("nv_inference_pending_request_count",),
}
KINDS = tuple(sorted(IN_FLIGHT_SERIES))
TCP_ESTABLISHED = "01"
PROC_NET_TCP = ("net/tcp", "net/tcp6")
SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


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
    found = {}
    for text in proc_net_texts:
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != TCP_ESTABLISHED:
                continue
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            found[int(fields[9])] = local_port
    return found


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


def socket_inodes(pids, proc="/proc"):
    """Inodes of the sockets the processes hold open (processes that ended are skipped)."""
    inodes = set()
    for pid in pids:
        fd_dir = os.path.join(proc, str(pid), "fd")
        try:
            names = os.listdir(fd_dir)
        except (FileNotFoundError, ProcessLookupError):
            continue
        for name in names:
            try:
                match = SOCKET_LINK.match(os.readlink(os.path.join(fd_dir, name)))
            except (FileNotFoundError, ProcessLookupError):
                continue
            if match:
                inodes.add(int(match.group(1)))
    return inodes


def client_connections(pids, service_ports, proc="/proc"):
    """How many established connections the processes hold on one of the service ports."""
    texts = []
    for path in PROC_NET_TCP:
        try:
            with open(os.path.join(proc, path)) as handle:
                texts.append(handle.read())
        except FileNotFoundError:
            continue
    established = established_by_inode(texts)
    ports = set(service_ports)
    return sum(1 for inode in socket_inodes(pids, proc) if established.get(inode) in ports)


def engine_left(engine, read_metrics, read_pids, proc="/proc"):
    """{name, in_flight, connections, idle} of one engine now.

    engine: {name, kind, metrics_port, unit, service_ports}. A unit with no process left is
    idle whatever its metrics would have said (it cannot answer them).
    """
    pids = read_pids(engine["unit"])
    if not pids:
        return {"name": engine["name"], "in_flight": 0, "connections": 0, "idle": True}
    text = read_metrics(engine["metrics_port"])
    in_flight = None if text is None else requests_in_flight(text, engine["kind"])
    connections = client_connections(pids, engine["service_ports"], proc)
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
        left = [engine_left(engine, read_metrics, read_pids, proc) for engine in engines]
        waited = clock() - started
        if all(entry["idle"] for entry in left) or waited >= timeout_s:
            return {
                "idle": all(entry["idle"] for entry in left),
                "waited_s": round(waited, 2),
                "engines": left,
            }
        sleep(min(poll_s, max(0.0, timeout_s - waited)))
