"""Verify the legacy proxy (real nginx) in front of the CPU engine simulator.

The engine is the simulator (a test double for a GPU engine); nginx, systemd, TLS and the
sockets are real. Requests are made inside the node with curl, verifying the certificate.
"""

import json
import shlex

import pytest

KEYS = ("sk-molecule-proxy-key-0001", "sk-molecule-proxy-key-0002.With+Odd/Chars=")
SERVICE_PORT = 8000
ENGINE_PORT = 8101
CA = "/etc/nginx/zerolayer/tls.crt"
ADMIN_FILE = "/etc/zerolayer/engines/chat_sim/sim-admin.json"
UNAUTHORIZED = '{"error":"Unauthorized"}'
NOT_FOUND = '{"error":{"message":"Not Found","type":"NotFoundError","code":404}}'
# The role's default legacy_proxy_api_paths, with a request each.
API_REQUESTS = {
    "/v1/models": ("-X", "GET"),
    "/v1/chat/completions": (
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"model":"zerolayer/sim-chat-8b","messages":[{"role":"user","content":"hi"}]}',
    ),
    "/v1/completions": (
        "-H",
        "Content-Type: application/json",
        "-d",
        '{"model":"zerolayer/sim-chat-8b","prompt":"hi"}',
    ),
}
# Engine routes that are not the service's API: vLLM serves the first ones without a key
# (its key check covers only /v1, /v2, /inference, /cohere), the simulator the last two.
NOT_THE_API = (
    "/invocations",
    "/tokenize",
    "/detokenize",
    "/load",
    "/version",
    "/docs",
    "/metrics",
    "/health",
    "/v1/embeddings",
    "/v1/models/",
)


def request(host, port, path, *options, authorization=None):
    """Status, headers (name -> list of values) and body of an HTTPS request in the node."""
    argv = ["curl", "-sS", "-i", "--max-time", "60", "--cacert", CA]
    if authorization is not None:
        argv += ["-H", "Authorization: " + authorization]
    argv += [*options, "https://127.0.0.1:%d%s" % (port, path)]
    result = host.run(" ".join(shlex.quote(part) for part in argv))
    assert result.rc == 0, result.stderr
    head, _sep, body = result.stdout.replace("\r\n", "\n").partition("\n\n")
    lines = head.splitlines()
    headers = {}
    for line in lines[1:]:
        name, _sep, value = line.partition(":")
        headers.setdefault(name.strip().lower(), []).append(value.strip())
    return int(lines[0].split()[1]), headers, body


def chat(host, port=SERVICE_PORT, stream=False, key=KEYS[0], authorization=None):
    body = json.dumps(
        {
            "model": "zerolayer/sim-chat-8b",
            "stream": stream,
            "messages": [{"role": "user", "content": "through the proxy"}],
        }
    )
    if authorization is None and key is not None:
        authorization = "Bearer " + key
    return request(
        host,
        port,
        "/v1/chat/completions",
        "-N",
        "-H",
        "Content-Type: application/json",
        "-d",
        body,
        authorization=authorization,
    )


def write_admin_file(host, content):
    result = host.run(
        "printf '%%s' %s > %s.tmp && mv %s.tmp %s", content, ADMIN_FILE, ADMIN_FILE, ADMIN_FILE
    )
    assert result.rc == 0, result.stderr


def test_nginx_runs_and_keeps_the_service_port(host):
    nginx = host.service("nginx")
    assert nginx.is_running and nginx.is_enabled
    assert host.socket("tcp://0.0.0.0:%d" % SERVICE_PORT).is_listening
    owner = host.run("ss -Hltnp 'sport = :%d'" % SERVICE_PORT).stdout
    assert '"nginx"' in owner


def test_configuration_is_valid_and_root_only(host):
    config = host.file("/etc/nginx/nginx.conf")
    assert (config.user, config.mode) == ("root", 0o600)
    assert host.run("nginx -t").rc == 0
    key = host.file("/etc/nginx/zerolayer/tls.key")
    assert (key.user, key.mode) == ("root", 0o600)


def test_healthz_answers_on_the_proxy(host):
    status, headers, body = request(host, SERVICE_PORT, "/healthz")
    assert (status, body) == (200, "ok\n")
    assert headers["x-zerolayer-path"] == ["proxy"]


@pytest.mark.parametrize("key", KEYS)
def test_completion_is_forwarded_with_each_key(host, key):
    status, headers, body = chat(host, key=key)
    assert status == 200
    # The engine's own "direct" is replaced, not joined.
    assert headers["x-zerolayer-path"] == ["proxy"]
    assert headers["x-zerolayer-engine"] == ["simulator"]
    assert json.loads(body)["usage"]["completion_tokens"] == 8


def test_streaming_through_the_proxy(host):
    status, headers, body = chat(host, stream=True)
    assert status == 200
    assert headers["x-zerolayer-path"] == ["proxy"]
    assert headers["content-type"][0].startswith("text/event-stream")
    events = [block[len("data: ") :] for block in body.split("\n\n") if block.startswith("data: ")]
    assert events[-1] == "[DONE]"
    text = "".join(
        json.loads(event)["choices"][0]["delta"].get("content", "") for event in events[:-1]
    )
    assert len(text.split()) == 8


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer sk-molecule-proxy-key-9999",
        "bearer " + KEYS[0],
        "Bearer " + KEYS[0].upper(),
        "Bearer " + KEYS[1].replace(".", "x"),
        "Bearer " + KEYS[0] + "0",
    ],
)
def test_bad_keys_get_the_same_401_on_both_paths(host, authorization):
    via_proxy = chat(host, key=None, authorization=authorization)
    direct = chat(host, port=ENGINE_PORT, key=None, authorization=authorization)
    assert via_proxy[0] == direct[0] == 401
    assert via_proxy[2] == direct[2] == UNAUTHORIZED
    assert via_proxy[1]["content-type"] == direct[1]["content-type"] == ["application/json"]
    assert via_proxy[1]["x-zerolayer-path"] == ["proxy"]
    assert direct[1]["x-zerolayer-path"] == ["direct"]


def test_direct_path_serves_the_same_certificate(host):
    script = (
        "import ssl; print(ssl.get_server_certificate(('127.0.0.1', %d)) == "
        "ssl.get_server_certificate(('127.0.0.1', %d)))" % (SERVICE_PORT, ENGINE_PORT)
    )
    assert host.run("python3 -c %s" % shlex.quote(script)).stdout.strip() == "True"
    assert chat(host, port=ENGINE_PORT)[0] == 200
    plain = host.run("curl -sS --max-time 10 http://127.0.0.1:%d/health" % ENGINE_PORT)
    assert plain.rc != 0


def test_engine_keys_and_certificate_are_private(host):
    for name in ("api-keys", "tls.key", "tls.crt"):
        secret = host.file("/etc/zerolayer/engine-secrets/" + name)
        assert (secret.user, secret.mode) == ("zerolayer-engine", 0o600), name


def test_upstream_connections_are_kept_alive(host):
    for _request in range(3):
        assert chat(host)[0] == 200
    idle = host.run("ss -Htn state established '( dport = :%d )'" % ENGINE_PORT).stdout
    assert idle.strip(), "nginx kept no connection open to the engine"


def test_engine_errors_pass_through_the_proxy(host):
    original = host.file(ADMIN_FILE).content_string
    try:
        write_admin_file(host, json.dumps({"error_rate": 1.0, "error_status": 503}))
        status, headers, body = chat(host)
        assert status == 503
        assert headers["x-zerolayer-path"] == ["proxy"]
        assert "injected" in json.loads(body)["message"]
    finally:
        write_admin_file(host, original)
    assert chat(host)[0] == 200


def nginx_state(host):
    result = host.run("systemctl show --property=MainPID,ActiveState,SubState nginx.service")
    assert result.rc == 0, result.stderr
    return dict(line.partition("=")[::2] for line in result.stdout.splitlines())


def test_restart_brings_up_a_new_nginx_that_serves_at_once(host):
    """A restart is done when systemctl returns: a new master process owns the service
    port and answers, with no wait after it (a unit that went active before nginx listened
    would fail here). How long it took is not a test's business on a shared machine."""
    before = nginx_state(host)
    assert before["ActiveState"] == "active", before
    assert host.run("systemctl restart nginx").rc == 0
    after = nginx_state(host)
    assert (after["ActiveState"], after["SubState"]) == ("active", "running"), after
    assert after["MainPID"] not in ("0", before["MainPID"]), (before, after)
    owners = host.run("ss -Hltnp 'sport = :%d'" % SERVICE_PORT).stdout
    assert "pid=%s," % after["MainPID"] in owners, owners
    assert chat(host)[0] == 200


@pytest.mark.parametrize("path", sorted(API_REQUESTS))
def test_each_api_path_needs_a_key_and_is_forwarded_with_one(host, path):
    status, headers, body = request(host, SERVICE_PORT, path, *API_REQUESTS[path])
    assert (status, body) == (401, UNAUTHORIZED)
    assert "x-zerolayer-engine" not in headers, "the proxy forwarded a request without a key"
    status, headers, body = request(
        host, SERVICE_PORT, path, *API_REQUESTS[path], authorization="Bearer " + KEYS[1]
    )
    assert status == 200, body
    # Answered by the engine behind the proxy.
    assert headers["x-zerolayer-engine"] == ["simulator"]
    assert headers["x-zerolayer-path"] == ["proxy"]


@pytest.mark.parametrize("path", NOT_THE_API)
@pytest.mark.parametrize("key", [None, KEYS[0]])
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_other_paths_are_404_and_never_forwarded(host, path, key, method):
    authorization = None if key is None else "Bearer " + key
    status, headers, body = request(
        host, SERVICE_PORT, path, "-X", method, authorization=authorization
    )
    assert (status, body) == (404, NOT_FOUND)
    assert headers["content-type"] == ["application/json"]
    assert headers["x-zerolayer-path"] == ["proxy"]
    # The engine's own answers carry this header: nginx answered alone.
    assert "x-zerolayer-engine" not in headers


def test_engine_is_sent_the_allowlisted_path_itself(host):
    """nginx matches the normalised path; the engine gets that path, not the client's
    spelling of it, which the engine would read as another route (a 404 there)."""
    key = "Bearer " + KEYS[0]
    status, headers, body = request(
        host, SERVICE_PORT, "/invocations/../v1/models?x=1", "--path-as-is", authorization=key
    )
    assert status == 200, body
    assert headers["x-zerolayer-engine"] == ["simulator"]
    assert json.loads(body)["data"][0]["id"] == "zerolayer/sim-chat-8b"
    status, headers, body = request(
        host, SERVICE_PORT, "/v1/models/../../tokenize", "--path-as-is", authorization=key
    )
    assert (status, body) == (404, NOT_FOUND)


def test_engine_port_serves_the_api_and_monitoring_only(host):
    """The engine's own port (the proxy's and Prometheus' way in): the API, /health and
    /metrics, all behind the key; nothing else."""
    assert request(host, ENGINE_PORT, "/v1/models")[0] == 401
    assert request(host, ENGINE_PORT, "/v1/models", authorization="Bearer " + KEYS[0])[0] == 200
    for path in ("/metrics", "/health"):
        status, _headers, body = request(host, ENGINE_PORT, path)
        assert (status, "vllm:" in body) == (401, False), path
    status, _headers, body = request(
        host, ENGINE_PORT, "/metrics", authorization="Bearer " + KEYS[0]
    )
    assert status == 200 and "vllm:num_requests_running" in body
    assert request(host, ENGINE_PORT, "/health", authorization="Bearer " + KEYS[0])[0] == 200
    for path in ("/invocations", "/tokenize", "/docs"):
        assert request(host, ENGINE_PORT, path, authorization="Bearer " + KEYS[0])[0] == 404
