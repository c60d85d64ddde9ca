"""ASGI middleware for vLLM (--middleware zerolayer_vllm_paths.ServedPathsOnly): the engine
answers the service's API paths and nothing else.

vLLM checks API keys only under /v1, /v2, /inference and /cohere, so without this a client
reaches /invocations, /tokenize, /load or /version with no key at all, on the engine's own
port and, through the router, on the service port. The policy, the same as the simulator's
and the proxy's (roles/model_engine and roles/legacy_proxy):

- a connection the router handed over from the service port (its local port is not the
  engine's own): the paths in ZEROLAYER_API_PATHS, behind the key; anything else is 404;
- a connection to the engine's own port (the proxy, Prometheus, the drain): the same
  paths and /health and /metrics, all behind the key; anything else is 404.

So nothing answers but 401 or 404 without a key, on either port.

The keys are the engine's own: with several, the file named by ZEROLAYER_API_KEYS_FILE,
which zerolayer_vllm_serve.py reads for vLLM too (a file that cannot be read or holds no key
stops the engine from starting); with one, VLLM_API_KEY, as vLLM reads it. ZEROLAYER_API_KEYS
(several, separated by spaces) is still read where a unit sets it. No key configured means
no key is asked for.

Every answer also names the engine (X-Zerolayer-Engine-Name, from ZEROLAYER_ENGINE_NAME), as
the simulator's do: an engine upgrade checks by it that new connections reach the new one.

Direct connections the node's drain marker sends away (zerolayer_direct_drain, after a
weight was lowered) leave gracefully, as the simulator's do: a response on one carries
"Connection: close" (a stream still runs to its end), and one idle for the grace is closed
through uvicorn's own per-connection shutdown(). Under a server that is not uvicorn only
the header is sent. Connections to the engine's own port (the proxy) are never touched.
"""

import asyncio
import hashlib
import hmac
import json
import logging
import os
import time

import zerolayer_direct_drain
import zerolayer_vllm_serve

UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()
NOT_FOUND = json.dumps(
    {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}}
).encode()
# What the engine's own port answers besides the API paths, behind the same key: Prometheus
# scrapes and the drain's reading of the queue.
OPERATIONS_PATHS = frozenset(("/health", "/metrics"))
ENGINE_NAME_HEADER = b"x-zerolayer-engine-name"
CONNECTION_CLOSE = (b"connection", b"close")
# How often idle direct connections are looked at; the marker file itself is read again at
# most every zerolayer_direct_drain.RECHECK_S.
SWEEP_S = 0.1

log = logging.getLogger(__name__)


def configured_keys(environ):
    if environ.get(zerolayer_vllm_serve.KEYS_FILE_VARIABLE):
        keys = zerolayer_vllm_serve.read_keys(environ[zerolayer_vllm_serve.KEYS_FILE_VARIABLE])
    else:
        keys = environ.get("ZEROLAYER_API_KEYS", "").split() or [environ.get("VLLM_API_KEY", "")]
    # Compared as digests, so the time taken says nothing about a key's length.
    return [hashlib.sha256(key.encode()).digest() for key in keys if key]


def bearer_token(headers):
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _space, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


def says_close(headers):
    return any(
        name.lower() == b"connection"
        and b"close" in [token.strip() for token in value.lower().split(b",")]
        for name, value in headers
    )


def uvicorn_connection(receive):
    """(transport, protocol) of the connection a request came on, or None when the server
    is not uvicorn (or one whose internals changed). ASGI hands out no transport: uvicorn's
    receive is a bound method of its RequestResponseCycle, which holds it, and its protocol
    has the graceful shutdown() that uvicorn itself calls on every connection as it stops."""
    transport = getattr(getattr(receive, "__self__", None), "transport", None)
    if not callable(getattr(transport, "is_closing", None)):
        return None
    try:
        protocol = transport.get_protocol()
    except Exception:  # another server's transport: the header alone then
        return None
    if not callable(getattr(protocol, "shutdown", None)):
        return None
    return transport, protocol


class DirectConnection:
    """A direct connection's state between its requests."""

    def __init__(self, transport, protocol, port):
        self.transport = transport
        self.protocol = protocol
        self.port = port
        # The router decided it at its SYN; its first request is the nearest we can see.
        self.first_seen_unix = time.time()
        self.idle_since = time.monotonic()
        self.in_flight = 0
        self.sent_away = False


class ServedPathsOnly:
    def __init__(self, app, environ=None):
        environ = os.environ if environ is None else environ
        self.app = app
        self.api_paths = frozenset(environ["ZEROLAYER_API_PATHS"].split())
        self.own_port = int(environ["ZEROLAYER_ENGINE_PORT"])
        self.keys = configured_keys(environ)
        self.engine_name = environ.get("ZEROLAYER_ENGINE_NAME", "").encode("latin-1")
        self.marker = zerolayer_direct_drain.MarkerFile(
            environ.get("ZEROLAYER_DIRECT_DRAIN_FILE", zerolayer_direct_drain.DEFAULT_MARKER_FILE)
        )
        self.idle_grace_s = float(
            environ.get(
                "ZEROLAYER_DIRECT_IDLE_GRACE_S", zerolayer_direct_drain.DEFAULT_IDLE_GRACE_S
            )
        )
        # Direct connections by id(transport). An entry holds its transport, so the id is
        # not reused while it is here; closed ones are forgotten by the sweep.
        self.direct = {}
        self.sweeper = None
        # What was sent away: by a response's "Connection: close", or closed while idle.
        self.sent_away = {"response": 0, "idle": 0}

    def key_accepted(self, headers):
        if not self.keys:
            return True
        token = bearer_token(headers)
        if token is None:
            return False
        digest = hashlib.sha256(token.encode()).digest()
        return any(hmac.compare_digest(digest, key) for key in self.keys)

    def verdict(self, scope):
        """None to pass the request on, else the (status, body) to answer with."""
        path = scope.get("path", "")
        server = scope.get("server") or (None, None)
        on_own_port = server[1] == self.own_port
        served = path in self.api_paths or (on_own_port and path in OPERATIONS_PATHS)
        if not served:
            return 404, NOT_FOUND
        if self.key_accepted(scope.get("headers", ())):
            return None
        return 401, UNAUTHORIZED

    def track(self, port, receive):
        """The registry's entry for a direct request's connection, registered on its first
        request; None when the server's connection cannot be found."""
        found = uvicorn_connection(receive)
        if found is None:
            return None
        transport, protocol = found
        connection = self.direct.get(id(transport))
        if connection is None:
            connection = self.direct[id(transport)] = DirectConnection(transport, protocol, port)
        self.start_sweeper()
        return connection

    def start_sweeper(self):
        # Lazily, in the server's running loop: there is none when the middleware is made.
        loop = asyncio.get_running_loop()
        if self.sweeper is None or self.sweeper.done() or self.sweeper.get_loop() is not loop:
            self.sweeper = loop.create_task(self.sweep())

    async def sweep(self):
        while True:
            await asyncio.sleep(SWEEP_S)
            try:
                self.close_idle_direct()
            except Exception:  # a bug here must not stop the sweep, nor reach the server
                log.exception("closing idle direct connections failed")

    def close_idle_direct(self):
        """Closes the idle direct connections the marker sends away, as uvicorn closes
        every connection when it stops: shutdown() closes one with no request in flight,
        and lets one that has a request finish it first."""
        marker = self.marker.current()
        now = time.monotonic()
        for key, connection in list(self.direct.items()):
            if connection.transport.is_closing():
                del self.direct[key]
            elif not connection.sent_away and zerolayer_direct_drain.close_idle_now(
                marker,
                connection.port,
                connection.first_seen_unix,
                connection.in_flight,
                now - connection.idle_since,
                self.idle_grace_s,
            ):
                connection.sent_away = True
                self.sent_away["idle"] += 1
                connection.protocol.shutdown()

    def must_leave(self, port, connection):
        # Without the connection its age is unknown: taken as now, so only a weight of 0
        # (or a lowering just now) sends it away.
        first_seen = time.time() if connection is None else connection.first_seen_unix
        return zerolayer_direct_drain.must_leave(self.marker.current(), port, first_seen)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        port = (scope.get("server") or (None, None))[1]
        direct = port != self.own_port
        connection = self.track(port, receive) if direct else None

        async def send_named(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                if self.engine_name:
                    headers.append((ENGINE_NAME_HEADER, self.engine_name))
                # uvicorn closes the connection after a response that says so.
                if direct and not says_close(headers) and self.must_leave(port, connection):
                    headers.append(CONNECTION_CLOSE)
                    self.sent_away["response"] += 1
                message = dict(message, headers=headers)
            await send(message)

        if connection is None:
            await self.answer(scope, receive, send_named)
            return
        connection.in_flight += 1
        try:
            await self.answer(scope, receive, send_named)
        finally:
            connection.in_flight -= 1
            connection.idle_since = time.monotonic()

    async def answer(self, scope, receive, send_named):
        verdict = self.verdict(scope)
        if verdict is None:
            await self.app(scope, receive, send_named)
            return
        status, body = verdict
        await send_named(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send_named({"type": "http.response.body", "body": body})
