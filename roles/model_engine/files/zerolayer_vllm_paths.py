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

The keys come from the unit's environment as vLLM reads them (VLLM_API_KEY, or
ZEROLAYER_API_KEYS for several); no key configured means no key is asked for.

Every answer also names the engine (X-Zerolayer-Engine-Name, from ZEROLAYER_ENGINE_NAME), as
the simulator's do: an engine upgrade checks by it that new connections reach the new one.
"""

import hashlib
import hmac
import json
import os

UNAUTHORIZED = json.dumps({"error": "Unauthorized"}).encode()
NOT_FOUND = json.dumps(
    {"error": {"message": "Not Found", "type": "NotFoundError", "code": 404}}
).encode()
# What the engine's own port answers besides the API paths, behind the same key: Prometheus
# scrapes and the drain's reading of the queue.
OPERATIONS_PATHS = frozenset(("/health", "/metrics"))
ENGINE_NAME_HEADER = b"x-zerolayer-engine-name"


def configured_keys(environ):
    keys = environ.get("ZEROLAYER_API_KEYS", "").split() or [environ.get("VLLM_API_KEY", "")]
    # Compared as digests, so the time taken says nothing about a key's length.
    return [hashlib.sha256(key.encode()).digest() for key in keys if key]


def bearer_token(headers):
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _space, token = value.decode("latin-1").partition(" ")
            return token.strip() if scheme.lower() == "bearer" else None
    return None


class ServedPathsOnly:
    def __init__(self, app, environ=None):
        environ = os.environ if environ is None else environ
        self.app = app
        self.api_paths = frozenset(environ["ZEROLAYER_API_PATHS"].split())
        self.own_port = int(environ["ZEROLAYER_ENGINE_PORT"])
        self.keys = configured_keys(environ)
        self.engine_name = environ.get("ZEROLAYER_ENGINE_NAME", "").encode("latin-1")

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

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_named(message):
            if message["type"] == "http.response.start" and self.engine_name:
                headers = list(message.get("headers", ()))
                headers.append((ENGINE_NAME_HEADER, self.engine_name))
                message = dict(message, headers=headers)
            await send(message)

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
