"""Metric names a PromQL expression reads, and the names the fleet really emits.

Used by the rule and dashboard tests to prove that every query reads a metric some part
of the system produces.
"""

import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[2]
RULES = REPO / "files/prometheus/rules/zerolayer.rules.yml"
DASHBOARD = REPO / "files/grafana/zerolayer-fleet.json"
METRICS_DOC = REPO / "docs/metrics.md"
FIXTURE_METRICS = REPO / "tests/fixtures/metrics"

# Names emitted by software outside this collection for which there is no recorded
# fixture, with who emits each.
EXTERNAL_METRICS = {
    # Prometheus itself, one series per scrape target.
    "up": "prometheus",
    # node_exporter run with --collector.systemd.
    "node_systemd_unit_state": "node_exporter",
    # etcd itself, the rollout store's members (job zerolayer-rollout-store-etcd, on
    # rollout_store_metrics_port); tests/store/test_store_maintenance.py reads them from a
    # real member.
    "etcd_mvcc_db_total_size_in_bytes": "etcd",
    "etcd_server_quota_backend_bytes": "etcd",
}

# Names the engines and DCGM's exporter serve: they must be in one of the recorded /metrics
# fixtures (tests/fixtures/metrics: real vLLM, Triton with TensorRT-LLM, dcgm-exporter).
ENGINE_NAME = re.compile(r"^(vllm:.+|http_requests_total|nv_.+|DCGM_FI_.+)$")
# Names zerolayer-route-exporter serves (the exporter's own rendering proves them here).
EXPORTER_NAME = re.compile(
    r"^zerolayer_(router|route|rollout(?!_store_)|node|fence_watcher|engine_memory_pressure)_\w+$"
)
# Names zerolayer-store-exporter serves (store_exporter_text() proves them).
STORE_EXPORTER_NAME = re.compile(r"^zerolayer_rollout_store_\w+$")
COLLECTIONS_PATH = REPO / ".collections"

KEYWORDS = {
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "inf",
    "nan",
    "atan2",
}
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_LABEL_LISTS = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_IDENTIFIER = re.compile(r"(?<![\w:.$])([A-Za-z_:][\w:]*)(\s*\()?")


def metric_names(expr):
    """Metric names read by a PromQL expression (functions and labels left out)."""
    text = _STRING.sub('""', expr)
    text = _MATCHERS.sub(" ", text)
    text = _RANGES.sub(" ", text)
    text = _LABEL_LISTS.sub(" ", text)
    names = set()
    for match in _IDENTIFIER.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in KEYWORDS:
            continue
        names.add(name)
    return names


def base_name(name):
    for suffix in HISTOGRAM_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def documented_metrics():
    """Metric names in docs/metrics.md (every `name` in backticks that looks like one)."""
    names = set()
    for token in re.findall(r"`([^`\s]+)`", METRICS_DOC.read_text()):
        token = token.split("{", 1)[0]
        if re.fullmatch(r"[A-Za-z_:][\w:]*", token) and ("_" in token or ":" in token):
            names.add(token)
    return names


def scraped_names(text):
    """Sample names and their families from a Prometheus text exposition."""
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            names.add(line.split()[2])
        elif line and not line.startswith("#"):
            name = re.match(r"[A-Za-z_:][\w:]*", line).group(0)
            names.update({name, base_name(name)})
    return names


def fixture_metric_names():
    """Sample names and families in the recorded /metrics fixtures of the engines and DCGM."""
    names = set()
    for path in sorted(FIXTURE_METRICS.glob("*.prom")):
        names |= scraped_names(path.read_text())
    return names


def recorded_names():
    import yaml

    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["record"] for group in groups for rule in group["rules"] if "record" in rule}


def exporter_text():
    """What zerolayer-route-exporter serves for an attached router with a route and an engine,
    its fence watcher connected, during a rollout that was rolled back: every family it has,
    rendered by its own code."""
    import datetime
    import sys

    if str(COLLECTIONS_PATH) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS_PATH))
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition
    from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout

    now = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    record, _changed, _note = rollout.plan(None, "dash-1", None, None, False, now, "sre@ctl")
    record, _changed = rollout.apply(record, "stage_started", {"stage": 0}, now, "sre@ctl")
    record, _changed = rollout.apply(
        record, "rolled_back", {"details": {"mode": "fast"}}, now, "sre@ctl"
    )
    counters = dict.fromkeys(
        ["lookups", "to_engine", "to_proxy_by_weight", "fallback_no_socket", "assign_errors"], 1
    )
    snapshot = {
        "attached": True,
        "program": {"id": 1, "tag": "0123456789abcdef", "run_time_ns": 10, "run_cnt": 1},
        "routes": [
            {
                "name": "chat",
                "port": 8080,
                "weight_bp": 100,
                "generation": 1,
                "engine_sockets": 1,
                "counters": counters,
            }
        ],
        "latency_buckets": [1] * 64,
        "rollout": exposition.rollout_from_record(record),
        "fence": {
            "epoch": 2,
            "kept_detached": False,
            "watcher": {
                "connected": True,
                "store_epoch": 2,
                "last_ack_epoch": 2,
                "last_ack_at_unix": 1740830400.0,
                "updated_at_unix": 1740830410.0,
                "direct_connections": {"chat": 1},
            },
        },
        "engine_pressure": {
            "engines": [
                {
                    "engine": "chat",
                    "pressure": {
                        "some": {"avg10": 0.01, "total": 2.5},
                        "full": {"avg10": 0.0, "total": 0.5},
                    },
                }
            ],
            "error": None,
        },
    }
    return exposition.render(snapshot)


def store_exporter_text():
    """What zerolayer-store-exporter serves for a store holding every kind of wave: one
    running with its runner's lease, one paused, one rolled back, and an alarm raised,
    rendered by its own code."""
    import datetime
    import json
    import sys

    if str(COLLECTIONS_PATH) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS_PATH))
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
    from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout
    from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter

    now = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
    running, _changed, _note = rollout.plan(
        None,
        "dash-1:w1",
        None,
        None,
        False,
        now,
        "sre@ctl",
        2,
        progress={"deadline_s": 600, "abort": False},
    )
    paused, _changed = rollout.apply(running, "pause", {}, now, "sre@ctl")
    ended, _changed = rollout.apply(running, "rolled_back", {}, now, "sre@ctl")
    owner = {"host": "ctl", "pid": 1, "rollout_id": "dash-1", "ttl_s": 30}
    state = store_exporter.store_state(
        {
            "fence": json.dumps({"epoch": 2}),
            "owners": [("gpu_nodes", json.dumps(owner), 25)],
            "records": [
                ("dash-1/w1", record_codec.encode_record(running)),
                ("dash-1/w2", record_codec.encode_record(paused)),
                ("dash-0/w1", record_codec.encode_record(ended)),
            ],
        }
    )
    # collect() reads the store's alarms beside its keys: one member raised NOSPACE.
    state["alarms"] = {"NOSPACE": 1, "CORRUPT": 0}
    # and the watchers' presence: n1's watcher present, n2's gone.
    state["watchers"] = store_exporter.watcher_state(["n1"], ["n2"])
    return store_exporter.render(state)
