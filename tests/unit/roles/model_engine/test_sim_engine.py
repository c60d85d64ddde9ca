"""The CPU engine simulator (a test double for a GPU engine), run as a real process."""

import datetime
import http.client
import importlib.util
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

SIMULATOR = Path(__file__).resolve().parents[4] / "roles/model_engine/files/zerolayer_engine_sim.py"
KEYS = ("sk-test-alpha", "sk-test-bravo")
MODEL = "unit-test-model"
START_TIMEOUT = 30


class Engine:
    def __init__(self, process, port, admin_file, keys_file, tls_context=None):
        self.process = process
        self.port = port
        self.admin_file = admin_file
        self.keys_file = keys_file
        self.tls_context = tls_context

    def connection(self, timeout=60):
        if self.tls_context is not None:
            return http.client.HTTPSConnection(
                "127.0.0.1", self.port, timeout=timeout, context=self.tls_context
            )
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, key=KEYS[0], connection=None, headers=None):
        own = connection is None
        connection = connection or self.connection()
        all_headers = {"Content-Type": "application/json"}
        if key is not None:
            all_headers["Authorization"] = "Bearer " + key
        all_headers.update(headers or {})
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        try:
            connection.request(method, path, body=data, headers=all_headers)
            response = connection.getresponse()
            payload = response.read()
        finally:
            if own:
                connection.close()
        return response, payload

    def chat(self, key=KEYS[0], connection=None, **fields):
        body = {"model": MODEL, "messages": [{"role": "user", "content": "three little words"}]}
        body.update(fields)
        return self.request("POST", "/v1/chat/completions", body, key=key, connection=connection)

    def set_admin(self, settings):
        # Write then rename, as an operator's tool should, so no half file is read.
        temporary = self.admin_file.with_suffix(".tmp")
        temporary.write_text(json.dumps(settings) if isinstance(settings, dict) else settings)
        os.replace(temporary, self.admin_file)

    def metrics(self):
        response, payload = self.request("GET", "/metrics")
        assert response.status == 200
        return payload.decode()


def metric_value(text, name, **labels):
    """Sum of the series of `name` that carry `labels` (histograms have one per path)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") and all('%s="%s"' % item in line for item in labels.items())
    ]
    if not values:
        if name.endswith(("_count", "_sum")) and not labels:
            return 0.0
        raise AssertionError("metric %s %s not found" % (name, labels))
    return sum(values)


def start_engine(tmp_path, *extra, keys_mode=0o600, tls=None):
    keys_file = tmp_path / "api-keys"
    keys_file.write_text("# test keys\n" + "\n".join(KEYS) + "\n")
    keys_file.chmod(keys_mode)
    admin_file = tmp_path / "admin.json"
    argv = [
        sys.executable,
        str(SIMULATOR),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--model",
        MODEL,
        "--engine-name",
        "unit",
        "--api-keys-file",
        str(keys_file),
        "--admin-file",
        str(admin_file),
        "--time-to-first-token",
        "0",
        "--inter-token-latency",
        "0",
        "--output-tokens",
        "5",
        "--max-output-tokens",
        "64",
        "--max-input-tokens",
        "100",
        "--drain-seconds",
        "30",
        *extra,
    ]
    context = None
    if tls is not None:
        argv += ["--tls-cert", str(tls[0]), "--tls-key", str(tls[1])]
        context = ssl.create_default_context(cafile=str(tls[0]))
        context.check_hostname = False
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = process.stdout.readline()
    if not line:
        process.wait(timeout=START_TIMEOUT)
        raise AssertionError("simulator did not start: %s" % process.stderr.read())
    ready = json.loads(line)
    assert ready["event"] == "listening" and ready["engine"] == "simulator"
    return Engine(process, ready["port"], admin_file, keys_file, context)


def stop_engine(engine):
    if engine.process.poll() is None:
        engine.process.kill()
    engine.process.wait(timeout=START_TIMEOUT)
    engine.process.stdout.close()
    engine.process.stderr.close()


@pytest.fixture
def engine(tmp_path):
    running = start_engine(tmp_path)
    try:
        yield running
    finally:
        stop_engine(running)


@pytest.fixture
def engine_factory(tmp_path):
    started = []

    def start(*extra, **options):
        running = start_engine(tmp_path, *extra, **options)
        started.append(running)
        return running

    try:
        yield start
    finally:
        for running in started:
            stop_engine(running)


def read_events(response):
    """Read an SSE body event by event; http.client undoes the chunked framing."""
    buffer = b""
    while True:
        line = response.readline()
        if not line:
            assert buffer == b"", "stream ended inside an event"
            return
        buffer += line
        if buffer.endswith(b"\n\n"):
            assert buffer.startswith(b"data: "), buffer
            yield buffer[len(b"data: ") : -2].decode()
            buffer = b""


def open_stream(engine, **fields):
    connection = engine.connection()
    body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "go"}]}
    body.update(fields)
    connection.request(
        "POST",
        "/v1/chat/completions",
        body=json.dumps(body),
        headers={"Authorization": "Bearer " + KEYS[0]},
    )
    return connection, connection.getresponse()


def test_completion_says_it_is_a_simulator(engine):
    response, payload = engine.chat(max_tokens=7)
    assert response.status == 200
    assert response.getheader("X-Zerolayer-Engine") == "simulator"
    # The instance that answered: an engine upgrade checks both paths reach the new one.
    assert response.getheader("X-Zerolayer-Engine-Name") == "unit"
    assert response.getheader("X-Zerolayer-Path") == "direct"
    reply = json.loads(payload)
    assert reply["object"] == "chat.completion"
    assert reply["model"] == MODEL
    assert "simulator" in reply["system_fingerprint"]
    assert reply["choices"][0]["finish_reason"] == "length"
    assert len(reply["choices"][0]["message"]["content"].split()) == 7
    assert reply["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10}


def test_default_output_ends_with_stop(engine):
    response, payload = engine.chat()
    assert response.status == 200
    choice = json.loads(payload)["choices"][0]
    assert choice["finish_reason"] == "stop"
    assert len(choice["message"]["content"].split()) == 5


def test_stream_is_framed_as_server_sent_events(engine):
    connection, response = open_stream(engine, max_tokens=6, stream_options={"include_usage": True})
    try:
        assert response.status == 200
        assert response.getheader("Content-Type").startswith("text/event-stream")
        assert response.getheader("Transfer-Encoding") == "chunked"
        assert response.getheader("X-Zerolayer-Engine") == "simulator"
        events = list(read_events(response))
    finally:
        connection.close()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert all(chunk["object"] == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk["id"] for chunk in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(
        chunk["choices"][0]["delta"].get("content", "") for chunk in chunks if chunk["choices"]
    )
    assert len(text.split()) == 6
    finishing = [chunk["choices"][0]["finish_reason"] for chunk in chunks if chunk["choices"]]
    assert finishing[-1] == "length" and set(finishing[:-1]) == {None}
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6


def test_stream_matches_non_streaming_text(engine):
    payload = engine.chat(max_tokens=9)[1]
    whole = json.loads(payload)["choices"][0]["message"]["content"]
    connection, response = open_stream(engine, max_tokens=9)
    try:
        events = [event for event in read_events(response) if event != "[DONE]"]
    finally:
        connection.close()
    streamed = "".join(
        json.loads(event)["choices"][0]["delta"].get("content", "") for event in events
    )
    assert streamed == whole


def test_keep_alive_serves_many_requests_on_one_connection(engine):
    connection = engine.connection()
    try:
        connection.connect()
        local_port = connection.sock.getsockname()[1]
        for _request in range(20):
            response = engine.chat(connection=connection, max_tokens=2)[0]
            assert response.status == 200
            assert not response.will_close
        assert connection.sock.getsockname()[1] == local_port
    finally:
        connection.close()


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "Bearer wrong-key",
        "bearer " + KEYS[0],
        KEYS[0],
        "Bearer " + KEYS[0] + " ",
    ],
)
def test_bad_or_missing_key_gets_401(engine, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    response, payload = engine.request(
        "POST", "/v1/chat/completions", body, key=None, headers=headers
    )
    assert response.status == 401
    assert payload == b'{"error":"Unauthorized"}'
    assert response.getheader("Content-Type") == "application/json"


def test_every_listed_key_is_accepted(engine):
    for key in KEYS:
        response = engine.chat(key=key)[0]
        assert response.status == 200


def test_models_health_and_metrics_need_a_key(engine):
    assert engine.request("GET", "/v1/models", key=None)[0].status == 401
    response, payload = engine.request("GET", "/v1/models")
    assert response.status == 200
    assert [model["id"] for model in json.loads(payload)["data"]] == [MODEL]
    for path in ("/health", "/metrics"):
        response, payload = engine.request("GET", path, key=None)
        assert (response.status, payload) == (401, b'{"error":"Unauthorized"}'), path
        assert b"vllm:" not in payload
        assert engine.request("GET", path, key="sk-not-a-key")[0].status == 401, path
    assert engine.request("GET", "/health")[0].status == 200


def test_key_file_change_is_picked_up(engine):
    engine.keys_file.write_text("sk-rotated\n")
    engine.keys_file.chmod(0o600)
    assert engine.chat(key=KEYS[0])[0].status == 401
    assert engine.chat(key="sk-rotated")[0].status == 200


def test_key_file_readable_by_others_refuses_every_key(engine_factory):
    loose = engine_factory(keys_mode=0o644)
    for key in KEYS:
        assert loose.chat(key=key)[0].status == 401


def test_missing_key_file_stops_the_start(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            str(SIMULATOR),
            "--port",
            "0",
            "--api-keys-file",
            str(tmp_path / "absent"),
        ],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert result.returncode == 2
    assert "absent" in result.stderr


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--error-rate", "1.5"),
        ("--max-concurrency", "0"),
        ("--time-to-first-token", "-1"),
        ("--api-path", "/invocations"),
        ("--api-path", "/v1/chat completions"),
    ],
)
def test_bad_flags_are_named(flag, value):
    result = subprocess.run(
        [sys.executable, str(SIMULATOR), flag, value],
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    assert result.returncode == 2
    assert flag in result.stderr


@pytest.mark.parametrize(
    ("fields", "status"),
    [
        ({"model": "other-model"}, 404),
        ({"messages": []}, 400),
        ({"max_tokens": 65}, 400),
        ({"max_tokens": 0}, 400),
        ({"stream": "yes"}, 400),
        ({"messages": [{"role": "user", "content": "word " * 101}]}, 400),
    ],
)
def test_invalid_requests_are_refused(engine, fields, status):
    response, payload = engine.chat(**fields)
    assert response.status == status
    assert json.loads(payload)["code"] == status


def test_body_that_is_not_json_is_refused(engine):
    response = engine.request("POST", "/v1/chat/completions", b"{not json")[0]
    assert response.status == 400


def test_metrics_use_vllm_names_and_count(engine):
    before = engine.metrics()
    for name in (
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:time_per_output_token_seconds",
        "vllm:e2e_request_latency_seconds",
    ):
        assert "# TYPE %s histogram" % name in before
    for name in (
        "vllm:request_success_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "zerolayer_sim_errors_total",
    ):
        assert "# TYPE %s counter" % name in before
    assert "# TYPE vllm:num_requests_running gauge" in before
    assert engine.chat(max_tokens=4)[0].status == 200
    assert engine.chat(key="nope")[0].status == 401
    after = engine.metrics()
    assert (
        metric_value(after, "vllm:request_success_total", finished_reason="length")
        == metric_value(before, "vllm:request_success_total", finished_reason="length") + 1
    )
    assert (
        metric_value(after, "vllm:generation_tokens_total")
        == metric_value(before, "vllm:generation_tokens_total") + 4
    )
    assert (
        metric_value(after, "vllm:prompt_tokens_total")
        == metric_value(before, "vllm:prompt_tokens_total") + 3
    )
    assert (
        metric_value(after, "vllm:inter_token_latency_seconds_count")
        == metric_value(before, "vllm:inter_token_latency_seconds_count") + 3
    )
    assert metric_value(
        after, "vllm:time_to_first_token_seconds_bucket", le="+Inf"
    ) == metric_value(after, "vllm:time_to_first_token_seconds_count")
    assert (
        metric_value(after, "zerolayer_sim_errors_total", reason="unauthorized")
        == metric_value(before, "zerolayer_sim_errors_total", reason="unauthorized") + 1
    )
    assert 'kind="simulator"' in after


def test_metrics_pass_promtool(engine):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail(
            "promtool is missing: install the Debian package prometheus (scripts/setup test)"
        )
    engine.chat()
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=engine.metrics(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT,
        check=False,
    )
    # vLLM's names carry a colon, which promtool's linter frowns on; any other
    # complaint, and any parse error, is a real fault in the exposition.
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if line]
    assert "error while linting" not in result.stderr, result.stderr
    assert all(line.endswith("metric names should not contain ':'") for line in complaints), (
        complaints
    )
    assert len(complaints) >= 9


def test_error_injection_changes_at_run_time(engine):
    assert engine.chat()[0].status == 200
    engine.set_admin({"error_rate": 1.0})
    response, payload = engine.chat()
    assert response.status == 503
    assert "injected" in json.loads(payload)["message"]
    engine.set_admin({"error_rate": 1.0, "error_status": 500})
    assert engine.chat()[0].status == 500
    engine.set_admin({"error_rate": 0.5, "error_status": 502})
    statuses = [engine.chat()[0].status for _request in range(10)]
    assert statuses.count(502) == 5 and statuses.count(200) == 5
    engine.set_admin({"error_rate": 0.0})
    assert engine.chat()[0].status == 200
    metrics = engine.metrics()
    assert metric_value(metrics, "zerolayer_sim_errors_total", reason="injected") == 7
    assert metric_value(metrics, "zerolayer_sim_injected_error_rate") == 0


def test_removing_the_admin_file_restores_start_settings(engine):
    engine.set_admin({"error_rate": 1.0})
    assert engine.chat()[0].status == 503
    engine.admin_file.unlink()
    assert engine.chat()[0].status == 200


@pytest.mark.parametrize(
    "bad", ['{"error_rate": 2}', '{"error_rat": 1}', "[1]", "{broken", '{"error_status": 404}']
)
def test_bad_admin_file_keeps_previous_settings(engine, bad):
    engine.set_admin({"error_rate": 1.0})
    assert engine.chat()[0].status == 503
    engine.set_admin(bad)
    assert engine.chat()[0].status == 503
    assert metric_value(engine.metrics(), "zerolayer_sim_admin_reload_failures_total") == 1


def test_requests_beyond_the_limit_get_429(engine_factory):
    limited = engine_factory("--max-concurrency", "2")
    # Long enough that the held streams are still waiting when the third request comes.
    limited.set_admin({"time_to_first_token_seconds": 5})
    held = [open_stream(limited, max_tokens=1) for _stream in range(2)]
    try:
        for _connection, response in held:
            assert response.status == 200
            assert (
                json.loads(next(read_events(response)))["choices"][0]["delta"]["role"]
                == "assistant"
            )
        response, payload = limited.chat()
        assert response.status == 429
        assert json.loads(payload)["code"] == 429
        assert metric_value(limited.metrics(), "vllm:num_requests_running") == 2
        # Every slot in use: the stand-in for vLLM's KV-cache usage is full.
        assert metric_value(limited.metrics(), "vllm:kv_cache_usage_perc") == 1
        for _connection, response in held:
            assert list(read_events(response))[-1] == "[DONE]"
    finally:
        for connection, _response in held:
            connection.close()
    limited.set_admin({})
    assert limited.chat()[0].status == 200
    assert metric_value(limited.metrics(), "vllm:kv_cache_usage_perc") == 0
    assert metric_value(limited.metrics(), "zerolayer_sim_errors_total", reason="overloaded") == 1


def test_stop_closes_the_listener_and_finishes_streams_in_flight(engine_factory):
    draining = engine_factory()
    draining.set_admin({"time_to_first_token_seconds": 3})
    connection, response = open_stream(draining, max_tokens=3)
    try:
        first = next(read_events(response))
        assert json.loads(first)["choices"][0]["delta"]["role"] == "assistant"
        draining.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                socket.create_connection(("127.0.0.1", draining.port), timeout=5).close()
            except ConnectionRefusedError:
                break
            except ConnectionResetError:
                # A probe that reaches the listener while it closes is reset; the next
                # one, sent after the close, is refused.
                pass
            assert time.monotonic() < deadline, "listener still open after SIGTERM"
            time.sleep(0.05)
        events = list(read_events(response))
    finally:
        connection.close()
    assert events[-1] == "[DONE]"
    assert draining.process.wait(timeout=START_TIMEOUT) == 0


@pytest.fixture
def certificate(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "engine.test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file


def test_tls_serves_completions_and_refuses_plain_http(engine_factory, certificate):
    secure = engine_factory(tls=certificate)
    response, payload = secure.chat()
    assert response.status == 200
    assert "simulator" in json.loads(payload)["system_fingerprint"]
    assert secure.chat(key=None)[0].status == 401
    plain = http.client.HTTPConnection("127.0.0.1", secure.port, timeout=30)
    try:
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            plain.request("GET", "/health")
            plain.getresponse()
    finally:
        plain.close()
    # The failed handshake must not have disturbed the server.
    assert secure.chat()[0].status == 200


# -- which paths are answered, on each arrival path -----------------------------------------

# Paths vLLM serves without a key (its key check covers only /v1, /v2, /inference and
# /cohere), the simulator's own operations paths, and API paths not on the allowlist.
NEVER_SERVED_TO_CLIENTS = (
    ("POST", "/invocations"),
    ("POST", "/tokenize"),
    ("POST", "/detokenize"),
    ("POST", "/load"),
    ("GET", "/version"),
    ("GET", "/docs"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/models/"),
    ("PUT", "/invocations"),
)
CHAT_BODY = {"model": MODEL, "messages": [{"role": "user", "content": "three little words"}]}
TEXT_BODY = {"model": MODEL, "prompt": "three little words"}
API_REQUESTS = (
    ("GET", "/v1/models", None),
    ("POST", "/v1/chat/completions", CHAT_BODY),
    ("POST", "/v1/completions", TEXT_BODY),
)


def load_simulator():
    # As when it runs as a script: the rule it shares with vLLM's middleware lies beside it.
    if str(SIMULATOR.parent) not in sys.path:
        sys.path.insert(0, str(SIMULATOR.parent))
    spec = importlib.util.spec_from_file_location("zerolayer_engine_sim_under_test", SIMULATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class HandOver:
    """The simulator's server in this process, and a second listening socket that hands
    each connection it accepts to that server, as the router's sk_lookup program hands a
    connection to the service port over to the engine's socket: the engine sees a
    connection whose local port is the service port, not its own. Stands in for the
    kernel's hand-over only; the simulator's code is the real one."""

    def __init__(self, tmp_path):
        simulator = load_simulator()
        keys_file = tmp_path / "api-keys"
        keys_file.write_text("\n".join(KEYS) + "\n")
        keys_file.chmod(0o600)
        # The node's direct-drain marker, this test's own (none written: nothing leaves).
        self.marker = tmp_path / "direct-drain.json"
        config = simulator.parse_args(
            [
                *("--port", "0", "--model", MODEL, "--engine-name", "unit"),
                *("--api-keys-file", str(keys_file), "--output-tokens", "3"),
                *("--time-to-first-token", "0", "--inter-token-latency", "0"),
                *("--direct-drain-file", str(self.marker), "--direct-idle-grace", "0.3"),
            ]
        )
        self.server = simulator.EngineServer(config, None)
        self.service = socket.create_server(("127.0.0.1", 0))
        self.service.settimeout(0.2)
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=self.server.serve_forever, args=(0.1,), daemon=True),
            threading.Thread(target=self.hand_over, daemon=True),
        ]
        for thread in self.threads:
            thread.start()
        self.own_port = Engine(None, self.server.server_address[1], None, keys_file)
        self.service_port = Engine(None, self.service.getsockname()[1], None, keys_file)

    def hand_over(self):
        while not self.stopping.is_set():
            try:
                connection, address = self.service.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            self.server.process_request(connection, address)

    def close(self):
        self.stopping.set()
        self.server.shutdown()
        for thread in self.threads:
            thread.join(timeout=START_TIMEOUT)
        self.service.close()
        self.server.server_close()


@pytest.fixture(scope="module")
def hand_over(tmp_path_factory):
    running = HandOver(tmp_path_factory.mktemp("hand-over"))
    try:
        yield running
    finally:
        running.close()


@pytest.mark.parametrize(("method", "path", "body"), API_REQUESTS)
@pytest.mark.parametrize("arrival", ["service_port", "own_port"])
def test_api_paths_need_a_key_on_both_arrival_paths(hand_over, arrival, method, path, body):
    engine = getattr(hand_over, arrival)
    response, payload = engine.request(method, path, body, key=None)
    assert (response.status, payload) == (401, b'{"error":"Unauthorized"}')
    assert engine.request(method, path, body, key="sk-not-a-key")[0].status == 401
    response, payload = engine.request(method, path, body)
    assert response.status == 200, payload
    assert response.getheader("X-Zerolayer-Engine") == "simulator"


@pytest.mark.parametrize(("method", "path"), [("GET", "/health"), ("GET", "/metrics")])
@pytest.mark.parametrize("key", [None, KEYS[0]])
def test_operations_paths_are_only_on_the_engines_own_port_behind_the_key(
    hand_over, method, path, key
):
    expected = 200 if key else 401
    assert hand_over.own_port.request(method, path, key=key)[0].status == expected
    response, payload = hand_over.service_port.request(method, path, key=key)
    assert response.status == 404
    assert json.loads(payload)["code"] == 404
    assert b"vllm:" not in payload


@pytest.mark.parametrize(("method", "path"), NEVER_SERVED_TO_CLIENTS)
@pytest.mark.parametrize("key", [None, KEYS[0]])
@pytest.mark.parametrize("arrival", ["service_port", "own_port"])
def test_other_paths_are_404_with_or_without_a_key(hand_over, arrival, key, method, path):
    body = {"model": MODEL, "prompt": "hi"} if method != "GET" else None
    response, payload = getattr(hand_over, arrival).request(method, path, body, key=key)
    assert response.status == 404
    assert response.getheader("Content-Type") == "application/json"
    assert json.loads(payload)["type"] == "NotFoundError"


def test_hand_over_is_counted_as_the_direct_path(hand_over):
    """Requests reach the engine on both arrival paths: its own /metrics tells them apart by
    the path label, so a 404 on the service port is the hand-over's."""
    assert hand_over.service_port.chat()[0].status == 200
    assert hand_over.own_port.chat()[0].status == 200
    assert hand_over.service_port.request("GET", "/metrics")[0].status == 404
    text = hand_over.own_port.metrics()
    for path in ("direct", "proxy"):
        assert (
            metric_value(
                text, "http_requests_total", handler="/v1/chat/completions", status="2xx", path=path
            )
            >= 1
        )
    assert (
        metric_value(text, "http_requests_total", handler="/metrics", status="4xx", path="direct")
        >= 1
    )


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("GET", "/v1/chat/completions", "POST"), ("POST", "/v1/models", "GET, HEAD")],
)
def test_wrong_method_on_an_api_path_is_405_after_the_key(hand_over, method, path, allowed):
    engine = hand_over.service_port
    assert engine.request(method, path, CHAT_BODY, key=None)[0].status == 401
    response, payload = engine.request(method, path, CHAT_BODY)
    assert response.status == 405
    assert response.getheader("Allow") == allowed
    assert json.loads(payload)["code"] == 405


def test_api_paths_come_from_the_command_line(engine_factory):
    narrow = engine_factory("--api-path", "/v1/chat/completions")
    assert narrow.chat(key=None)[0].status == 401
    assert narrow.chat()[0].status == 200
    for key in (None, KEYS[0]):
        assert narrow.request("GET", "/v1/models", key=key)[0].status == 404
        assert narrow.request("POST", "/v1/completions", TEXT_BODY, key=key)[0].status == 404
    # The engine's own port still answers Prometheus and the drain, behind the key.
    for path in ("/health", "/metrics"):
        assert narrow.request("GET", path, key=None)[0].status == 401, path
        assert narrow.request("GET", path)[0].status == 200, path


def test_default_api_paths_are_the_roles(engine):
    for method, path, body in API_REQUESTS:
        assert engine.request(method, path, body, key=None)[0].status == 401, path
        assert engine.request(method, path, body)[0].status == 200, path
    for method, path in NEVER_SERVED_TO_CLIENTS:
        assert engine.request(method, path, {"prompt": "x"})[0].status == 404, path


def test_text_completion(engine):
    response, payload = engine.request(
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "four words of prompt", "max_tokens": 6},
    )
    assert response.status == 200
    reply = json.loads(payload)
    assert reply["object"] == "text_completion"
    assert reply["id"].startswith("cmpl-")
    assert "simulator" in reply["system_fingerprint"]
    assert len(reply["choices"][0]["text"].split()) == 6
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["usage"] == {"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}
    bad = engine.request("POST", "/v1/completions", {"model": MODEL, "prompt": ["a", "b"]})
    assert bad[0].status == 400


def test_text_completion_stream(engine):
    connection = engine.connection()
    try:
        connection.request(
            "POST",
            "/v1/completions",
            body=json.dumps({"model": MODEL, "prompt": "go", "stream": True, "max_tokens": 4}),
            headers={"Authorization": "Bearer " + KEYS[0]},
        )
        response = connection.getresponse()
        assert response.status == 200
        assert response.getheader("Content-Type").startswith("text/event-stream")
        events = list(read_events(response))
    finally:
        connection.close()
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"text_completion"}
    assert len("".join(chunk["choices"][0]["text"] for chunk in chunks).split()) == 4
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


# -- direct connections leave after the node lowered a weight ---------------------------------


CLOSED_SERIES = "zerolayer_engine_direct_connections_closed_total"


def write_marker(path, marker):
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps({"version": 1, "ports": {}, **marker}))
    os.replace(temporary, path)


def rolled_back(now=None):
    """What the node writes when every route goes to weight 0."""
    return {"all": {"since_unix": now or time.time(), "epoch": 7, "reason": "fast rollback"}}


@pytest.fixture
def drained_hand_over(tmp_path):
    running = HandOver(tmp_path)
    try:
        yield running
    finally:
        running.close()


def test_a_busy_direct_connection_is_told_to_close_on_its_next_answer(drained_hand_over):
    engine = drained_hand_over.service_port
    connection = engine.connection(timeout=10)
    try:
        first = engine.chat(connection=connection)[0]
        assert first.status == 200 and first.getheader("Connection") is None
        write_marker(drained_hand_over.marker, rolled_back())
        time.sleep(0.1)  # the engine looks at the marker at most every 50 ms
        second, payload = engine.chat(connection=connection)
        assert second.status == 200, payload
        assert second.getheader("Connection") == "close"
        assert connection.sock is None or connection.sock.recv(1) == b""
    finally:
        connection.close()
    # At weight 0 any direct connection is one the router decided before the rollback (in
    # the accept queue, say): answered, and told to close as well.
    late = engine.chat()[0]
    assert late.status == 200 and late.getheader("Connection") == "close"
    text = drained_hand_over.own_port.metrics()
    assert (
        metric_value(text, "zerolayer_engine_direct_connections_closed_total", how="response") == 2
    )


def test_an_idle_direct_connection_is_closed_after_the_grace(drained_hand_over):
    engine = drained_hand_over.service_port
    connection = engine.connection(timeout=10)
    try:
        assert engine.chat(connection=connection)[0].status == 200
        write_marker(drained_hand_over.marker, rolled_back())
        connection.sock.settimeout(5)
        started = time.monotonic()
        assert connection.sock.recv(1) == b"", "the server closes it (a FIN, no reset)"
        # The grace (0.3 s), the engine's look at the marker and its wait's poll (0.1 s).
        assert 0.25 <= time.monotonic() - started < 2.0
    finally:
        connection.close()
    assert metric_value(drained_hand_over.own_port.metrics(), CLOSED_SERIES, how="idle") == 1


def test_the_proxys_connections_to_the_engines_own_port_are_never_touched(drained_hand_over):
    engine = drained_hand_over.own_port
    connection = engine.connection(timeout=10)
    try:
        write_marker(drained_hand_over.marker, rolled_back())
        time.sleep(0.8)  # longer than the grace: an idle direct one would be closed by now
        for _attempt in range(3):
            response = engine.chat(connection=connection)[0]
            assert response.status == 200 and response.getheader("Connection") is None
    finally:
        connection.close()


def test_a_weight_raised_again_ends_the_closing_for_new_connections(drained_hand_over):
    lowered = time.time() - 10
    write_marker(
        drained_hand_over.marker,
        {
            **rolled_back(lowered),
            "ports": {
                str(drained_hand_over.service.getsockname()[1]): {
                    "since_unix": lowered,
                    "updated_unix": lowered + 5,
                    "weight_bp": 500,
                    "epoch": 8,
                    "reason": "weight 5% on route 'chat'",
                }
            },
        },
    )
    engine = drained_hand_over.service_port
    connection = engine.connection(timeout=10)
    try:
        for _attempt in range(3):
            response = engine.chat(connection=connection)[0]
            assert response.status == 200 and response.getheader("Connection") is None
        time.sleep(0.6)
        assert engine.chat(connection=connection)[0].getheader("Connection") is None
    finally:
        connection.close()


def test_a_torn_or_foreign_marker_closes_nothing(drained_hand_over):
    drained_hand_over.marker.write_text('{"version": 1, "all": {"since_un')
    engine = drained_hand_over.service_port
    connection = engine.connection(timeout=10)
    try:
        for _attempt in range(2):
            assert engine.chat(connection=connection)[0].getheader("Connection") is None
    finally:
        connection.close()
