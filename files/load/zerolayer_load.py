#!/usr/bin/env python3
"""Load client for canaries, drills and upgrades: counts every request and the path it took.

Each worker sends OpenAI-style chat completions to the nodes' service ports, by default one
new TCP connection per request, because the router decides per connection: a client that
reuses one connection would never see a weight change. --connection-mode pooled keeps the
connections alive instead, as a pooling client (OpenAI SDK/httpx, gateways, aiohttp) does, to
measure how the engines send such clients back to the router after a rollback. The path comes
from the response header X-Zerolayer-Path: the legacy proxy sets "proxy" on every answer it
forwards, so an answer without it came straight from the engine ("direct"; a stock vLLM sets
none).
A streaming request counts as good only when its stream ends with the [DONE] event, so a
stream cut by a change on the node is a failure with its cause.

The summary (JSON, rewritten atomically every second and at exit) holds totals per path and
per target, failures by cause with examples, latency and time to first token per path, when the last
request on each path began and ended, how many answers closed their connection, and a series
of one-second buckets that drills plot and canaries read the measured split from.

Standard library only, so it runs on any controller. Stop it with SIGTERM or SIGINT, or by
creating the --stop-file: it sends no new requests, lets in-flight ones finish, and exits.
"""

import argparse
import functools
import http.client
import itertools
import json
import os
import select
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict

PATH_HEADER = "X-Zerolayer-Path"
DONE_EVENT = b"data: [DONE]"
KNOWN_PATHS = ("direct", "proxy")
FAILURE_EXAMPLES_KEPT = 50
CONNECTION_MODES = ("per-request", "pooled")
# How a request sent on a keep-alive connection that the server closed while it sat idle
# fails, before any byte of an answer (http.client reports an empty status line as
# RemoteDisconnected, itself a ConnectionResetError).
STALE_CONNECTION_ERRORS = (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)


class Failure(Exception):
    """A request that did not complete; `cause` is a short stable name for grouping. `stale`:
    it failed before any answer, the way a connection the server closed while idle fails."""

    def __init__(self, cause, detail="", stale=False):
        super().__init__(f"{cause}: {detail}" if detail else cause)
        self.cause = cause
        self.detail = detail
        self.stale = stale


def parse_target(text):
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"--target must be HOST:PORT, got {text!r}")
    return host.strip("[]"), int(port)


def percentile(sorted_values, fraction):
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, int(fraction * len(sorted_values)))
    return sorted_values[index]


class Recorder:
    """Thread-safe tally of outcomes, per path and per second since the start."""

    def __init__(self, started, connection_mode):
        self.started = started
        self.connection_mode = connection_mode
        self.lock = threading.Lock()
        self.by_path = Counter()
        self.failures = Counter()
        self.failure_examples = []
        self.latency = defaultdict(list)
        self.ttft = defaultdict(list)
        self.series = defaultdict(Counter)
        # {"host:port": Counter(path or "failed")}: which node answered, for a report per
        # node or per engine kind.
        self.by_target = defaultdict(Counter)
        self.last_began = {}
        self.last_ended = {}
        self.closed_by_server = Counter()
        self.stale_retries = 0
        self.streams_completed = 0

    def success(self, target, path, began, ended, ttft, streamed, closed_by_server):
        second = int(began - self.started)
        with self.lock:
            self.by_path[path] += 1
            self.by_target["%s:%d" % target][path] += 1
            self.series[second][path] += 1
            self.last_began[path] = max(began, self.last_began.get(path, began))
            self.last_ended[path] = max(ended, self.last_ended.get(path, ended))
            if closed_by_server:
                self.closed_by_server[path] += 1
            self.latency[path].append(ended - began)
            if ttft is not None:
                self.ttft[path].append(ttft)
            if streamed:
                self.streams_completed += 1

    def stale_retry(self):
        with self.lock:
            self.stale_retries += 1

    def failure(self, target, began, error):
        second = int(began - self.started)
        with self.lock:
            self.failures[error.cause] += 1
            self.series[second]["failed"] += 1
            self.by_target["%s:%d" % target]["failed"] += 1
            if len(self.failure_examples) < FAILURE_EXAMPLES_KEPT:
                self.failure_examples.append(
                    {
                        "at_s": round(began - self.started, 3),
                        "target": "%s:%d" % target,
                        "cause": error.cause,
                        "detail": error.detail[:300],
                    }
                )

    def summary(self, now, finished):
        with self.lock:
            total_ok = sum(self.by_path.values())
            total_failed = sum(self.failures.values())
            per_path = {}
            for path, count in sorted(self.by_path.items()):
                latency = sorted(self.latency[path])
                ttft = sorted(self.ttft[path])
                per_path[path] = {
                    "requests": count,
                    "share": round(count / total_ok, 6) if total_ok else None,
                    "latency_p50_s": percentile(latency, 0.50),
                    "latency_p99_s": percentile(latency, 0.99),
                    "ttft_p50_s": percentile(ttft, 0.50),
                    "ttft_p99_s": percentile(ttft, 0.99),
                    # When the last request that took this path was sent, and when its last
                    # answer completed: a drill reads from them how long after a rollback
                    # the client still reached the engine directly (on a new connection, or
                    # on a pooled one the engine had not sent away yet).
                    "last_began_unix": round(self.last_began[path], 3),
                    "last_ended_unix": round(self.last_ended[path], 3),
                    # Answers that said "Connection: close": how the engines send pooled
                    # clients back through the router.
                    "connections_closed_by_server": self.closed_by_server[path],
                }
            series = [
                {"second": second, **dict(counts)} for second, counts in sorted(self.series.items())
            ]
            return {
                "started_unix": self.started,
                "elapsed_s": round(now - self.started, 3),
                "finished": finished,
                "connection_mode": self.connection_mode,
                "requests_ok": total_ok,
                "requests_failed": total_failed,
                "streams_completed": self.streams_completed,
                # Requests sent again once on a new connection because their pooled one had
                # been closed by the server while idle; not failures.
                "stale_connection_retries": self.stale_retries,
                "paths": per_path,
                "targets": {
                    target: dict(counts) for target, counts in sorted(self.by_target.items())
                },
                "failures_by_cause": dict(self.failures),
                "failure_examples": list(self.failure_examples),
                "series": series,
            }


def write_atomically(path, document):
    directory = os.path.dirname(os.path.abspath(path))
    handle, temp = tempfile.mkstemp(dir=directory, prefix=".load-summary-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            json.dump(document, out, indent=1, sort_keys=True)
        os.replace(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise


class Client:
    """Sends one request on a given connection and classifies what came back."""

    def __init__(self, args):
        self.args = args
        self.headers = {"Content-Type": "application/json"}
        if args.api_key_file:
            with open(args.api_key_file, encoding="utf-8") as handle:
                key = handle.read().strip().splitlines()[0].strip()
            self.headers["Authorization"] = "Bearer " + key
        self.tls = None
        if args.tls:
            self.tls = ssl.create_default_context(cafile=args.ca_file)
            if args.insecure:
                self.tls.check_hostname = False
                self.tls.verify_mode = ssl.CERT_NONE

    def connect(self, target):
        host, port = target
        if self.tls is not None:
            return http.client.HTTPSConnection(
                host, port, timeout=self.args.timeout, context=self.tls
            )
        return http.client.HTTPConnection(host, port, timeout=self.args.timeout)

    def body(self, stream):
        return json.dumps(
            {
                "model": self.args.model,
                "messages": [{"role": "user", "content": "zerolayer load probe"}],
                "max_tokens": self.args.max_tokens,
                "stream": stream,
            }
        ).encode()

    def request(self, connection, stream):
        """Returns (path, ttft or None, whether the answer closed the connection); raises
        Failure."""
        began = time.monotonic()
        try:
            connection.request("POST", "/v1/chat/completions", self.body(stream), self.headers)
            response = connection.getresponse()
        except ConnectionRefusedError as error:
            raise Failure("connection_refused", str(error)) from error
        except ConnectionResetError as error:
            stale = isinstance(error, STALE_CONNECTION_ERRORS)
            raise Failure("connection_reset", str(error), stale) from error
        except (TimeoutError, socket.timeout) as error:
            raise Failure("timeout", str(error)) from error
        except (OSError, http.client.HTTPException) as error:
            stale = isinstance(error, STALE_CONNECTION_ERRORS)
            raise Failure("transport_error", repr(error), stale) from error
        # The proxy marks every answer it forwards and hides the engine's own mark.
        path = response.getheader(PATH_HEADER) or "direct"
        if response.status != 200:
            detail = response.read(300).decode("utf-8", "replace")
            raise Failure("http_%d" % response.status, detail)
        try:
            if not stream:
                payload = json.loads(response.read())
                if not payload.get("choices"):
                    raise Failure("bad_response", "no choices in the completion")
                return path, None, response.will_close
            return path, self.read_stream(response, began), response.will_close
        except (OSError, http.client.HTTPException, ValueError) as error:
            raise Failure("response_cut", repr(error)) from error

    @staticmethod
    def read_stream(response, began):
        ttft = None
        done = False
        while True:
            line = response.readline()
            if not line:
                break
            line = line.rstrip(b"\r\n")
            if line.startswith(b"data: ") and ttft is None:
                ttft = time.monotonic() - began
            if line == DONE_EVENT:
                done = True
        if not done:
            raise Failure("stream_incomplete", "the stream ended before [DONE]")
        return ttft


def closed_by_peer(connection):
    """Whether the server closed (or wrote on) an idle connection: as httpx and urllib3 look
    before they reuse one, so a close that arrived in time costs the request nothing."""
    sock = connection.sock
    if sock is None:
        return True
    readable = select.select([sock], [], [], 0)[0]
    return bool(readable)


class ConnectionPool:
    """One worker's keep-alive connections, as an httpx client (or aiohttp session) keeps them:
    per target, the idle connection is reused while the server keeps it alive and it has been
    idle no longer than the expiry; one that failed or that the answer closed is dropped. A
    worker sends one request at a time, so it holds at most one connection per target."""

    def __init__(self, client, recorder, keepalive_expiry):
        self.client = client
        self.recorder = recorder
        self.keepalive_expiry = keepalive_expiry
        self.idle = {}  # target -> (connection, monotonic time it became idle)

    def checkout(self, target):
        """(connection, whether it is a reused one)"""
        connection, idle_since = self.idle.pop(target, (None, 0.0))
        if connection is not None:
            if time.monotonic() - idle_since <= self.keepalive_expiry and not closed_by_peer(
                connection
            ):
                return connection, True
            connection.close()
        return self.client.connect(target), False

    def request(self, target, stream):
        """Client.request on a pooled connection to target; the same result and failures."""
        connection, reused = self.checkout(target)
        try:
            return self.send(target, connection, stream)
        except Failure as error:
            # A reused connection the server closed while idle fails before any answer;
            # pooling clients send the request again, once, on a new connection. Anything
            # else, or the new connection failing too, is a failure.
            if not (reused and error.stale):
                raise
        self.recorder.stale_retry()
        return self.send(target, self.client.connect(target), stream)

    def send(self, target, connection, stream):
        """Client.request; the connection goes back to the pool if the server keeps it alive."""
        try:
            path, ttft, closed = self.client.request(connection, stream)
        except Failure:
            connection.close()
            raise
        if closed:
            connection.close()
        else:
            self.idle[target] = (connection, time.monotonic())
        return path, ttft, closed

    def close(self):
        for connection, _idle_since in self.idle.values():
            connection.close()
        self.idle.clear()


class RateLimiter:
    """Spaces requests evenly across all workers; rate 0 means no limit."""

    def __init__(self, rate):
        self.interval = 1.0 / rate if rate > 0 else 0.0
        self.lock = threading.Lock()
        self.next_slot = time.monotonic()

    def wait(self, stopping):
        if not self.interval:
            return
        with self.lock:
            slot = max(self.next_slot, time.monotonic())
            self.next_slot = slot + self.interval
        delay = slot - time.monotonic()
        if delay > 0:
            stopping.wait(delay)


def worker(index, args, client, recorder, limiter, stopping, deadline):
    targets = itertools.islice(itertools.cycle(args.target), index, None)
    counter = itertools.count(index)

    def send(target, request):
        """One request through `request(stream)`, recorded; False when it failed."""
        stream = (next(counter) % 100) < args.stream_percent
        began_wall = time.time()
        began = time.monotonic()
        try:
            path, ttft, closed = request(stream)
        except Failure as error:
            recorder.failure(target, began_wall, error)
            return False
        ended = time.monotonic()
        recorder.success(
            target, path, began_wall, began_wall + (ended - began), ttft, stream, closed
        )
        return True

    pool = None
    if args.connection_mode == "pooled":
        pool = ConnectionPool(client, recorder, args.keepalive_expiry)
    try:
        while not stopping.is_set() and time.monotonic() < deadline:
            limiter.wait(stopping)
            if stopping.is_set():
                return
            target = next(targets)
            if pool is not None:
                send(target, functools.partial(pool.request, target))
                continue
            connection = client.connect(target)
            try:
                for _request in range(args.requests_per_connection):
                    if not send(target, functools.partial(client.request, connection)):
                        break
                    if stopping.is_set():
                        break
            finally:
                connection.close()
    finally:
        if pool is not None:
            pool.close()


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument(
        "--target",
        action="append",
        type=parse_target,
        required=True,
        help="HOST:PORT of a node's service port; repeat for several nodes",
    )
    parser.add_argument("--api-key-file", help="file whose first line is the API key")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="requests per second for all workers together (0: no limit)",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds (upper bound)")
    parser.add_argument("--stop-file", help="stop once this file exists")
    parser.add_argument(
        "--stream-percent",
        type=int,
        default=30,
        help="share of requests sent with stream=true, 0..100",
    )
    parser.add_argument(
        "--connection-mode",
        choices=CONNECTION_MODES,
        default="per-request",
        help="per-request: a new connection for each --requests-per-connection requests; "
        "pooled: each worker keeps its connections alive like an httpx client",
    )
    parser.add_argument("--requests-per-connection", type=int, default=1)
    parser.add_argument(
        "--keepalive-expiry",
        type=float,
        default=5.0,
        help="pooled: seconds a connection may sit idle and still be reused (httpx's default)",
    )
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--model", required=True, help="model name the engines serve")
    parser.add_argument("--timeout", type=float, default=30.0)
    parser.add_argument("--tls", action="store_true")
    parser.add_argument("--ca-file")
    parser.add_argument("--insecure", action="store_true", help="do not verify TLS certificates")
    parser.add_argument("--summary", required=True, help="JSON summary path")
    args = parser.parse_args(argv)
    if not 0 <= args.stream_percent <= 100:
        parser.error("--stream-percent must be within 0..100")
    if args.concurrency < 1 or args.requests_per_connection < 1:
        parser.error("--concurrency and --requests-per-connection must be at least 1")
    if args.duration <= 0:
        parser.error("--duration must be positive")
    if args.keepalive_expiry < 0:
        parser.error("--keepalive-expiry must not be negative")
    if args.connection_mode == "pooled" and args.requests_per_connection != 1:
        # A pool reuses a connection for as long as the server keeps it alive.
        parser.error("--requests-per-connection applies to --connection-mode per-request only")
    return args


def main(argv=None):
    args = parse_args(argv)
    client = Client(args)
    started = time.time()
    recorder = Recorder(started, args.connection_mode)
    stopping = threading.Event()
    deadline = time.monotonic() + args.duration

    def stop(_signum, _frame):
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)

    limiter = RateLimiter(args.rate)
    threads = [
        threading.Thread(
            target=worker,
            args=(i, args, client, recorder, limiter, stopping, deadline),
            daemon=True,
        )
        for i in range(args.concurrency)
    ]
    for thread in threads:
        thread.start()
    while any(thread.is_alive() for thread in threads):
        if args.stop_file and os.path.exists(args.stop_file):
            stopping.set()
        write_atomically(args.summary, recorder.summary(time.time(), finished=False))
        for thread in threads:
            thread.join(timeout=1.0 / len(threads))
    summary = recorder.summary(time.time(), finished=True)
    write_atomically(args.summary, summary)
    print(json.dumps({k: summary[k] for k in ("requests_ok", "requests_failed", "paths")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
