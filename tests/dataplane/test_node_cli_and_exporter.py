"""zerolayer-routectl and the route-metrics exporter against the real kernel.

The router runs in a test netns with nginx as proxy (8080) and as engine (9001), its
pins on a private bpffs (fixtures in conftest.py). The CLI runs in-process through
node_cli.run; the exporter runs as its own process, as on a node, and is scraped over
loopback.
"""

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils import node_cli, router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.route_codec import (
    LATENCY_SAMPLE_EVERY,
)

from .conftest import four_sigma_bounds

# The ports the proxy and engine fixtures of conftest.py listen on.
SERVICE_PORT = 8080
ENGINE_PORT = 9001
CONNECTIONS = 200
COLLECTIONS_PATH = os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
EXPOSITION = "ansible_collections.zerolayer.fleet.plugins.module_utils.exposition"
EXPORTER = (
    "import sys; sys.path.insert(0, %r); from %s import exporter_main; "
    "sys.exit(exporter_main(sys.argv[1:]))" % (os.path.abspath(COLLECTIONS_PATH), EXPOSITION)
)


def routectl(layout, *argv, config=None):
    """Run the CLI; return (exit status, parsed JSON from stdout or stderr)."""
    out, err = io.StringIO(), io.StringIO()
    prefix = [
        "--config", config or "/nonexistent/router.json",
        "--pin-dir", layout.pin_dir,
        "--fence-file", layout.fence_file,
    ]  # fmt: skip
    status = node_cli.run([*prefix, *argv], stdout=out, stderr=err)
    text = out.getvalue() or err.getvalue()
    assert text.count("\n") == 1, "one JSON line, got %r" % text
    return status, json.loads(text)


def ok(layout, *argv, config=None):
    status, payload = routectl(layout, *argv, config=config)
    assert status == 0, payload
    return payload


@pytest.fixture
def attached(layout, netns, proxy, engine, router_object):
    """Router attached in the netns with route chat on 8080 and the engine in slot 0."""
    router_lifecycle.attach(layout, router_object, netns.path)
    from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import set_route

    set_route(layout, "chat", SERVICE_PORT, 0)
    registered = ok(
        layout, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
        "--port", str(ENGINE_PORT), "--timeout", "5",
    )  # fmt: skip
    assert registered["changed"] is True and registered["cookie"] > 0
    return layout


def free_port():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def exporter(layout):
    """zerolayer-route-exporter on loopback; returns scrape() giving the text."""
    port = free_port()
    started = []

    def start(pin_dir=None):
        argv = [sys.executable, "-c", EXPORTER, "--listen-address", "127.0.0.1",
                "--port", str(port), "--pin-dir", pin_dir or layout.pin_dir]  # fmt: skip
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        started.append(proc)
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        "exporter did not start: %s" % proc.communicate()[1]
                    ) from None
                time.sleep(0.05)

        def scrape():
            url = "http://127.0.0.1:%d/metrics" % port
            with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - fixed http URL
                assert response.status == 200
                assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
                return response.read().decode()

        return scrape

    try:
        yield start
    finally:
        for proc in started:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


def value(text, series):
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError("no sample %s in:\n%s" % (series, text))


def promtool_check(text):
    check = subprocess.run(
        ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_set_weight_is_one_write_and_steers(attached, netns):
    result = ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    assert result["changed"] is True
    # Generation 1 on creation, 2 when the engine's registration set the slot limit.
    assert result["before"] == {"weight": 0, "weight_bp": 0, "generation": 2}
    assert result["after"] == {"weight": 100, "weight_bp": 10000, "generation": 3}
    assert netns.clients(count=50)["served"] == {"engine": 50}

    again = ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    assert again["changed"] is False and again["after"]["generation"] == 3


def test_set_weight_unknown_route_names_the_field(attached):
    status, error = routectl(attached, "set-weight", "--route", "nope", "--weight", "5")
    assert status == node_cli.EXIT_REJECTED
    assert error["field"] == "route"
    assert "chat" in error["error"], "the message lists the known routes"


def test_rollback_zeroes_every_route_and_confirms(attached, netns):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.routes import set_route

    set_route(attached, "batch", 8081, 40)
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    result = ok(attached, "rollback")
    assert result["rolled_back"] is True
    by_name = {route["route"]: route for route in result["routes"]}
    assert by_name["chat"]["weight_before"] == 100 and by_name["chat"]["generation"] == 4
    assert by_name["batch"]["weight_before"] == 40 and by_name["batch"]["generation"] == 2
    assert all(route["weight"] == 0 and route["confirmed"] for route in result["routes"])
    assert netns.clients(count=50)["served"] == {"proxy": 50}


def test_show_reports_routes_slots_and_counters(attached, netns):
    ok(attached, "set-weight", "--route", "chat", "--weight", "50")
    netns.clients(count=CONNECTIONS)
    shown = ok(attached, "show")
    assert shown["router"]["attached"] is True
    (route,) = shown["routes"]
    assert route["weight"] == 50 and list(route["slots"]) == ["0"]
    counters = route["counters"]
    assert counters["lookups"] >= CONNECTIONS
    assert counters["to_engine"] + counters["to_proxy_by_weight"] == counters["lookups"]
    assert 0 < counters["to_engine"] < counters["lookups"]


def test_register_refuses_a_process_without_the_listener(attached, proxy):
    status, error = routectl(
        attached, "register", "--route", "chat", "--slot", "1", "--pid", str(proxy.pid),
        "--port", str(ENGINE_PORT), "--timeout", "0.5",
    )  # fmt: skip
    assert status == node_cli.EXIT_REJECTED
    assert error["field"] == "listen_port"
    assert "1" not in ok(attached, "show")["routes"][0]["slots"]


def test_detach_then_attach_from_config(attached, netns, engine, router_object, tmp_path):
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    detached = ok(attached, "detach")
    assert detached["changed"] is True and detached["attached"] is False
    assert netns.clients(count=30)["served"] == {"proxy": 30}

    config = tmp_path / "router.json"
    config.write_text(
        json.dumps(
            {
                "pin_dir": attached.pin_dir,
                "object": router_object,
                "netns": netns.path,
                "routes": [
                    {
                        "name": "chat",
                        "port": SERVICE_PORT,
                        "weight": 0,
                        "engines": [{"slot": 0, "pid": engine.pid, "port": ENGINE_PORT}],
                    },
                    {"name": "batch", "port": 8082, "weight": 25},
                ],
            }
        )
    )
    result = ok(attached, "attach", config=str(config))
    assert result["attached"] is True
    assert {r["route"]: r["changed"] for r in result["routes"]} == {"chat": False, "batch": True}
    assert result["engines"] == [{"route": "chat", "slot": 0, "registered": True, "changed": False}]
    # The detach raised the node's fence: the boot path, which carries no epoch, creates the
    # new route at 0 instead of its declared 25 %, and says why.
    fenced = {r["route"]: r.get("fenced", "") for r in result["routes"]}
    assert "fence epoch 1" in fenced["batch"] and not fenced["chat"], fenced
    weights = {r["name"]: r["weight"] for r in ok(attached, "show")["routes"]}
    assert weights == {"chat": 100, "batch": 0}, "a live weight survives re-attach"
    assert netns.clients(count=30)["served"] == {"engine": 30}


def test_attach_pin_weight_overrides_the_live_weight(attached, netns, router_object, tmp_path):
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    config = tmp_path / "router.json"
    config.write_text(
        json.dumps(
            {
                "pin_dir": attached.pin_dir,
                "object": router_object,
                "netns": netns.path,
                "routes": [{"name": "chat", "port": SERVICE_PORT, "weight": 0, "pin_weight": True}],
            }
        )
    )
    ok(attached, "attach", config=str(config))
    assert ok(attached, "show")["routes"][0]["weight"] == 0


def test_exporter_serves_the_documented_metrics(attached, netns, exporter):
    scrape = exporter()
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    netns.clients(count=CONNECTIONS)
    text = scrape()
    promtool_check(text)
    program = router_lifecycle.program_state(attached)
    assert value(text, "zerolayer_router_attached") == 1
    assert (
        value(
            text, 'zerolayer_router_info{prog_id="%d",tag="%s"}' % (program["id"], program["tag"])
        )
        == 1
    )
    # The exporter holds BPF_ENABLE_STATS: every lookup since it started is counted.
    assert value(text, "zerolayer_router_runs_total") >= CONNECTIONS
    assert value(text, "zerolayer_router_run_seconds_total") > 0
    assert value(text, 'zerolayer_route_weight_ratio{route="chat",port="8080"}') == 1
    assert value(text, 'zerolayer_route_generation{route="chat"}') == 3
    assert value(text, 'zerolayer_route_engine_sockets{route="chat"}') == 1
    lookups = value(text, 'zerolayer_route_lookups_total{route="chat"}')
    engine = value(text, 'zerolayer_route_decisions_total{route="chat",outcome="engine"}')
    assert lookups >= CONNECTIONS and engine == lookups
    # The program times one decision in LATENCY_SAMPLE_EVERY, picked by the 4-tuple; the
    # clients' source ports are random (no timed one among 200: odds of 1 in 400,000).
    count = value(text, "zerolayer_route_decision_duration_seconds_count")
    low, high = four_sigma_bounds(lookups, 1 / LATENCY_SAMPLE_EVERY)
    assert max(low, 1) <= count <= high
    assert value(text, 'zerolayer_route_decision_duration_seconds_bucket{le="+Inf"}') == count
    assert value(text, "zerolayer_route_decision_duration_seconds_sum") > 0


def test_exporter_after_detach_keeps_route_series(attached, exporter):
    scrape = exporter()
    ok(attached, "detach")
    text = scrape()
    promtool_check(text)
    assert value(text, "zerolayer_router_attached") == 0
    assert "zerolayer_router_info{" not in text
    assert value(text, 'zerolayer_route_weight_ratio{route="chat",port="8080"}') == 0


def test_exporter_with_nothing_pinned(bpffs, exporter):
    scrape = exporter(pin_dir=os.path.join(bpffs, "zlt-never-attached"))
    text = scrape()
    promtool_check(text)
    assert value(text, "zerolayer_router_attached") == 0
    assert "zerolayer_route_" not in text


def routes_map_bytes(layout):
    """Every entry of the routes map, raw: what "unchanged byte for byte" compares."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils import bpf_syscall
    from ansible_collections.zerolayer.fleet.plugins.module_utils.pins import (
        ROUTES_MAP,
        opened_map,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.route_codec import (
        PORT_KEY,
        ROUTE_VALUE,
    )

    with opened_map(layout, ROUTES_MAP) as fd:
        return {
            key: bpf_syscall.map_lookup(fd, key, ROUTE_VALUE.size)
            for key in bpf_syscall.map_keys(fd, PORT_KEY.size)
        }


def test_rollback_raises_the_fence_and_an_older_epoch_cannot_raise_a_weight(attached, netns):
    ok(attached, "set-weight", "--route", "chat", "--weight", "20", "--epoch", "3")
    assert ok(attached, "show")["fence"]["epoch"] == 3, "a higher epoch is recorded"
    rolled = ok(attached, "rollback", "--epoch", "4")
    assert (rolled["fence_epoch_before"], rolled["fence_epoch"]) == (3, 4)
    before = routes_map_bytes(attached)
    for stale in (["--epoch", "3"], []):  # the runner's old epoch, and no epoch at all
        status, error = routectl(
            attached, "set-weight", "--route", "chat", "--weight", "20", *stale
        )
        assert status == node_cli.EXIT_REJECTED, error
        assert error["field"] == "epoch" and error["node_epoch"] == 4
        assert "epoch %s" % (stale[1] if stale else 0) in error["error"]
        assert "fence epoch 4" in error["error"], error["error"]
        assert routes_map_bytes(attached) == before, "the map is unchanged byte for byte"
    assert netns.clients(count=50)["served"] == {"proxy": 50}
    # The writer that took the new epoch goes through; so does the safe direction with any.
    assert ok(attached, "set-weight", "--route", "chat", "--weight", "100", "--epoch", "4")[
        "changed"
    ]
    assert ok(attached, "set-weight", "--route", "chat", "--weight", "0", "--epoch", "1")["changed"]


def test_rollback_without_an_epoch_goes_one_above_the_nodes_own(attached):
    ok(attached, "set-weight", "--route", "chat", "--weight", "50", "--epoch", "7")
    assert ok(attached, "rollback")["fence_epoch"] == 8
    assert ok(attached, "rollback", "--epoch", "2")["fence_epoch"] == 8, "never lowered"
    status, error = routectl(
        attached, "set-weight", "--route", "chat", "--weight", "5", "--epoch", "7"
    )
    assert status == node_cli.EXIT_REJECTED and error["node_epoch"] == 8


def test_register_with_an_older_epoch_is_refused(attached, engine):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.engine_sockets import (
        unregister_engine_socket,
    )

    ok(attached, "rollback", "--epoch", "5")
    unregister_engine_socket(attached, "chat", 0)
    status, error = routectl(
        attached, "register", "--route", "chat", "--slot", "0", "--pid", str(engine.pid),
        "--port", str(ENGINE_PORT), "--timeout", "5", "--epoch", "4",
    )  # fmt: skip
    assert status == node_cli.EXIT_REJECTED and error["field"] == "epoch", error
    assert ok(attached, "show")["routes"][0]["slots"] == {}, "nothing was registered"


def test_detach_raises_the_fence_before_it_detaches(attached):
    result = ok(attached, "detach", "--epoch", "9")
    assert (result["fence_epoch"], result["attached"]) == (9, False)
    with open(attached.fence_file) as handle:
        kept = json.load(handle)
    assert kept["epoch"] == 9 and kept["action"] == "deep rollback"
