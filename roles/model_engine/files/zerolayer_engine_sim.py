"""CPU engine simulator: a test double for a GPU model engine such as vLLM.

It generates no text with any model. It speaks the part of the OpenAI-compatible
HTTP API that the data plane and its drills touch (chat and text completions, streaming
or not, the model list, health and Prometheus metrics under vLLM's metric names), with
a configurable time to first token, inter-token latency, concurrency limit and
injected 5xx errors. Every response says it comes from a simulator.

It answers only the service's API paths (--api-path), each behind the key; on its own
port it also answers /health and /metrics, behind the same key (Prometheus and the drain
send it). A connection the router handed over from the service port gets the API paths
and nothing else, the same policy as the legacy proxy and vLLM's zerolayer_vllm_paths
middleware: no path answers anything but 401 or 404 without a key.

After the node lowered a weight (a rollback, a step down, a drain), the direct connections
the direct-drain marker names leave gracefully (zerolayer_direct_drain, installed beside
this file): "Connection: close" on their next response, and closed by the server once
idle for the grace, so that pooled clients come back through the router.

Standard library only: nodes get no pip.
"""

import argparse
import bisect
import hmac
import json
import os
import re
import select
import signal
import socket
import ssl
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import zerolayer_direct_drain

ENGINE_HEADER = "X-Zerolayer-Engine"
ENGINE_HEADER_VALUE = "simulator"
# Which engine instance answered: an upgrade checks that both paths reach the new one.
ENGINE_NAME_HEADER = "X-Zerolayer-Engine-Name"
PATH_HEADER = "X-Zerolayer-Path"
PATH_HEADER_VALUE = "direct"
SYSTEM_FINGERPRINT = "zerolayer-engine-simulator"
MAX_BODY_BYTES = 4 * 1024 * 1024
UNAUTHORIZED_BODY = b'{"error":"Unauthorized"}'
OUTPUT_WORDS = (
    "simulated",
    "output",
    "from",
    "the",
    "zerolayer",
    "cpu",
    "engine",
    "simulator",
    "no",
    "model",
    "ran",
    "for",
    "this",
    "reply.",
)

# Bucket bounds follow the ones vLLM publishes, so dashboards and gates built
# for vLLM read the simulator without change.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
E2E_BUCKETS = (
    0.01,
    0.05,
    0.1,
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)


# Handlers counted in http_requests_total; anything else (a scanner's guesses) is not, so
# the series stay few.
KNOWN_HANDLERS = frozenset(
    ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
)
# The client API paths when --api-path names none: model_engine_api_paths' default.
DEFAULT_API_PATHS = ("/v1/models", "/v1/chat/completions", "/v1/completions")
# What the engine's own port answers besides the API paths, behind the same key: Prometheus
# and the drain's reading of the queue. A connection handed over from the service port
# never gets them.
OPERATIONS_PATHS = frozenset(("/health", "/metrics"))
# The methods each route of the simulator serves; a route on the allowlist that is not
# here is a 404 (after the key check), one here asked with another method a 405.
ROUTE_METHODS = {
    "/v1/models": ("GET", "HEAD"),
    "/v1/chat/completions": ("POST",),
    "/v1/completions": ("POST",),
    "/health": ("GET", "HEAD"),
    "/metrics": ("GET", "HEAD"),
}


def arrival_path(connection, own_port):
    """'direct' when the router handed the connection over from the service port (its local
    port is not the engine's own), 'proxy' when it came to the engine's own port, which in
    this design only the legacy proxy calls."""
    try:
        local_port = connection.getsockname()[1]
    except OSError:
        return "proxy"
    return "proxy" if local_port == own_port else "direct"


def access(route, arrival, api_paths):
    """How a request for `route` is answered: 'api' (served behind the key) or 'hidden'
    (404, key or not)."""
    if route in api_paths or (arrival == "proxy" and route in OPERATIONS_PATHS):
        return "api"
    return "hidden"


def log(message):
    sys.stderr.write("zerolayer-engine-sim: %s\n" % message)
    sys.stderr.flush()


def escape_label(value):
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def format_number(value):
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


def family(name, kind, help_text, samples):
    """One metric family in the text format: HELP, TYPE, then a line per (labels, value)."""
    lines = ["# HELP %s %s" % (name, help_text), "# TYPE %s %s" % (name, kind)]
    lines += ["%s{%s} %s" % (name, labels, format_number(value)) for labels, value in samples]
    return lines


class Histogram:
    """One histogram, with a series per path the requests arrived on."""

    def __init__(self, name, help_text, bounds):
        self.name = name
        self.help_text = help_text
        self.bounds = bounds
        self.series = {}

    def observe(self, value, path):
        series = self.series.setdefault(
            path, {"buckets": [0] * (len(self.bounds) + 1), "total": 0.0, "count": 0}
        )
        series["buckets"][bisect.bisect_left(self.bounds, value)] += 1
        series["total"] += value
        series["count"] += 1

    def render(self, labels):
        lines = ["# HELP %s %s" % (self.name, self.help_text), "# TYPE %s histogram" % self.name]
        for path in sorted(self.series):
            series = self.series[path]
            series_labels = 'path="%s",%s' % (path, labels)
            cumulative = 0
            for bound, bucket_count in zip(self.bounds, series["buckets"]):
                cumulative += bucket_count
                lines.append(
                    '%s_bucket{le="%s",%s} %d' % (self.name, bound, series_labels, cumulative)
                )
            lines.append('%s_bucket{le="+Inf",%s} %d' % (self.name, series_labels, series["count"]))
            lines.append("%s_count{%s} %d" % (self.name, series_labels, series["count"]))
            lines.append(
                "%s_sum{%s} %s" % (self.name, series_labels, format_number(series["total"]))
            )
        return lines


class Metrics:
    """Counters and histograms, rendered in the Prometheus text format."""

    def __init__(self, model, engine_name, max_concurrency=64):
        self.lock = threading.Lock()
        self.max_concurrency = max_concurrency
        self.labels = 'model_name="%s"' % escape_label(model)
        self.info_labels = 'engine="%s",model_name="%s",kind="simulator"' % (
            escape_label(engine_name),
            escape_label(model),
        )
        self.running = 0
        self.success = {"stop": 0, "length": 0, "abort": 0}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.errors = {
            "unauthorized": 0,
            "bad_request": 0,
            "not_found": 0,
            "overloaded": 0,
            "injected": 0,
        }
        self.admin_reload_failures = 0
        # Direct connections sent away by the direct-drain marker, by how: "response"
        # (Connection: close on an answer) or "idle" (closed while waiting).
        self.direct_closed = {"response": 0, "idle": 0}
        # (handler, method, status class, path) -> count, as vLLM's HTTP instrumentation
        # reports it (status "2xx", "4xx", "5xx"), with the path the request arrived on.
        self.http_requests = {}
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        # The older vLLM name for the same measurement; still read by many dashboards.
        self.tpot = Histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            E2E_BUCKETS,
        )

    def count_error(self, reason):
        with self.lock:
            self.errors[reason] += 1

    def count_direct_closed(self, how):
        with self.lock:
            self.direct_closed[how] += 1

    def count_admin_reload_failure(self):
        with self.lock:
            self.admin_reload_failures += 1

    def count_http_request(self, handler, method, status, path):
        key = (handler, method, "%dxx" % (status // 100), path)
        with self.lock:
            self.http_requests[key] = self.http_requests.get(key, 0) + 1

    def request_started(self):
        with self.lock:
            self.running += 1

    def request_finished(self, finished_reason, prompt_tokens, token_gaps, ttft, e2e, path):
        with self.lock:
            self.running -= 1
            self.success[finished_reason] += 1
            self.prompt_tokens += prompt_tokens
            self.generation_tokens += len(token_gaps) + (1 if ttft is not None else 0)
            if ttft is not None:
                self.ttft.observe(ttft, path)
            for gap in token_gaps:
                self.itl.observe(gap, path)
                self.tpot.observe(gap, path)
            self.e2e.observe(e2e, path)

    def render(self, error_rate):
        with self.lock:
            labels = self.labels
            lines = []
            lines += family(
                "vllm:num_requests_running",
                "gauge",
                "Number of requests in model execution batches.",
                [(labels, self.running)],
            )
            lines += family(
                "vllm:num_requests_waiting",
                "gauge",
                "Number of requests waiting to be processed.",
                [(labels, 0)],
            )
            # No KV cache here: the share of request slots in use stands for the share of
            # KV blocks in use, 0 to 1 like vLLM's (what the GPU memory gate reads without DCGM).
            lines += family(
                "vllm:kv_cache_usage_perc",
                "gauge",
                "KV-cache usage. 1 means 100 percent usage.",
                [(labels, round(self.running / self.max_concurrency, 6))],
            )
            lines += family(
                "vllm:request_success_total",
                "counter",
                "Count of successfully processed requests.",
                [
                    ('finished_reason="%s",%s' % (reason, labels), self.success[reason])
                    for reason in sorted(self.success)
                ],
            )
            lines += family(
                "vllm:prompt_tokens_total",
                "counter",
                "Number of prefill tokens processed.",
                [(labels, self.prompt_tokens)],
            )
            lines += family(
                "vllm:generation_tokens_total",
                "counter",
                "Number of generation tokens processed.",
                [(labels, self.generation_tokens)],
            )
            for histogram in (self.ttft, self.itl, self.tpot, self.e2e):
                lines += histogram.render(labels)
            lines += family(
                "http_requests_total",
                "counter",
                "Requests by method, status class, handler and path.",
                [
                    (
                        'handler="%s",method="%s",status="%s",path="%s",%s'
                        % (escape_label(handler), method, status, path, labels),
                        count,
                    )
                    for (handler, method, status, path), count in sorted(self.http_requests.items())
                ],
            )
            lines += family(
                "zerolayer_sim_errors_total",
                "counter",
                "Requests answered with an error, by reason.",
                [
                    ('reason="%s",%s' % (reason, labels), self.errors[reason])
                    for reason in sorted(self.errors)
                ],
            )
            lines += family(
                "zerolayer_engine_direct_connections_closed_total",
                "counter",
                "Direct connections the direct-drain marker sent away, by how.",
                [
                    ('how="%s",%s' % (how, labels), self.direct_closed[how])
                    for how in sorted(self.direct_closed)
                ],
            )
            lines += family(
                "zerolayer_sim_admin_reload_failures_total",
                "counter",
                "Admin files left unapplied.",
                [(labels, self.admin_reload_failures)],
            )
            lines += family(
                "zerolayer_sim_injected_error_rate",
                "gauge",
                "Share of requests given an injected 5xx.",
                [(labels, error_rate)],
            )
            lines += family(
                "zerolayer_sim_info",
                "gauge",
                "This engine is a CPU simulator, not a model engine.",
                [(self.info_labels, 1)],
            )
        return ("\n".join(lines) + "\n").encode()


def file_identity(path):
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return (status.st_ino, status.st_mtime_ns, status.st_size)


class RuntimeSettings:
    """Latency and fault settings that an admin file changes while the server runs.

    The file is JSON with any of: error_rate (0..1), error_status (500..599),
    time_to_first_token_seconds, inter_token_latency_seconds. It is re-read when it
    changes (checked on each request, and at once on SIGHUP); a bad file leaves the
    previous settings in place. A missing file means the command-line values.
    """

    FIELDS = (
        "error_rate",
        "error_status",
        "time_to_first_token_seconds",
        "inter_token_latency_seconds",
    )

    def __init__(self, path, baseline, metrics):
        self.path = path
        self.baseline = dict(baseline)
        self.metrics = metrics
        self.lock = threading.Lock()
        self.values = dict(baseline)
        self.loaded_identity = None
        self.requests_seen = 0
        self.refresh(force=True)

    @staticmethod
    def validate(data):
        if not isinstance(data, dict):
            raise ValueError("the admin file must hold a JSON object")
        unknown = sorted(set(data) - set(RuntimeSettings.FIELDS))
        if unknown:
            raise ValueError(
                "unknown fields %s; allowed: %s"
                % (", ".join(unknown), ", ".join(RuntimeSettings.FIELDS))
            )
        rate = data.get("error_rate", 0.0)
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
            raise ValueError("error_rate must be a number from 0 to 1")
        status = data.get("error_status", 503)
        if isinstance(status, bool) or not isinstance(status, int) or not 500 <= status <= 599:
            raise ValueError("error_status must be an integer from 500 to 599")
        for field in ("time_to_first_token_seconds", "inter_token_latency_seconds"):
            value = data.get(field, 0.0)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
            if not is_number or not 0.0 <= value <= 60.0:
                raise ValueError("%s must be a number of seconds from 0 to 60" % field)

    def refresh(self, force=False):
        if self.path is None:
            return
        identity = file_identity(self.path)
        if identity == self.loaded_identity and not force:
            return
        with self.lock:
            if identity == self.loaded_identity and not force:
                return
            self.loaded_identity = identity
            if identity is None:
                self.apply({})
                return
            try:
                with open(self.path, encoding="utf-8") as handle:
                    data = json.load(handle)
                self.validate(data)
            except (OSError, ValueError) as error:
                self.metrics.count_admin_reload_failure()
                log("admin file %s ignored, previous settings kept: %s" % (self.path, error))
                return
            self.apply(data)
            log("admin settings applied: %s" % json.dumps(self.values, sort_keys=True))

    def apply(self, data):
        values = dict(self.baseline)
        values.update(data)
        if values["error_rate"] != self.values["error_rate"]:
            self.requests_seen = 0
        self.values = values

    def snapshot(self):
        with self.lock:
            return dict(self.values)

    def should_inject_error(self):
        """Spread injected errors evenly: of the first n requests, floor(n * rate) fail."""
        with self.lock:
            rate = self.values["error_rate"]
            if rate <= 0.0:
                return None
            self.requests_seen += 1
            seen = self.requests_seen
            if int(seen * rate) > int((seen - 1) * rate):
                return self.values["error_status"]
            return None


class ApiKeys:
    """Bearer keys from a file, one per line; the file must not be readable by others."""

    def __init__(self, path):
        self.path = path
        self.lock = threading.Lock()
        self.keys = ()
        self.loaded_identity = None
        self.refresh(force=True)

    @property
    def enforced(self):
        return self.path is not None

    def refresh(self, force=False):
        if self.path is None:
            return
        identity = file_identity(self.path)
        if identity == self.loaded_identity and not force:
            return
        with self.lock:
            self.loaded_identity = identity
            self.keys = self.read_keys()

    def read_keys(self):
        try:
            mode = os.stat(self.path).st_mode
            if mode & 0o077:
                # Fail closed: a key file others can read is treated as leaked.
                log(
                    "API key file %s is readable by group or others (mode %o); refusing every key"
                    % (self.path, mode & 0o777)
                )
                return ()
            with open(self.path, encoding="utf-8") as handle:
                lines = handle.read().splitlines()
        except OSError as error:
            log("API key file %s unreadable, refusing every key: %s" % (self.path, error))
            return ()
        return tuple(
            line.strip().encode()
            for line in lines
            if line.strip() and not line.strip().startswith("#")
        )

    def allows(self, authorization):
        if not self.enforced:
            return True
        self.refresh()
        presented = (authorization or "").encode()
        allowed = False
        for key in self.keys:
            # Compare against every key, without stopping early, in constant time.
            allowed |= hmac.compare_digest(presented, b"Bearer " + key)
        return allowed


class BadRequest(Exception):
    def __init__(self, status, message):
        super().__init__(message)
        self.status = status
        self.message = message


def message_text(message):
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(
            part.get("text", "")
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text", ""), str)
        )
    raise BadRequest(400, "messages[].content must be a string or a list of content parts")


def prompt_text(prompt):
    """The prompt of a text completion: one string, or one prompt as a list of token ids."""
    if isinstance(prompt, str):
        return prompt
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(token, int) and not isinstance(token, bool) for token in prompt)
    ):
        return " ".join(str(token) for token in prompt)
    raise BadRequest(
        400, "prompt must be a string or a list of token ids (the simulator takes one prompt)"
    )


def parse_request(body, config, kind):
    """The settings of a completion request; kind is 'chat' (/v1/chat/completions) or
    'text' (/v1/completions)."""
    try:
        request = json.loads(body or b"null")
    except ValueError as error:
        raise BadRequest(400, "request body is not valid JSON: %s" % error) from None
    if not isinstance(request, dict):
        raise BadRequest(400, "request body must be a JSON object")
    model = request.get("model", config.model)
    if model != config.model:
        raise BadRequest(404, "The model `%s` does not exist." % model)
    if kind == "chat":
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest(400, "messages must be a non-empty list")
        for message in messages:
            if not isinstance(message, dict) or not isinstance(message.get("role"), str):
                raise BadRequest(400, "each message must be an object with a string role")
        # Whitespace-separated words stand in for tokens: there is no tokenizer here.
        prompt_tokens = sum(len(message_text(message).split()) for message in messages)
    else:
        prompt_tokens = len(prompt_text(request.get("prompt")).split())
    if prompt_tokens > config.max_input_tokens:
        raise BadRequest(
            400,
            "This model's maximum input length is %d tokens; "
            "the prompt holds %d." % (config.max_input_tokens, prompt_tokens),
        )
    requested = request.get("max_completion_tokens", request.get("max_tokens"))
    if requested is None:
        output_tokens, finish_reason = min(config.output_tokens, config.max_output_tokens), "stop"
    elif isinstance(requested, bool) or not isinstance(requested, int) or requested < 1:
        raise BadRequest(400, "max_tokens must be a positive integer")
    elif requested > config.max_output_tokens:
        raise BadRequest(
            400,
            "max_tokens is %d but this engine allows at most %d output tokens."
            % (requested, config.max_output_tokens),
        )
    else:
        output_tokens, finish_reason = requested, "length"
    stream = request.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest(400, "stream must be a boolean")
    options = request.get("stream_options") or {}
    include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
    return {
        "kind": kind,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "finish_reason": finish_reason,
        "stream": stream,
        "include_usage": include_usage,
    }


def completion_id(request):
    return ("chatcmpl-sim-%s" if request["kind"] == "chat" else "cmpl-sim-%s") % uuid.uuid4().hex


def output_token(index):
    word = OUTPUT_WORDS[index % len(OUTPUT_WORDS)]
    return word if index == 0 else " " + word


class EngineHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "zerolayer-engine-sim"
    sys_version = ""
    # Coalesce status line, headers and body into one write; streams flush per event.
    wbufsize = 64 * 1024
    # Idle keep-alive connections give their thread back after this long.
    timeout = 120
    # How often a connection waiting for its next request looks at the direct-drain marker.
    IDLE_POLL_S = 0.1

    def version_string(self):
        return self.server_version

    def setup(self):
        super().setup()
        self.accepted_unix = time.time()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.local_port = self.connection.getsockname()[1]
        self.arrival_path = arrival_path(self.connection, self.server.server_address[1])

    def handle(self):
        # BaseHTTPRequestHandler.handle, with the wait between two requests in our hands: a
        # direct connection that the marker sends away is closed there once idle.
        self.close_connection = True
        self.handle_one_request()
        while not self.close_connection:
            if not self.await_next_request():
                return
            self.handle_one_request()

    def direct_must_leave(self):
        return self.arrival_path == "direct" and zerolayer_direct_drain.must_leave(
            self.server.drain_marker.current(), self.local_port, self.accepted_unix
        )

    def await_next_request(self):
        """True once the next request (or the client's close) can be read; False when the
        connection is to be closed idle: after `timeout`, or a direct one the marker sends
        away once it has been idle for the grace."""
        idle_from = time.monotonic()
        # Only a direct connection has the marker to look at while it waits.
        poll_s = self.IDLE_POLL_S if self.arrival_path == "direct" else self.timeout
        while True:
            if self.request_buffered():
                return True
            readable = select.select([self.connection], [], [], poll_s)[0]
            if readable:
                return True
            idle_s = time.monotonic() - idle_from
            if idle_s >= self.timeout:
                return False
            if self.arrival_path == "direct" and zerolayer_direct_drain.close_idle_now(
                self.server.drain_marker.current(),
                self.local_port,
                self.accepted_unix,
                0,
                idle_s,
                self.server.config.direct_idle_grace,
            ):
                self.server.metrics.count_direct_closed("idle")
                return False

    def request_buffered(self):
        """Whether a pipelined request already sits in the read buffer (select cannot see
        it there): a read that does not block."""
        if isinstance(self.connection, ssl.SSLSocket) and self.connection.pending():
            return True
        self.connection.setblocking(False)
        try:
            return bool(self.rfile.peek(1))
        except (BlockingIOError, ssl.SSLWantReadError):
            return False
        finally:
            self.connection.settimeout(self.timeout)

    def send_response(self, code, message=None):
        super().send_response(code, message)
        handler = self.path.split("?", 1)[0] if self.path.startswith("/v1/") else self.path
        if handler in KNOWN_HANDLERS:
            self.server.metrics.count_http_request(handler, self.command, code, self.arrival_path)

    def log_message(self, format, *args):
        if self.server.config.access_log:
            log("%s %s" % (self.address_string(), format % args))

    # -- responses -------------------------------------------------------------

    def start_response(self, status, content_type, length=None):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header(ENGINE_HEADER, ENGINE_HEADER_VALUE)
        self.send_header(ENGINE_NAME_HEADER, self.server.config.engine_name)
        self.send_header(PATH_HEADER, PATH_HEADER_VALUE)
        if length is not None:
            self.send_header("Content-Length", str(length))
        leaving = not self.close_connection and self.direct_must_leave()
        if leaving:
            self.server.metrics.count_direct_closed("response")
        if self.server.draining or self.close_connection or leaving:
            self.close_connection = True
            self.send_header("Connection", "close")

    def send_body(self, status, body, content_type):
        self.start_response(status, content_type, len(body))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_json(self, status, payload):
        body = json.dumps(payload, separators=(",", ":")).encode()
        self.send_body(status, body, "application/json")

    def send_error_json(self, status, message, error_type):
        self.send_json(
            status,
            {
                "object": "error",
                "message": message,
                "type": error_type,
                "param": None,
                "code": status,
            },
        )

    def send_unauthorized(self):
        self.server.metrics.count_error("unauthorized")
        self.send_body(401, UNAUTHORIZED_BODY, "application/json")

    # -- request plumbing --------------------------------------------------------

    def read_body(self):
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            self.close_connection = True
            raise BadRequest(411, "chunked request bodies are not supported; send Content-Length")
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            self.close_connection = True
            raise BadRequest(400, "Content-Length is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True
            raise BadRequest(413, "request body larger than %d bytes" % MAX_BODY_BYTES)
        return self.rfile.read(length) if length else b""

    def route(self):
        return self.path.split("?", 1)[0]

    def answer(self):
        """Every request, whatever its method: the path's access first (404 for a path not
        served on this arrival path, 401 for an API path without a valid key, both before
        anything else is said), then the route."""
        self.server.settings.refresh()
        try:
            body = self.read_body()
        except BadRequest as error:
            self.server.metrics.count_error("bad_request")
            self.send_error_json(error.status, error.message, "BadRequestError")
            return
        route = self.route()
        verdict = access(route, self.arrival_path, self.server.config.api_paths)
        if verdict == "hidden":
            self.send_not_found(route)
            return
        if verdict == "api" and not self.server.api_keys.allows(self.headers.get("Authorization")):
            self.send_unauthorized()
            return
        methods = ROUTE_METHODS.get(route)
        if methods is None:
            # On the allowlist but not a route the simulator has.
            self.send_not_found(route)
        elif self.command not in methods:
            self.send_method_not_allowed(methods)
        elif route == "/health":
            self.send_body(200, b"", "text/plain; charset=utf-8")
        elif route == "/metrics":
            error_rate = self.server.settings.snapshot()["error_rate"]
            self.send_body(
                200,
                self.server.metrics.render(error_rate),
                "text/plain; version=0.0.4; charset=utf-8",
            )
        elif route == "/v1/models":
            self.send_models()
        else:
            self.serve_completion(body, "chat" if route == "/v1/chat/completions" else "text")

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = answer

    def send_not_found(self, route):
        self.server.metrics.count_error("not_found")
        self.send_error_json(404, "no route %s" % route, "NotFoundError")

    def send_method_not_allowed(self, methods):
        self.server.metrics.count_error("bad_request")
        body = json.dumps(
            {
                "object": "error",
                "message": "method %s not allowed on %s" % (self.command, self.route()),
                "type": "MethodNotAllowed",
                "param": None,
                "code": 405,
            },
            separators=(",", ":"),
        ).encode()
        self.start_response(405, "application/json", len(body))
        self.send_header("Allow", ", ".join(methods))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def send_models(self):
        config = self.server.config
        self.send_json(
            200,
            {
                "object": "list",
                "data": [
                    {
                        "id": config.model,
                        "object": "model",
                        "created": config.started,
                        "owned_by": "zerolayer-engine-simulator",
                        "root": config.model,
                        "max_model_len": config.max_input_tokens + config.max_output_tokens,
                    }
                ],
            },
        )

    def serve_completion(self, body, kind):
        try:
            request = parse_request(body, self.server.config, kind)
        except BadRequest as error:
            reason = "not_found" if error.status == 404 else "bad_request"
            self.server.metrics.count_error(reason)
            self.send_error_json(
                error.status,
                error.message,
                "NotFoundError" if error.status == 404 else "BadRequestError",
            )
            return
        if not self.server.slots.acquire(blocking=False):
            self.server.metrics.count_error("overloaded")
            self.send_error_json(
                429,
                "the engine is at its limit of %d concurrent requests"
                % self.server.config.max_concurrency,
                "TooManyRequests",
            )
            return
        try:
            injected_status = self.server.settings.should_inject_error()
            if injected_status is not None:
                self.server.metrics.count_error("injected")
                self.send_error_json(
                    injected_status, "injected fault (simulator error injection)", "InjectedFault"
                )
                return
            self.server.active.enter()
            try:
                self.complete(request)
            finally:
                self.server.active.leave()
        finally:
            self.server.slots.release()

    # -- generation ----------------------------------------------------------------

    def complete(self, request):
        settings = self.server.settings.snapshot()
        metrics = self.server.metrics
        metrics.request_started()
        started = time.monotonic()
        first_token_at = None
        gaps = []
        finished_reason = "abort"
        try:
            if request["stream"]:
                first_token_at, gaps = self.stream(request, settings, started)
            else:
                first_token_at, gaps = self.generate_silently(request, settings, started)
            finished_reason = request["finish_reason"]
        except (BrokenPipeError, ConnectionResetError, socket.timeout, ssl.SSLError):
            self.close_connection = True
        finally:
            ttft = None if first_token_at is None else first_token_at - started
            metrics.request_finished(
                finished_reason,
                request["prompt_tokens"],
                gaps,
                ttft,
                time.monotonic() - started,
                self.arrival_path,
            )

    def generate_silently(self, request, settings, started):
        time.sleep(settings["time_to_first_token_seconds"])
        first_token_at = time.monotonic()
        gaps = []
        for _token in range(request["output_tokens"] - 1):
            before = time.monotonic()
            time.sleep(settings["inter_token_latency_seconds"])
            gaps.append(time.monotonic() - before)
        text = "".join(output_token(index) for index in range(request["output_tokens"]))
        choice = {"index": 0, "logprobs": None, "finish_reason": request["finish_reason"]}
        if request["kind"] == "chat":
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        self.send_json(
            200,
            {
                "id": completion_id(request),
                "object": "chat.completion" if request["kind"] == "chat" else "text_completion",
                "created": int(time.time()),
                "model": self.server.config.model,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "choices": [choice],
                "usage": self.usage(request),
            },
        )
        return first_token_at, gaps

    def usage(self, request):
        return {
            "prompt_tokens": request["prompt_tokens"],
            "completion_tokens": request["output_tokens"],
            "total_tokens": request["prompt_tokens"] + request["output_tokens"],
        }

    def send_event(self, payload):
        data = (
            b"data: "
            + (
                payload
                if isinstance(payload, bytes)
                else json.dumps(payload, separators=(",", ":")).encode()
            )
            + b"\n\n"
        )
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def stream(self, request, settings, started):
        chat = request["kind"] == "chat"
        stream_id = completion_id(request)
        created = int(time.time())
        model = self.server.config.model

        def chunk(delta, finish_reason=None):
            choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
            if chat:
                choice["delta"] = delta
            else:
                choice["text"] = delta.get("content", "")
            return {
                "id": stream_id,
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created,
                "model": model,
                "system_fingerprint": SYSTEM_FINGERPRINT,
                "choices": [choice],
            }

        self.start_response(200, "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        if chat:
            self.send_event(chunk({"role": "assistant", "content": ""}))
        time.sleep(settings["time_to_first_token_seconds"])
        first_token_at = time.monotonic()
        previous = first_token_at
        gaps = []
        self.send_event(chunk({"content": output_token(0)}))
        for index in range(1, request["output_tokens"]):
            time.sleep(settings["inter_token_latency_seconds"])
            now = time.monotonic()
            gaps.append(now - previous)
            previous = now
            self.send_event(chunk({"content": output_token(index)}))
        self.send_event(chunk({}, request["finish_reason"]))
        if request["include_usage"]:
            final = chunk({})
            final["choices"] = []
            final["usage"] = self.usage(request)
            self.send_event(final)
        self.send_event(b"[DONE]")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        return first_token_at, gaps


class ActiveRequests:
    """Counts requests being generated, so a stop can let them finish."""

    def __init__(self):
        self.condition = threading.Condition()
        self.count = 0

    def enter(self):
        with self.condition:
            self.count += 1

    def leave(self):
        with self.condition:
            self.count -= 1
            self.condition.notify_all()

    def wait_idle(self, timeout):
        deadline = time.monotonic() + timeout
        with self.condition:
            while self.count > 0:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.condition.wait(left)
        return True


class EngineServer(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True
    # Bursts of connections (load tests, a canary switching at once) must not
    # overflow the accept queue; the kernel caps this at net.core.somaxconn.
    request_queue_size = 4096

    def __init__(self, config, tls_context):
        if ":" in config.host:
            self.address_family = socket.AF_INET6
        super().__init__((config.host, config.port), EngineHandler)
        self.config = config
        self.tls_context = tls_context
        self.draining = False
        self.metrics = Metrics(config.model, config.engine_name, config.max_concurrency)
        self.settings = RuntimeSettings(
            config.admin_file,
            {
                "error_rate": config.error_rate,
                "error_status": config.error_status,
                "time_to_first_token_seconds": config.time_to_first_token,
                "inter_token_latency_seconds": config.inter_token_latency,
            },
            self.metrics,
        )
        self.api_keys = ApiKeys(config.api_keys_file)
        self.drain_marker = zerolayer_direct_drain.MarkerFile(config.direct_drain_file)
        self.slots = threading.BoundedSemaphore(config.max_concurrency)
        self.active = ActiveRequests()

    def finish_request(self, request, client_address):
        # The TLS handshake runs in the connection's own thread, never in the
        # accept loop, so one slow client cannot stall new connections.
        if self.tls_context is not None:
            request.settimeout(10)
            try:
                request = self.tls_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError):
                return
            request.settimeout(None)
        try:
            self.RequestHandlerClass(request, client_address, self)
        finally:
            if self.tls_context is not None:
                request.close()

    def handle_error(self, request, client_address):
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, socket.timeout, ssl.SSLError)):
            return
        super().handle_error(request, client_address)


def notify_systemd(state):
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return
    if address.startswith("@"):
        address = "\0" + address[1:]
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notifier:
        notifier.connect(address)
        notifier.sendall(state.encode())


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be a positive integer, got %s" % text)
    return value


def seconds(text):
    value = float(text)
    if not 0.0 <= value <= 60.0:
        raise argparse.ArgumentTypeError("must be seconds from 0 to 60, got %s" % text)
    return value


def rate(text):
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError("must be a number from 0 to 1, got %s" % text)
    return value


def api_path(text):
    if not re.fullmatch(r"/v1/[A-Za-z0-9._~/-]+", text) or re.search(r"//|/\.\.?(/|$)", text):
        raise argparse.ArgumentTypeError(
            "must be an exact path under /v1/ of A-Z a-z 0-9 . _ ~ / - without empty, . or .. "
            "segments, got %s" % text
        )
    return text


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="CPU engine simulator (a test double for a GPU model engine; no model runs)."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8101, help="0 picks a free port")
    parser.add_argument("--model", default="zerolayer-simulated-model")
    parser.add_argument("--engine-name", default="sim")
    parser.add_argument(
        "--api-keys-file", help="bearer keys, one per line, mode 0600; omit to allow all"
    )
    parser.add_argument(
        "--admin-file", help="JSON with error_rate, error_status, latencies; re-read on change"
    )
    parser.add_argument(
        "--api-path",
        dest="api_paths",
        action="append",
        type=api_path,
        metavar="PATH",
        help="a client API path served behind the key, exact, under /v1/; repeat for each "
        "(default: %s)" % " ".join(DEFAULT_API_PATHS),
    )
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    parser.add_argument("--time-to-first-token", type=seconds, default=0.02, help="seconds")
    parser.add_argument("--inter-token-latency", type=seconds, default=0.005, help="seconds")
    parser.add_argument(
        "--output-tokens",
        type=positive_int,
        default=16,
        help="tokens generated when the request names no max_tokens",
    )
    parser.add_argument("--max-concurrency", type=positive_int, default=64)
    parser.add_argument("--max-input-tokens", type=positive_int, default=4096)
    parser.add_argument("--max-output-tokens", type=positive_int, default=1024)
    parser.add_argument("--error-rate", type=rate, default=0.0)
    parser.add_argument(
        "--error-status", type=int, default=503, choices=range(500, 600), metavar="5xx"
    )
    parser.add_argument(
        "--drain-seconds",
        type=seconds,
        default=30.0,
        help="how long a stop waits for requests in flight",
    )
    parser.add_argument(
        "--direct-drain-file",
        default=zerolayer_direct_drain.DEFAULT_MARKER_FILE,
        help="the node's direct-drain marker, written when a weight goes down",
    )
    parser.add_argument(
        "--direct-idle-grace",
        type=seconds,
        default=zerolayer_direct_drain.DEFAULT_IDLE_GRACE_S,
        help="seconds a direct connection the marker sends away may stay idle",
    )
    parser.add_argument("--access-log", action="store_true")
    config = parser.parse_args(argv)
    if bool(config.tls_cert) != bool(config.tls_key):
        parser.error("--tls-cert and --tls-key go together")
    config.api_paths = frozenset(config.api_paths or DEFAULT_API_PATHS)
    config.started = int(time.time())
    return config


def build_tls_context(config):
    if not config.tls_cert:
        return None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert, config.tls_key)
    return context


def main(argv=None):
    config = parse_args(sys.argv[1:] if argv is None else argv)
    if config.api_keys_file and not os.path.exists(config.api_keys_file):
        log("API key file %s does not exist" % config.api_keys_file)
        return 2
    try:
        tls_context = build_tls_context(config)
        server = EngineServer(config, tls_context)
    except (OSError, ssl.SSLError) as error:
        log("cannot start: %s" % error)
        return 1

    def stop(signum, frame):
        if server.draining:
            return
        server.draining = True
        # shutdown() waits for serve_forever to return, so it cannot run in the
        # signal handler, which interrupts serve_forever itself.
        threading.Thread(target=server.shutdown, daemon=True).start()

    def reload(signum, frame):
        server.settings.refresh(force=True)
        server.api_keys.refresh(force=True)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)

    host, port = server.server_address[:2]
    print(
        json.dumps(
            {
                "event": "listening",
                "host": host,
                "port": port,
                "tls": tls_context is not None,
                "engine": "simulator",
            }
        ),
        flush=True,
    )
    notify_systemd("READY=1\nSTATUS=simulator listening on port %d" % port)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        # Closing the listener first takes it out of any socket map at once, so new
        # connections fall back to the proxy while streams in flight finish here.
        server.server_close()
        notify_systemd("STOPPING=1")
        if not server.active.wait_idle(config.drain_seconds):
            log("stopped with requests still in flight after %.0f s" % config.drain_seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
