"""vLLM's path allowlist (roles/model_engine/files/zerolayer_vllm_paths.py), every row of its
policy, driven as the ASGI server drives it; its sending away of direct connections after a
lowered weight (the server's side with real uvicorn: test_vllm_paths_uvicorn.py); and the
settings check's port probe. The real vLLM runs both in tests/playbooks/test_vllm_engine.py."""

import asyncio
import importlib.util
import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[4] / "roles/model_engine/files"
KEY = "sk-unit-test-key-0001"
OWN_PORT = 8101
SERVICE_PORT = 8000
API_PATHS = "/v1/models /v1/chat/completions /v1/completions"
# Where no marker is: the older tests must not read the host's.
NO_MARKER = "/nonexistent/zerolayer-direct-drain.json"


# The middleware imports zerolayer_direct_drain from beside it, as vLLM's PYTHONPATH has it.
if str(FILES) not in sys.path:
    sys.path.insert(0, str(FILES))


def load(name):
    spec = importlib.util.spec_from_file_location(name, FILES / ("%s.py" % name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


paths = load("zerolayer_vllm_paths")
check = load("zerolayer_vllm_check")


def serve(path, port, key=None, method="GET", environ=None):
    """(status, body) of one request through the middleware; status 200 when it passed the
    request on to vLLM."""
    environ = environ or {
        "ZEROLAYER_API_PATHS": API_PATHS,
        "ZEROLAYER_ENGINE_PORT": str(OWN_PORT),
        "VLLM_API_KEY": KEY,
        "ZEROLAYER_DIRECT_DRAIN_FILE": NO_MARKER,
    }
    passed = []

    async def vllm(scope, receive, send):
        passed.append(scope["path"])

    middleware = paths.ServedPathsOnly(vllm, environ)
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    headers = [(b"authorization", ("Bearer %s" % key).encode())] if key else []
    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": headers,
        "server": ("10.89.213.11", port),
    }
    asyncio.run(middleware(scope, receive, send))
    if passed:
        return 200, None
    return sent[0]["status"], json.loads(sent[1]["body"])


def collect_into(sent):
    async def send(message):
        sent.append(message)

    return send


def test_every_answer_names_the_engine():
    environ = {
        "ZEROLAYER_API_PATHS": API_PATHS,
        "ZEROLAYER_ENGINE_PORT": str(OWN_PORT),
        "ZEROLAYER_ENGINE_NAME": "chat_v2",
        "ZEROLAYER_DIRECT_DRAIN_FILE": NO_MARKER,
    }

    async def vllm(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"a", b"b")]})
        await send({"type": "http.response.body", "body": b"{}"})

    for path in ("/v1/models", "/tokenize"):
        sent = []
        scope = {"type": "http", "method": "GET", "path": path, "headers": [],
                 "server": ("10.89.213.11", SERVICE_PORT)}  # fmt: skip
        asyncio.run(paths.ServedPathsOnly(vllm, environ)(scope, None, collect_into(sent)))
        assert (b"x-zerolayer-engine-name", b"chat_v2") in sent[0]["headers"], (path, sent)


@pytest.mark.parametrize("port", [OWN_PORT, SERVICE_PORT])
@pytest.mark.parametrize("path", ["/v1/models", "/v1/chat/completions", "/v1/completions"])
def test_api_paths_want_the_key_on_both_ports(path, port):
    assert serve(path, port, KEY)[0] == 200
    assert serve(path, port) == (401, {"error": "Unauthorized"})
    assert serve(path, port, "sk-wrong-key-000001")[0] == 401


@pytest.mark.parametrize("port", [OWN_PORT, SERVICE_PORT])
@pytest.mark.parametrize(
    "path", ["/invocations", "/tokenize", "/version", "/load", "/docs", "/v1/responses", "/"]
)
def test_every_other_path_is_not_found_key_or_not(path, port):
    assert serve(path, port)[0] == 404
    assert serve(path, port, KEY)[0] == 404


@pytest.mark.parametrize("path", ["/health", "/metrics"])
def test_operations_paths_answer_only_on_the_engines_own_port_behind_the_key(path):
    assert serve(path, OWN_PORT, KEY)[0] == 200
    assert serve(path, OWN_PORT) == (401, {"error": "Unauthorized"})
    assert serve(path, OWN_PORT, "sk-wrong-key-000001")[0] == 401
    assert serve(path, SERVICE_PORT)[0] == 404
    assert serve(path, SERVICE_PORT, KEY)[0] == 404


def test_several_keys_come_from_zerolayer_api_keys():
    environ = {
        "ZEROLAYER_API_PATHS": API_PATHS,
        "ZEROLAYER_ENGINE_PORT": str(OWN_PORT),
        "ZEROLAYER_API_KEYS": "sk-first-key-000001 sk-second-key-00002",
        "ZEROLAYER_DIRECT_DRAIN_FILE": NO_MARKER,
    }
    for key in ("sk-first-key-000001", "sk-second-key-00002"):
        assert serve("/v1/models", SERVICE_PORT, key, environ=environ)[0] == 200
    assert serve("/v1/models", SERVICE_PORT, KEY, environ=environ)[0] == 401


def test_no_key_configured_asks_for_none():
    environ = {
        "ZEROLAYER_API_PATHS": API_PATHS,
        "ZEROLAYER_ENGINE_PORT": str(OWN_PORT),
        "ZEROLAYER_DIRECT_DRAIN_FILE": NO_MARKER,
    }
    assert serve("/v1/models", SERVICE_PORT, environ=environ)[0] == 200
    assert serve("/tokenize", SERVICE_PORT, environ=environ)[0] == 404


# --- Direct connections sent away after a lowered weight (zerolayer_direct_drain) ---


def write_marker(path, marker):
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(marker))
    os.replace(temporary, path)


def weight_zero(since_unix):
    return {"version": 1, "all": {"since_unix": since_unix, "epoch": 1, "reason": "test"},
            "ports": {}}  # fmt: skip


def drain_environ(marker_file, grace_s="0.5"):
    return {
        "ZEROLAYER_API_PATHS": API_PATHS,
        "ZEROLAYER_ENGINE_PORT": str(OWN_PORT),
        "ZEROLAYER_DIRECT_DRAIN_FILE": str(marker_file),
        "ZEROLAYER_DIRECT_IDLE_GRACE_S": grace_s,
    }


class FakeProtocol:
    """uvicorn's HttpToolsProtocol/H11Protocol as far as the middleware uses it."""

    def __init__(self, transport):
        self.transport = transport
        self.shutdowns = 0

    def shutdown(self):
        self.shutdowns += 1
        self.transport.closing = True


class FakeTransport:
    def __init__(self):
        self.closing = False
        self.protocol = FakeProtocol(self)

    def is_closing(self):
        return self.closing

    def get_protocol(self):
        return self.protocol


class FakeCycle:
    """uvicorn's RequestResponseCycle: its receive is the bound method the app is given."""

    def __init__(self, transport):
        self.transport = transport

    async def receive(self):
        return {"type": "http.request", "body": b"", "more_body": False}


def respond(middleware, port, receive=None, app_headers=(), during=None):
    """The headers of the response the middleware sends for one request on `port`, answered
    by an app that sends app_headers (and calls during() while it is in flight)."""
    sent = []

    async def vllm(scope, receive, send):
        if during is not None:
            during()
        await send({"type": "http.response.start", "status": 200, "headers": list(app_headers)})
        await send({"type": "http.response.body", "body": b"{}"})

    async def request():
        scope = {"type": "http", "method": "GET", "path": "/v1/models", "headers": [],
                 "server": ("10.89.213.11", port)}  # fmt: skip
        await middleware(scope, receive, collect_into(sent))

    middleware.app = vllm

    asyncio.run(request())
    return sent[0]["headers"]


def closes(headers):
    return [value for name, value in headers if name == b"connection"] == [b"close"]


def test_weight_zero_closes_direct_connections_only(tmp_path):
    marker = tmp_path / "drain.json"
    write_marker(marker, weight_zero(time.time()))
    middleware = paths.ServedPathsOnly(None, drain_environ(marker))
    assert closes(respond(middleware, SERVICE_PORT))
    # The proxy's connections, to the engine's own port, are never touched.
    assert not closes(respond(middleware, OWN_PORT))
    # An app's own "Connection: close" is not doubled.
    assert closes(respond(middleware, SERVICE_PORT, app_headers=[(b"connection", b"close")]))
    assert middleware.sent_away["response"] == 1  # the app's own close is not counted


def test_no_marker_closes_nothing(tmp_path):
    middleware = paths.ServedPathsOnly(None, drain_environ(tmp_path / "absent.json"))
    assert not closes(respond(middleware, SERVICE_PORT))
    assert middleware.sent_away == {"response": 0, "idle": 0}


def test_a_raised_weight_keeps_connections_made_after_the_lowering(tmp_path):
    marker = tmp_path / "drain.json"
    lowered = time.time() - 10
    write_marker(
        marker,
        {
            "version": 1,
            "all": {"since_unix": lowered, "epoch": 1, "reason": "fast rollback"},
            "ports": {
                str(SERVICE_PORT): {"since_unix": lowered, "updated_unix": lowered + 5,
                                    "weight_bp": 5000, "epoch": 2, "reason": "canary"},
            },
        },
    )  # fmt: skip
    middleware = paths.ServedPathsOnly(None, drain_environ(marker))
    new = FakeTransport()
    assert not closes(respond(middleware, SERVICE_PORT, FakeCycle(new).receive))
    # A connection first seen before the lowering still leaves.
    old = FakeTransport()
    respond(middleware, SERVICE_PORT, FakeCycle(old).receive)
    middleware.direct[id(old)].first_seen_unix = lowered - 1
    assert closes(respond(middleware, SERVICE_PORT, FakeCycle(old).receive))
    assert not closes(respond(middleware, SERVICE_PORT, FakeCycle(new).receive))


def test_idle_direct_connections_are_shut_down_through_the_servers_protocol(tmp_path):
    marker = tmp_path / "drain.json"
    middleware = paths.ServedPathsOnly(None, drain_environ(marker, grace_s="0"))
    idle, busy, proxied = FakeTransport(), FakeTransport(), FakeTransport()
    respond(middleware, SERVICE_PORT, FakeCycle(idle).receive)
    respond(middleware, OWN_PORT, FakeCycle(proxied).receive)
    assert set(middleware.direct) == {id(idle)}  # the proxy's connection is not tracked
    middleware.close_idle_direct()
    assert idle.protocol.shutdowns == 0  # no marker yet

    write_marker(marker, weight_zero(time.time()))
    time.sleep(0.06)  # past the marker's recheck interval

    def sweep_while_in_flight():
        middleware.close_idle_direct()
        assert busy.protocol.shutdowns == 0

    respond(middleware, SERVICE_PORT, FakeCycle(busy).receive, during=sweep_while_in_flight)
    middleware.close_idle_direct()
    assert (idle.protocol.shutdowns, busy.protocol.shutdowns) == (1, 1)
    assert proxied.protocol.shutdowns == 0
    # Closed connections are forgotten, and none is shut down twice.
    middleware.close_idle_direct()
    assert middleware.direct == {}
    assert middleware.sent_away["idle"] == 2


def test_idle_connections_within_the_grace_stay(tmp_path):
    marker = tmp_path / "drain.json"
    write_marker(marker, weight_zero(time.time()))
    middleware = paths.ServedPathsOnly(None, drain_environ(marker, grace_s="30"))
    transport = FakeTransport()
    respond(middleware, SERVICE_PORT, FakeCycle(transport).receive)
    middleware.close_idle_direct()
    assert transport.protocol.shutdowns == 0


def test_another_servers_connection_gets_the_header_and_nothing_raises(tmp_path):
    marker = tmp_path / "drain.json"
    write_marker(marker, weight_zero(time.time()))
    middleware = paths.ServedPathsOnly(None, drain_environ(marker))

    class Odd:
        transport = object()  # no is_closing, no get_protocol

        async def receive(self):
            return {"type": "http.request", "body": b""}

    assert closes(respond(middleware, SERVICE_PORT, Odd().receive))
    assert middleware.direct == {}


def test_a_taken_port_is_named_with_the_engine():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    try:
        port = holder.getsockname()[1]
        problems = check.port_problems("chat", "127.0.0.1:%d" % port)
    finally:
        holder.close()
    assert problems == [
        "engine chat: port %d is already taken on this node: Address already in use" % port
    ]
    assert check.port_problems("chat", "127.0.0.1:%d" % port) == []


def test_a_missing_model_directory_is_named_before_anything_is_imported(tmp_path):
    missing = tmp_path / "absent"
    assert check.model_problems("chat", str(missing)) == [
        "engine chat: model directory %s does not exist" % missing
    ]
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    problems = check.model_problems("chat", str(tmp_path / "broken"))
    assert len(problems) == 1 and "is not a readable model config" in problems[0], problems
