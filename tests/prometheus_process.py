"""A real Prometheus (the Debian binary) on 127.0.0.1 for a test: a throw-away directory with
its configuration, data and log, started in its own process group, ready once /-/ready
answers, ended by that group and its directory removed. Shared by
tests/integration/test_canary_gate_prometheus.py and tests/monitoring/recorded_fleet.py."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request

import yaml

PROMETHEUS = "/usr/bin/prometheus"


def poll_until(condition, what, limit_s, poll_s=0.5, context=""):
    """Poll until condition() is true; fail naming what never happened, and the context."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(poll_s)
    raise AssertionError("gave up waiting for %s\n%s" % (what, context))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class PrometheusProcess:
    """wait_limit: seconds a poll may wait before the test fails, naming what never came."""

    def __init__(self, prefix, wait_limit, poll_s=0.5):
        self.directory = tempfile.mkdtemp(prefix=prefix)
        self.port = free_port()
        self.url = "http://127.0.0.1:%d" % self.port
        self.wait_limit = wait_limit
        self.poll_s = poll_s
        self.process = None
        self.log = None

    def launch(self, config, retention):
        """Write config (a dict) as prometheus.yml, start Prometheus on the directory's data
        with that retention, and wait until it is ready."""
        config_file = os.path.join(self.directory, "prometheus.yml")
        with open(config_file, "w", encoding="utf-8") as handle:
            yaml.safe_dump(config, handle)
        self.log = open(os.path.join(self.directory, "prometheus.log"), "w+", encoding="utf-8")
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                "--config.file=%s" % config_file,
                "--storage.tsdb.path=%s" % os.path.join(self.directory, "data"),
                "--web.listen-address=127.0.0.1:%d" % self.port,
                "--storage.tsdb.retention.time=%s" % retention,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.wait_for(self._ready, "Prometheus to answer /-/ready")

    def _ready(self):
        if self.process.poll() is not None:
            raise AssertionError(
                "Prometheus exited with %s:\n%s" % (self.process.returncode, self.output())
            )
        try:
            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as reply:  # noqa: S310
                return reply.status == 200
        except OSError:
            return False

    def wait_for(self, condition, what):
        """poll_until, failing with the end of Prometheus's log."""
        try:
            poll_until(condition, what, self.wait_limit, self.poll_s)
        except AssertionError as error:
            raise AssertionError("%s%s" % (error, self.output())) from None

    def output(self):
        """The end of Prometheus's log ("" before it started)."""
        if self.log is None:
            return ""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-4000:]

    def stop(self):
        """End the process group this started, if still running."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()

    def cleanup(self):
        """stop(), then close the log and remove the directory, whatever happens."""
        try:
            self.stop()
        finally:
            if self.log is not None:
                self.log.close()
            shutil.rmtree(self.directory, ignore_errors=True)
