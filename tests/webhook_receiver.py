"""A local HTTP receiver of webhooks for the notification tests, on loopback only.

It keeps every POST it gets (path, headers, JSON body) in order. Its behaviour per path is
set by the test: answer 200, answer a status (a receiver that refuses), or wait before
answering (a slow receiver). Runs in a thread of the test's own process, stopped by close().
"""

from __future__ import annotations

import http.server
import json
import threading
import time


class WebhookReceiver:
    def __init__(self):
        self.received = []
        self.behaviour = {}  # path: {"status": int, "delay_s": float}
        self._lock = threading.Lock()
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                how = receiver.behaviour.get(self.path, {})
                time.sleep(how.get("delay_s", 0))
                status = how.get("status", 200)
                try:
                    payload = json.loads(raw.decode() or "null")
                except ValueError:
                    payload = {"unparsed": raw.decode(errors="replace")}
                with receiver._lock:
                    receiver.received.append(
                        {"path": self.path, "headers": dict(self.headers), "body": payload,
                         "status": status, "at": time.monotonic()}
                    )  # fmt: skip
                try:
                    self.send_response(status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"ok")
                except (BrokenPipeError, ConnectionResetError):
                    pass  # a sender that gave up waiting (a slow receiver's test) hung up

            def log_message(self, *_args):
                return

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def url(self, path="/hook"):
        return "http://127.0.0.1:%d%s" % (self.port, path)

    def bodies(self, path="/hook", delivered_only=True):
        with self._lock:
            return [
                entry["body"]
                for entry in self.received
                if entry["path"] == path and (entry["status"] < 300 or not delivered_only)
            ]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(5)
