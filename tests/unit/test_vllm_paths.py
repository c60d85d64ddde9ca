"""vLLM's path allowlist (roles/model_engine/files/zerolayer_vllm_paths.py), every row of its
policy, driven as the ASGI server drives it; and the settings check's port probe. The real
vLLM runs both in tests/playbooks/test_vllm_engine.py."""

import asyncio
import importlib.util
import json
import socket
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[2] / "roles/model_engine/files"
KEY = "sk-unit-test-key-0001"
OWN_PORT = 8101
SERVICE_PORT = 8000
API_PATHS = "/v1/models /v1/chat/completions /v1/completions"


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
    }
    for key in ("sk-first-key-000001", "sk-second-key-00002"):
        assert serve("/v1/models", SERVICE_PORT, key, environ=environ)[0] == 200
    assert serve("/v1/models", SERVICE_PORT, KEY, environ=environ)[0] == 401


def test_no_key_configured_asks_for_none():
    environ = {"ZEROLAYER_API_PATHS": API_PATHS, "ZEROLAYER_ENGINE_PORT": str(OWN_PORT)}
    assert serve("/v1/models", SERVICE_PORT, environ=environ)[0] == 200
    assert serve("/tokenize", SERVICE_PORT, environ=environ)[0] == 404


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
