# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""The router's state in the Prometheus text exposition format (docs/metrics.md).

collect() reads one snapshot from the pinned objects; render() turns a snapshot
into text and is pure, so the format is tested without a kernel. serve() is the
zerolayer-route-exporter HTTP server: stdlib only, one snapshot per scrape.

Decision-time histogram: the program times one decision in LATENCY_SAMPLE_EVERY
(chosen by the 4-tuple) and counts those in log2 buckets of nanoseconds (bucket b
holds [2^b, 2^(b+1)) ns); its _count is the number of timed decisions. They
become cumulative buckets with le = 2^(b+1) ns in seconds for
b = 0..EXPORTED_BUCKETS-1 plus +Inf. The _sum is estimated from bucket
midpoints (1.5 * 2^b ns, 1 ns for bucket 0): the kernel's run_time_ns covers
every program run, also the untimed ones and lookups on ports that are not
routed, so it is not the sum of these observations. The exact kernel time is exported on its own as
zerolayer_router_run_seconds_total.

Rollout: each scrape also reads the node's copy of the canary rollout record
(rollout.py, written by the playbooks). No file means no rollout on this node:
zerolayer_rollout_stage is 0 and nothing else about a rollout is exported. A file
that cannot be read or understood gives zerolayer_rollout_record_ok 0 and no other
rollout series, and never stops the router's own metrics. The record is replaced by
the next rollout, so rollbacks are exported as the Unix time of the last one in the
record, not as a counter that would go back to zero.

Engines: each scrape also reads the memory pressure (PSI) of every engine slice on the
node (engine_pressure.py). A slice whose memory.pressure cannot be read or understood gives
zerolayer_engine_memory_pressure_ok 0 for that engine and none of its pressure series; a
node without engine slices exports none of these families.
"""

from __future__ import annotations

import os
import sys

from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    LATENCY_SAMPLE_EVERY,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node.node_artifact import (
    installed_version,
)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DEFAULT_PORT = 9464
# Loopback unless told otherwise: the role passes the node's address that Prometheus scrapes.
DEFAULT_ADDRESS = "127.0.0.1"
DEFAULT_ROLLOUT_RECORD = "/var/lib/zerolayer/rollout.json"
DEFAULT_WATCHER_STATUS = "/run/zerolayer/fence-watcher.json"
EXPORTED_BUCKETS = 32  # le up to 2^32 ns (4.3 s); slower decisions land in +Inf only
NS_PER_SECOND = 1e9

# counter field of struct zl_counters -> outcome label of zerolayer_route_decisions_total
OUTCOMES = (
    ("to_engine", "engine"),
    ("to_proxy_by_weight", "proxy_weight"),
    ("fallback_no_socket", "fallback_no_socket"),
    ("assign_errors", "assign_error"),
)

STAGE_STATUSES = ("pending", "started", "holding", "completed")
# Both end a rollout with the routes back on the proxy path (the playbooks' abort rolls back).
ENDED_ON_PROXY = ("rolled_back", "aborted")
ROLLBACK_KINDS = ("fast", "deep")

_HELP = {
    "zerolayer_node_artifact_info": "The node artifact this exporter runs: its version (the "
    "collection's version and a digest of its content; unpackaged when run from a checkout)",
    "zerolayer_router_attached": "1 while the router's link is attached to the node's network "
    "namespace",
    "zerolayer_router_info": "The program that runs now",
    "zerolayer_router_run_seconds_total": "Kernel time spent in the program "
    "(BPF_ENABLE_STATS run_time_ns; only with --run-time-stats)",
    "zerolayer_router_runs_total": "Program runs (BPF_ENABLE_STATS run_cnt; only with "
    "--run-time-stats)",
    "zerolayer_route_weight_ratio": "The weight written: share of new connections sent to the "
    "engine, 0..1",
    "zerolayer_route_generation": "Bumped on every write of the route",
    "zerolayer_route_engine_sockets": "Engine sockets registered in the route's slots",
    "zerolayer_route_lookups_total": "TCP lookups on the route's port",
    "zerolayer_route_decisions_total": "Routing decisions by outcome: engine, proxy_weight, "
    "fallback_no_socket, assign_error or proxy_opt_out (a client of the route's never_direct "
    "cohort)",
    "zerolayer_route_opt_in_engine_total": "Connections of the route's always_direct cohort "
    "handed to an engine (a part of the engine outcome of zerolayer_route_decisions_total)",
    "zerolayer_route_decision_duration_seconds": "Decision time of a sample of the "
    "decisions (one in %d, by 4-tuple), from the program's log2 histogram (bucket bounds 2^k ns; "
    "_sum estimated from bucket midpoints)" % LATENCY_SAMPLE_EVERY,
    "zerolayer_node_fence_epoch": "The highest fence epoch this node has seen (its fence file): "
    "a weight raise with an older epoch is refused",
    "zerolayer_router_kept_detached": "1 while a deep rollback keeps the router detached "
    "(until a restore)",
    "zerolayer_fence_watcher_store_connected": "1 while the node's fence watcher reaches the "
    "rollout store",
    "zerolayer_fence_watcher_store_epoch": "The fence epoch the watcher last read in the store",
    "zerolayer_fence_watcher_last_ack_epoch": "The fence epoch this node last acknowledged in "
    "the store",
    "zerolayer_fence_watcher_last_ack_timestamp_seconds": "Unix time of that acknowledgement",
    "zerolayer_fence_watcher_status_timestamp_seconds": "Unix time the watcher last wrote its "
    "status (at least every 10 s while it runs)",
    "zerolayer_route_direct_connections": "Established direct-path connections on the route's "
    "port (clients the router handed to an engine that keep their connection), as the fence "
    "watcher counted them when it last wrote its status; after a weight goes down the engines "
    "let them go",
    "zerolayer_rollout_record_ok": "0 when the node's rollout record exists but cannot be read "
    "or understood (no other rollout series then)",
    "zerolayer_rollout_info": "The rollout in the node's record and its outcome",
    "zerolayer_rollout_stage": "Stage of the rollout, 1-based; 0 when the node has no rollout "
    "record",
    "zerolayer_rollout_stages": "Stages in the rollout's schedule",
    "zerolayer_rollout_stage_status": "1 for the current stage's status: pending, started, "
    "holding or completed",
    "zerolayer_rollout_weight_ratio": "The weight the rollout record asks for, 0..1 (0 once "
    "rolled back or aborted)",
    "zerolayer_rollout_paused": "1 while the rollout is paused",
    "zerolayer_rollout_updated_timestamp_seconds": "Unix time of the record's last change",
    "zerolayer_rollout_rollback_timestamp_seconds": "Unix time of the record's last rollback by "
    "kind: fast or deep (unknown when the record does not say), abort for a person's abort",
    "zerolayer_engine_memory_pressure_ok": "1 when the engine slice's memory.pressure was read; 0 "
    "when it could not be read or understood (PSI off in the kernel), and then no pressure series",
    "zerolayer_engine_memory_pressure_ratio": "Share of the last 10 s in which some (kind=some) "
    "or all (kind=full) tasks of the engine's slice waited for memory (the kernel's PSI avg10)",
    "zerolayer_engine_memory_pressure_seconds_total": "Time in which some (kind=some) or all "
    "(kind=full) tasks of the engine's slice waited for memory (PSI total)",
}


# Snapshot


def _program_and_link(layout, run_time_stats):
    """(program or None, attached): the pinned program, and whether the link runs it.

    The program is opened read-only. A link pin cannot be opened read-only (the kernel
    allows BPF_OBJ_GET of a link only read-write), so its fd lives just long enough
    to read the link's information.
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall

    program = None
    if os.path.exists(layout.prog):
        fd = bpf_syscall.obj_get(layout.prog, read_only=True)
        try:
            info = bpf_syscall.prog_info(fd)
        finally:
            os.close(fd)
        # Without run-time statistics the kernel counts nothing (unless another holder
        # switched them on): stale or zero numbers are left out rather than exported.
        keys = ("id", "tag", "run_time_ns", "run_cnt") if run_time_stats else ("id", "tag")
        program = {key: info[key] for key in keys}
    link = None
    if os.path.exists(layout.link):
        fd = bpf_syscall.obj_get(layout.link)
        try:
            link = bpf_syscall.link_info(fd)
        finally:
            os.close(fd)
    # A force-detached link, or one whose netns is gone, reports netns inode 0.
    attached = bool(
        program and link and link.get("netns_ino", 0) != 0 and link["prog_id"] == program["id"]
    )
    return program, attached


def collect_fence(layout, watcher_status=None):
    """The node's fence epoch and router mode, and the fence watcher's status (or None).

    A fence file or status file that cannot be read leaves its series out (and says why
    on stderr) rather than failing the whole scrape: the route series still matter then.
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.fence import read_fence
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.router_mode import (
        is_detached,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.fence_watcher import (
        read_status,
    )

    fence = {"epoch": None, "kept_detached": None, "watcher": None}
    try:
        fence["epoch"] = read_fence(layout.fence_file)["epoch"]
        fence["kept_detached"] = is_detached(layout.fence_file)
    except FleetError as exc:
        sys.stderr.write("fence not exported: %s\n" % exc.message)
    try:
        fence["watcher"] = read_status(watcher_status) if watcher_status else None
    except FleetError as exc:
        sys.stderr.write("fence watcher status not exported: %s\n" % exc.message)
    return fence


def collect(layout, run_time_stats=False, watcher_status=None):
    """One read of the router: {attached, program, routes, latency_buckets}.

    Nothing pinned, or only the maps pinned (detached router): attached is 0 and
    whatever is still readable is reported. The program's run_time_ns and run_cnt
    are read only with run_time_stats (the exporter then holds BPF_ENABLE_STATS).
    Every map is read through a read-only fd, checked against its spec first (the
    readers of routes, engine_sockets and metrics): the exporter cannot change one.
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
        read_slots,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
        read_latency_buckets,
        read_route_counters,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import missing_pins
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import (
        read_routes,
    )

    snapshot = {"attached": False, "program": None, "routes": [], "latency_buckets": None}
    snapshot["node_artifact"] = node_artifact_version()
    # The fence lives outside bpffs: it is there (and matters most) when the pins are not.
    snapshot["fence"] = collect_fence(layout, watcher_status)
    if not os.path.isdir(layout.pin_dir):
        return snapshot
    snapshot["program"], snapshot["attached"] = _program_and_link(layout, run_time_stats)
    if missing_pins(layout):
        return snapshot
    for route in read_routes(layout):
        # cohort counters are None on pins without cohorts (layout 2)
        counters, cohort_counters = read_route_counters(layout, route.route_index)
        snapshot["routes"].append(
            {
                "name": route.name,
                "port": route.port,
                "weight_bp": route.weight_bp,
                "generation": route.generation,
                "engine_sockets": len(read_slots(layout, route.route_index)),
                "counters": counters,
                "cohort_counters": cohort_counters,
            }
        )
    snapshot["latency_buckets"] = read_latency_buckets(layout)
    return snapshot


# Rollout record


def _unix_time(value, field):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.clock import (
        parse_timestamp,
    )

    return parse_timestamp(value, field).timestamp()


def _stage_weight_ratio(planned):
    # A cohort stage's is 0 (only its cohort goes direct): a stage in progress all the same,
    # exported as its stage number; nothing here divides by the weight.
    weight_bp = planned.get("weight_bp")
    if isinstance(weight_bp, bool) or not isinstance(weight_bp, int) or not 0 <= weight_bp <= 10000:
        raise ValueError("schedule weight_bp must be 0..10000; got %r" % (weight_bp,))
    return weight_bp / 10000.0


def _rollback_kind(record):
    details = (record.get("rollback") or {}).get("details") or {}
    mode = details.get("mode") if isinstance(details, dict) else None
    return mode if mode in ROLLBACK_KINDS else "unknown"


def _rollback_times(record):
    """{kind: Unix time} of the last rolled_back and abort transitions."""
    times = {}
    for entry in record["transitions"]:
        if entry.get("action") == "rolled_back":
            kind = _rollback_kind(record)
        elif entry.get("action") == "abort":
            kind = "abort"
        else:
            continue
        times[kind] = max(times.get(kind, 0.0), _unix_time(entry["at"], "transitions[].at"))
    return times


def rollout_from_record(record):
    """The exported view of a decoded rollout record (record_codec.decode_record)."""
    stage = record["stage"]
    index = stage["index"]
    schedule = record["schedule"]
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(schedule):
        raise ValueError("stage.index must be 0..%d; got %r" % (len(schedule) - 1, index))
    if stage["status"] not in STAGE_STATUSES:
        raise ValueError(
            "stage.status must be one of %s; got %r" % (STAGE_STATUSES, stage["status"])
        )
    outcome = record["outcome"]
    ended_on_proxy = outcome in ENDED_ON_PROXY
    return {
        "state": "ok",
        "rollout_id": record["rollout_id"],
        "outcome": outcome,
        "stage_number": index + 1,
        "stage_count": len(schedule),
        "stage_status": stage["status"],
        "weight_ratio": 0.0 if ended_on_proxy else _stage_weight_ratio(schedule[index]),
        "paused": record.get("paused") is True,
        "updated_at": _unix_time(record["updated_at"], "updated_at"),
        "rollbacks": _rollback_times(record),
    }


def read_rollout(path):
    """{state: missing|ok|bad, ...}: one read of the node's rollout record.

    Never raises for a bad record: the router's metrics must still be served; the
    reason goes to "error".
    """
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.record_codec import (
        read_record,
    )

    try:
        record = read_record(path)
        if record is None:
            return {"state": "missing"}
        return rollout_from_record(record)
    except FleetError as error:
        return {"state": "bad", "error": error.message}
    except (KeyError, IndexError, TypeError, ValueError, AttributeError, OverflowError) as error:
        return {
            "state": "bad",
            "error": "%s is not a usable rollout record: %s: %s"
            % (path, type(error).__name__, error),
        }


# Rendering


def escape_label_value(value):
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def format_value(value):
    """Integers stay exact; floats use repr (shortest round-trip form)."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if value == float("inf"):
        return "+Inf"
    return repr(float(value))


def _sample(name, labels, value):
    if labels:
        inner = ",".join('%s="%s"' % (key, escape_label_value(val)) for key, val in labels)
        return "%s{%s} %s" % (name, inner, format_value(value))
    return "%s %s" % (name, format_value(value))


def _family(lines, name, kind, samples, help_text=None):
    """One metric family: HELP (this module's, unless help_text), TYPE, the samples."""
    lines.append("# HELP %s %s" % (name, help_text or _HELP[name]))
    lines.append("# TYPE %s %s" % (name, kind))
    lines.extend(samples)


def bucket_bound_seconds(bucket):
    """Upper bound of log2 bucket b in seconds: 2^(b+1) ns."""
    return 2 ** (bucket + 1) / NS_PER_SECOND


def bucket_midpoint_ns(bucket):
    return 1.0 if bucket == 0 else 1.5 * 2**bucket


def histogram_samples(name, buckets):
    """Cumulative _bucket lines, _sum and _count of a log2 ns histogram."""
    samples = []
    cumulative = 0
    for bucket in range(EXPORTED_BUCKETS):
        cumulative += buckets[bucket] if bucket < len(buckets) else 0
        samples.append(
            _sample(
                name + "_bucket", [("le", format_value(bucket_bound_seconds(bucket)))], cumulative
            )
        )
    total = sum(buckets)
    samples.append(_sample(name + "_bucket", [("le", "+Inf")], total))
    estimated_ns = sum(bucket_midpoint_ns(b) * count for b, count in enumerate(buckets))
    samples.append(_sample(name + "_sum", [], estimated_ns / NS_PER_SECOND))
    samples.append(_sample(name + "_count", [], total))
    return samples


def render(snapshot):
    """The exposition text of a snapshot from collect()."""
    lines = []
    program = snapshot.get("program")
    routes = snapshot.get("routes") or []
    if snapshot.get("node_artifact"):
        render_node_artifact(lines, snapshot["node_artifact"])
    _family(
        lines,
        "zerolayer_router_attached",
        "gauge",
        [_sample("zerolayer_router_attached", [], 1 if snapshot.get("attached") else 0)],
    )
    if program and snapshot.get("attached"):
        _family(
            lines,
            "zerolayer_router_info",
            "gauge",
            [
                _sample(
                    "zerolayer_router_info",
                    [("prog_id", program["id"]), ("tag", program["tag"])],
                    1,
                )
            ],
        )
    if program and "run_time_ns" in program:
        _family(
            lines,
            "zerolayer_router_run_seconds_total",
            "counter",
            [
                _sample(
                    "zerolayer_router_run_seconds_total",
                    [],
                    program["run_time_ns"] / NS_PER_SECOND,
                )
            ],
        )
        _family(
            lines,
            "zerolayer_router_runs_total",
            "counter",
            [_sample("zerolayer_router_runs_total", [], program["run_cnt"])],
        )
    if routes:
        _family(
            lines,
            "zerolayer_route_weight_ratio",
            "gauge",
            [
                _sample(
                    "zerolayer_route_weight_ratio",
                    [("route", r["name"]), ("port", r["port"])],
                    r["weight_bp"] / 10000.0,
                )
                for r in routes
            ],
        )
        for name, key in (
            ("zerolayer_route_generation", "generation"),
            ("zerolayer_route_engine_sockets", "engine_sockets"),
        ):
            _family(
                lines,
                name,
                "gauge",
                [_sample(name, [("route", r["name"])], r[key]) for r in routes],
            )
        _family(
            lines,
            "zerolayer_route_lookups_total",
            "counter",
            [
                _sample(
                    "zerolayer_route_lookups_total",
                    [("route", r["name"])],
                    r["counters"]["lookups"],
                )
                for r in routes
            ],
        )
        _family(
            lines,
            "zerolayer_route_decisions_total",
            "counter",
            [
                _sample(
                    "zerolayer_route_decisions_total",
                    [("route", r["name"]), ("outcome", outcome)],
                    r["counters"][field],
                )
                for r in routes
                for field, outcome in OUTCOMES
            ]
            # The opt-out cohort's clients: left to the proxy whatever the weight.
            + [
                _sample(
                    "zerolayer_route_decisions_total",
                    [("route", r["name"]), ("outcome", "proxy_opt_out")],
                    r["cohort_counters"]["to_proxy_opt_out"],
                )
                for r in routes
                if r.get("cohort_counters")
            ],
        )
        cohort_routes = [r for r in routes if r.get("cohort_counters")]
        if cohort_routes:
            _family(
                lines,
                "zerolayer_route_opt_in_engine_total",
                "counter",
                [
                    _sample(
                        "zerolayer_route_opt_in_engine_total",
                        [("route", r["name"])],
                        r["cohort_counters"]["to_engine_opt_in"],
                    )
                    for r in cohort_routes
                ],
            )
    buckets = snapshot.get("latency_buckets")
    if buckets is not None:
        _family(
            lines,
            "zerolayer_route_decision_duration_seconds",
            "histogram",
            histogram_samples("zerolayer_route_decision_duration_seconds", buckets),
        )
    fence = snapshot.get("fence")
    if fence is not None:
        render_fence(lines, fence)
    rollout = snapshot.get("rollout")
    if rollout is not None:
        render_rollout(lines, rollout)
    engine_pressure = snapshot.get("engine_pressure")
    if engine_pressure is not None:
        render_engine_pressure(lines, engine_pressure)
    return "\n".join(lines) + "\n"


def node_artifact_version():
    """The version of the node artifact this process runs, "unpackaged" outside one."""
    return installed_version() or "unpackaged"


def render_node_artifact(lines, version):
    """zerolayer_node_artifact_info{version}: a fleet running two versions shows two."""
    _gauge(lines, "zerolayer_node_artifact_info", [("version", version)], 1)


def render_fence(lines, fence):
    if fence["epoch"] is not None:
        _gauge(lines, "zerolayer_node_fence_epoch", [], fence["epoch"])
        _gauge(lines, "zerolayer_router_kept_detached", [], 1 if fence["kept_detached"] else 0)
    watcher = fence.get("watcher")
    if not watcher:
        return  # no watcher on this node: its series are absent, not zero
    _gauge(
        lines, "zerolayer_fence_watcher_store_connected", [], 1 if watcher.get("connected") else 0
    )
    for name, key in (
        ("zerolayer_fence_watcher_store_epoch", "store_epoch"),
        ("zerolayer_fence_watcher_last_ack_epoch", "last_ack_epoch"),
        ("zerolayer_fence_watcher_last_ack_timestamp_seconds", "last_ack_at_unix"),
        ("zerolayer_fence_watcher_status_timestamp_seconds", "updated_at_unix"),
    ):
        if isinstance(watcher.get(key), (int, float)) and not isinstance(watcher[key], bool):
            _gauge(lines, name, [], watcher[key])
    direct = watcher.get("direct_connections")
    if isinstance(direct, dict) and direct:
        name = "zerolayer_route_direct_connections"
        _family(
            lines,
            name,
            "gauge",
            [
                _sample(name, [("route", route)], count)
                for route, count in sorted(direct.items())
                if isinstance(count, int) and not isinstance(count, bool)
            ],
        )


def _gauge(lines, name, labels, value):
    _family(lines, name, "gauge", [_sample(name, labels, value)])


def render_rollout(lines, rollout):
    """Append the rollout families of a read_rollout() result."""
    _gauge(lines, "zerolayer_rollout_record_ok", [], 0 if rollout["state"] == "bad" else 1)
    if rollout["state"] == "bad":
        return
    if rollout["state"] == "missing":
        _gauge(lines, "zerolayer_rollout_stage", [], 0)
        return
    _gauge(
        lines,
        "zerolayer_rollout_info",
        [("rollout_id", rollout["rollout_id"]), ("outcome", rollout["outcome"])],
        1,
    )
    _gauge(lines, "zerolayer_rollout_stage", [], rollout["stage_number"])
    _gauge(lines, "zerolayer_rollout_stages", [], rollout["stage_count"])
    _family(
        lines,
        "zerolayer_rollout_stage_status",
        "gauge",
        [
            _sample(
                "zerolayer_rollout_stage_status",
                [("status", status)],
                1 if status == rollout["stage_status"] else 0,
            )
            for status in STAGE_STATUSES
        ],
    )
    _gauge(lines, "zerolayer_rollout_weight_ratio", [], rollout["weight_ratio"])
    _gauge(lines, "zerolayer_rollout_paused", [], 1 if rollout["paused"] else 0)
    _gauge(lines, "zerolayer_rollout_updated_timestamp_seconds", [], rollout["updated_at"])
    if rollout["rollbacks"]:
        _family(
            lines,
            "zerolayer_rollout_rollback_timestamp_seconds",
            "gauge",
            [
                _sample("zerolayer_rollout_rollback_timestamp_seconds", [("kind", kind)], at)
                for kind, at in sorted(rollout["rollbacks"].items())
            ],
        )


def render_engine_pressure(lines, state):
    """Append the engine memory pressure families of an engine_pressure.read_engines() result."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.engine_pressure import KINDS

    engines = state.get("engines") or []
    if not engines:
        return
    name = "zerolayer_engine_memory_pressure_ok"
    _family(
        lines,
        name,
        "gauge",
        [_sample(name, [("engine", e["engine"])], 0 if "error" in e else 1) for e in engines],
    )
    read = [(e["engine"], e["pressure"]) for e in engines if "pressure" in e]
    if not read:
        return
    name = "zerolayer_engine_memory_pressure_ratio"
    _family(
        lines,
        name,
        "gauge",
        [
            _sample(name, [("engine", engine), ("kind", kind), ("window", "10s")], p[kind]["avg10"])
            for engine, p in read
            for kind in KINDS
            if kind in p
        ],
    )
    name = "zerolayer_engine_memory_pressure_seconds_total"
    _family(
        lines,
        name,
        "counter",
        [
            _sample(name, [("engine", engine), ("kind", kind)], p[kind]["total"])
            for engine, p in read
            for kind in KINDS
            if kind in p
        ],
    )


# HTTP server


class LoggedReader:
    """read() once per scrape; its "error" is logged when the reason changes.

    Scrapes come every few seconds: one line per new problem keeps the journal readable.
    recovered, when given, is logged once the error is gone.
    """

    def __init__(self, read, problem, recovered=None, log=None):
        self.read = read
        self.problem = problem
        self.recovered = recovered
        self.log = log or sys.stderr.write
        self.last_error = None

    def __call__(self):
        state = self.read()
        error = state.get("error")
        if error and error != self.last_error:
            self.log("%s: %s\n" % (self.problem, error))
        elif self.last_error and not error and self.recovered:
            self.log(self.recovered + "\n")
        self.last_error = error
        return state


class RolloutRecordReader(LoggedReader):
    """read_rollout() of one path per scrape; a bad record is logged when its reason changes."""

    def __init__(self, path, log=None):
        super().__init__(lambda: read_rollout(path), "rollout record unusable", log=log)
        self.path = path


def engine_pressure_reader(log=None, **where):
    """engine_pressure.read_engines(**where) once per scrape; its reasons logged when they
    change (where: mounts and own_cgroup, for a test's tree)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node.engine_pressure import (
        read_engines,
    )

    return LoggedReader(
        lambda: read_engines(**where),
        "engine memory pressure not exported",
        recovered="engine memory pressure read again",
        log=log,
    )


def metrics_handler(body, server_version):
    """An HTTP handler class that answers GET /metrics (or /) with body(), a scrape error
    with 500 and its reason (the server lives on), anything else with 404."""
    from http.server import BaseHTTPRequestHandler

    class MetricsHandler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                self._reply(404, "text/plain; charset=utf-8", "not found; try /metrics\n")
                return
            try:
                text = body()
            except Exception as exc:  # a scrape error must answer 500, not kill the server
                message = getattr(exc, "message", None) or "%s: %s" % (type(exc).__name__, exc)
                sys.stderr.write("scrape failed: %s\n" % message)
                self._reply(500, "text/plain; charset=utf-8", "scrape failed: %s\n" % message)
                return
            self._reply(200, CONTENT_TYPE, text)

        def _reply(self, status, content_type, text):
            data = text.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):
            """Scrapes every few seconds would flood the journal: stay quiet."""

    MetricsHandler.server_version = server_version
    return MetricsHandler


def make_handler(
    layout, collect_snapshot=collect, read_rollout_record=None, read_engine_pressure=None
):
    """The /metrics handler; read_rollout_record (a RolloutRecordReader) adds the rollout,
    read_engine_pressure (an engine_pressure_reader()) the engines' memory pressure."""

    def body():
        snapshot = collect_snapshot(layout)
        if read_rollout_record is not None:
            snapshot["rollout"] = read_rollout_record()
        if read_engine_pressure is not None:
            snapshot["engine_pressure"] = read_engine_pressure()
        return render(snapshot)

    return metrics_handler(body, "zerolayer-route-exporter")


def metrics_server(address, port, handler):
    """A threading HTTP server bound to address:port (IPv4 or IPv6).

    IP_FREEBIND lets the bind succeed before the node's address is configured at
    boot, as systemd's FreeBind= does: the exporter then answers as soon as the
    address comes up instead of failing until its restart limit is reached.
    """
    import socket
    from http.server import ThreadingHTTPServer

    class MetricsServer(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        daemon_threads = True

        def server_bind(self):
            self.socket.setsockopt(socket.IPPROTO_IP, getattr(socket, "IP_FREEBIND", 15), 1)
            super().server_bind()

    return MetricsServer((address, port), handler)


def serve(
    layout,
    address=DEFAULT_ADDRESS,
    port=DEFAULT_PORT,
    run_time_stats=False,
    rollout_record=DEFAULT_ROLLOUT_RECORD,
    watcher_status=DEFAULT_WATCHER_STATUS,
):
    """Serve /metrics until interrupted.

    With run_time_stats the exporter holds a BPF_ENABLE_STATS fd for its whole life,
    so the kernel keeps counting run_time_ns/run_cnt of the program without touching
    the kernel.bpf_stats_enabled sysctl, and the two series built from them are
    exported. It costs about 20 ns on every run of every BPF program on the node and
    needs CAP_SYS_ADMIN, so it is off unless asked for; the counting stops when the
    exporter exits. rollout_record is the node's copy of the rollout record, read on
    every scrape; None leaves the rollout series out. The engines' memory pressure is read
    on every scrape too (engine_pressure.py).
    """
    import functools

    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import (
        RunTimeStats,
    )

    stats = RunTimeStats().__enter__() if run_time_stats else None
    try:
        reader = RolloutRecordReader(rollout_record) if rollout_record else None
        collect_snapshot = functools.partial(
            collect, run_time_stats=run_time_stats, watcher_status=watcher_status
        )
        handler = make_handler(layout, collect_snapshot, reader, engine_pressure_reader())
        server = metrics_server(address, port, handler)
        try:
            server.serve_forever()
        finally:
            server.server_close()
    finally:
        if stats is not None:
            stats.close()


def exporter_main(argv=None):
    import argparse

    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import (
        MODULE_FAILURES,
        as_fleet_error,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
        DEFAULT_PIN_DIR,
        PinLayout,
    )

    parser = argparse.ArgumentParser(
        prog="zerolayer-route-exporter",
        description="Serve the router's pinned maps, and the memory pressure of the node's engine "
        "slices, as Prometheus metrics on /metrics.",
    )
    parser.add_argument(
        "--listen-address",
        default=DEFAULT_ADDRESS,
        help="IPv4 or IPv6 address to listen on (default %(default)s; 0.0.0.0 for all)",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--pin-dir", default=DEFAULT_PIN_DIR)
    parser.add_argument(
        "--rollout-record",
        default=DEFAULT_ROLLOUT_RECORD,
        help="the node's copy of the canary rollout record, read on every scrape; "
        "an empty value leaves the rollout series out (default %(default)s)",
    )
    parser.add_argument(
        "--fence-watcher-status",
        default=DEFAULT_WATCHER_STATUS,
        help="the node's fence watcher status file, read on every scrape; absent: no "
        "watcher series (default %(default)s)",
    )
    parser.add_argument(
        "--fence-file",
        default=None,
        help="the node's fence file (default: the router's, /var/lib/zerolayer/fence.json)",
    )
    parser.add_argument(
        "--run-time-stats",
        action="store_true",
        help="hold BPF_ENABLE_STATS and export zerolayer_router_run_seconds_total and "
        "zerolayer_router_runs_total; costs about 20 ns per run of every BPF program on the "
        "node and needs CAP_SYS_ADMIN (default: off, and those two series are absent)",
    )
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 1 <= args.port <= 65535:
        parser.error("--port must be a TCP port number from 1 to 65535; got %d" % args.port)
    try:
        serve(
            PinLayout(args.pin_dir, fence_file=args.fence_file),
            args.listen_address,
            args.port,
            args.run_time_stats,
            args.rollout_record,
            args.fence_watcher_status or None,
        )
    except MODULE_FAILURES as exc:
        sys.stderr.write("zerolayer-route-exporter: %s\n" % as_fleet_error(exc).message)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0
