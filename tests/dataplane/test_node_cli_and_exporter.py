"""zerolayer-routectl and the route-metrics exporter against the real kernel.

The router runs in a test netns with nginx as proxy (8080) and as engine (9001), its
pins on a private bpffs (fixtures in conftest.py). The CLI runs in-process through
node_cli.run; the exporter runs as its own process, as on a node, and is scraped over
loopback.
"""

import contextlib
import errno
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
    LATENCY_SAMPLE_EVERY,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

from .conftest import four_sigma_bounds, ok, routectl

# The ports the proxy and engine fixtures of conftest.py listen on.
SERVICE_PORT = 8080
ENGINE_PORT = 9001
CONNECTIONS = 200
COLLECTIONS_PATH = os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
EXPOSITION = "ansible_collections.zerolayer.fleet.plugins.module_utils.node.exposition"
EXPORTER = (
    "import sys; sys.path.insert(0, %r); from %s import exporter_main; "
    "sys.exit(exporter_main(sys.argv[1:]))" % (os.path.abspath(COLLECTIONS_PATH), EXPOSITION)
)


def free_port():
    with contextlib.closing(socket.socket()) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# The capabilities the exporter is given on a node (templates/zerolayer-route-exporter.service.j2):
# none at all without run-time statistics (root owns the pins, and reading them through
# fds of one's own takes no capability), CAP_SYS_ADMIN for BPF_ENABLE_STATS.
NO_CAPABILITIES = ("setpriv", "--bounding-set=-all", "--inh-caps=-all", "--")
STATS_CAPABILITIES = ("setpriv", "--bounding-set=-all,+sys_admin", "--inh-caps=-all", "--")


def exporter_argv(port, pin_dir, *options, wrapper=()):
    return [*wrapper, sys.executable, "-c", EXPORTER, "--listen-address", "127.0.0.1",
            "--port", str(port), "--pin-dir", pin_dir, *options]  # fmt: skip


@pytest.fixture
def exporter(layout):
    """zerolayer-route-exporter on loopback; returns scrape() giving the text.

    start(pin_dir, *options, wrapper=argv prefix) starts it; scrape.pid is its process.
    """
    port = free_port()
    started = []

    def start(*options, pin_dir=None, wrapper=()):
        # The test's own fence file, and no watcher status: nothing of the machine's is read.
        fence = ("--fence-file", layout.fence_file, "--fence-watcher-status", "")
        argv = exporter_argv(port, pin_dir or layout.pin_dir, *fence, *options, wrapper=wrapper)
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

        scrape.pid = proc.pid
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
                proc.wait()


def open_fd_targets(pid):
    """What each open fd of a process refers to (anon_inode:bpf-stats, anon_inode:bpf-map...)."""
    fd_dir = "/proc/%d/fd" % pid
    targets = []
    for name in os.listdir(fd_dir):
        with contextlib.suppress(FileNotFoundError):  # closed while we looked
            targets.append(os.readlink(os.path.join(fd_dir, name)))
    return targets


def capabilities(pid):
    """{CapEff, CapBnd, ...} of a process as integers."""
    with open("/proc/%d/status" % pid) as handle:
        fields = dict(line.split(":\t", 1) for line in handle.read().splitlines() if ":\t" in line)
    return {key: int(fields[key], 16) for key in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb")}


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
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route

    set_route(attached, "batch", 8081, 40)
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    result = ok(attached, "rollback")
    assert result["rolled_back"] is True
    by_name = {route["route"]: route for route in result["routes"]}
    # The rollback writes weights only (zl_weights), blind: the route entries are untouched.
    assert by_name["chat"]["weight_before"] == 100 and by_name["chat"]["generation"] == 3
    assert by_name["batch"]["weight_before"] == 40 and by_name["batch"]["generation"] == 1
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
                # The router's own fence file: the node config says which one it is.
                "fence_file": attached.fence_file,
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
    # A deep rollback sticks: the boot path keeps the router detached until --restore.
    kept = ok(attached, "attach", config=str(config))
    assert kept["attached"] is False and kept["kept_detached"]["mode"] == "detached", kept
    assert netns.clients(count=30)["served"] == {"proxy": 30}
    result = ok(attached, "attach", "--restore", config=str(config))
    assert result["attached"] is True
    assert {r["route"]: r["changed"] for r in result["routes"]} == {"chat": True, "batch": True}
    assert result["engines"] == [{"route": "chat", "slot": 0, "registered": True, "changed": True}]
    # The detach raised the node's fence: the boot path, which carries no epoch, creates the
    # route at 0 instead of its declared 25 %, and says why.
    fenced = {r["route"]: r.get("fenced", "") for r in result["routes"]}
    assert "fence epoch 1" in fenced["batch"] and not fenced["chat"], fenced
    weights = {r["name"]: r["weight"] for r in ok(attached, "show")["routes"]}
    assert weights == {"chat": 0, "batch": 0}, "a restore starts from the config's routes"
    assert netns.clients(count=30)["served"] == {"proxy": 30}


def test_attach_pin_weight_overrides_the_live_weight(attached, netns, router_object, tmp_path):
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    config = tmp_path / "router.json"
    config.write_text(
        json.dumps(
            {
                "pin_dir": attached.pin_dir,
                # The router's own fence file: the node config says which one it is.
                "fence_file": attached.fence_file,
                "object": router_object,
                "netns": netns.path,
                "routes": [{"name": "chat", "port": SERVICE_PORT, "weight": 0, "pin_weight": True}],
            }
        )
    )
    ok(attached, "attach", config=str(config))
    assert ok(attached, "show")["routes"][0]["weight"] == 0


def test_exporter_serves_the_documented_metrics(attached, netns, exporter):
    scrape = exporter("--run-time-stats", wrapper=STATS_CAPABILITIES)
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
    # Asked for, the exporter holds BPF_ENABLE_STATS: every lookup since it started is counted.
    assert "anon_inode:bpf-stats" in open_fd_targets(scrape.pid)
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
    router_lifecycle.detach(attached)  # the link only: program and maps stay pinned
    text = scrape()
    promtool_check(text)
    assert value(text, "zerolayer_router_attached") == 0
    assert "zerolayer_router_info{" not in text
    assert value(text, 'zerolayer_route_weight_ratio{route="chat",port="8080"}') == 0


def test_exporter_after_a_deep_rollback_reports_the_router_gone(attached, exporter):
    scrape = exporter()
    ok(attached, "detach")  # the deep rollback unpins program and maps as well
    text = scrape()
    promtool_check(text)
    assert value(text, "zerolayer_router_attached") == 0
    assert "zerolayer_route_" not in text


def test_exporter_by_default_holds_no_run_time_stats_and_no_capability(attached, netns, exporter):
    scrape = exporter(wrapper=NO_CAPABILITIES)
    assert capabilities(scrape.pid)["CapEff"] == 0, "the exporter must run with no capability"
    ok(attached, "set-weight", "--route", "chat", "--weight", "100")
    netns.clients(count=CONNECTIONS)
    text = scrape()
    promtool_check(text)
    assert "anon_inode:bpf-stats" not in open_fd_targets(scrape.pid)
    # The series built from run-time statistics are left out, not exported as zeros.
    assert "zerolayer_router_runs_total" not in text
    assert "zerolayer_router_run_seconds_total" not in text
    # Everything else is read from the real pins with no capability at all.
    program = router_lifecycle.program_state(attached)
    assert value(text, "zerolayer_router_attached") == 1
    info = 'zerolayer_router_info{prog_id="%d",tag="%s"}' % (program["id"], program["tag"])
    assert value(text, info) == 1
    assert value(text, 'zerolayer_route_weight_ratio{route="chat",port="8080"}') == 1
    assert value(text, 'zerolayer_route_engine_sockets{route="chat"}') == 1
    lookups = value(text, 'zerolayer_route_lookups_total{route="chat"}')
    assert lookups >= CONNECTIONS
    assert value(text, 'zerolayer_route_decisions_total{route="chat",outcome="engine"}') == lookups


def test_exporter_asked_for_stats_without_cap_sys_admin_fails_clearly(attached):
    argv = exporter_argv(free_port(), attached.pin_dir, "--run-time-stats", wrapper=NO_CAPABILITIES)
    proc = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "BPF_ENABLE_STATS failed" in proc.stderr and "EPERM" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_exporter_maps_are_opened_read_only(attached, monkeypatch):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
        ROUTES_MAP,
        opened_map,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
        PORT_KEY,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition

    before = routes_map_bytes(attached)
    # Every pin one scrape opens, and how: maps and program read-only, the link (which the
    # kernel opens only read-write) nothing else.
    opens, obj_get = [], bpf_syscall.obj_get

    def recording_obj_get(path, what=None, read_only=False):
        opens.append((os.path.relpath(path, attached.pin_dir), read_only))
        return obj_get(path, what, read_only)

    monkeypatch.setattr(bpf_syscall, "obj_get", recording_obj_get)
    snapshot = exposition.collect(attached)
    monkeypatch.undo()
    assert snapshot["routes"] and snapshot["attached"], snapshot
    opened_for_writing = {path for path, read_only in opens if not read_only}
    assert opened_for_writing == {"link"}, opens
    assert {path for path, _read_only in opens} >= {"prog", "maps/zl_routes", "maps/zl_weights"}, (
        opens
    )

    # And such an fd really cannot change a map: the kernel refuses, the bytes stay.
    with opened_map(attached, ROUTES_MAP, read_only=True) as fd:
        with open("/proc/self/fdinfo/%d" % fd) as handle:
            fdinfo = dict(line.split(":", 1) for line in handle.read().splitlines())
        assert int(fdinfo["flags"], 8) & os.O_ACCMODE == os.O_RDONLY, fdinfo
        key = PORT_KEY.pack(SERVICE_PORT)
        raw = bpf_syscall.map_lookup(fd, key, len(before[key]))
        assert raw == before[key], "a read-only fd still reads"
        with pytest.raises(FleetError) as refused:
            bpf_syscall.map_update(fd, key, bytes(len(raw)))
        assert refused.value.errno == errno.EPERM
        with pytest.raises(FleetError) as refused:
            bpf_syscall.map_delete(fd, key)
        assert refused.value.errno == errno.EPERM
    assert routes_map_bytes(attached) == before, "the map is unchanged byte for byte"


def test_exporter_with_nothing_pinned(bpffs, exporter):
    scrape = exporter(pin_dir=os.path.join(bpffs, "zlt-never-attached"))
    text = scrape()
    promtool_check(text)
    assert value(text, "zerolayer_router_attached") == 0
    assert "zerolayer_route_" not in text


def routes_map_bytes(layout):
    """Every entry of the routes map, raw: what "unchanged byte for byte" compares."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import bpf_syscall
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.pins import (
        ROUTES_MAP,
        opened_map,
    )
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.route_codec import (
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


def test_rollback_on_a_detached_node_records_the_newer_fence(attached, netns):
    ok(attached, "set-weight", "--route", "chat", "--weight", "50", "--epoch", "3")
    ok(attached, "detach")  # the deep rollback: the router and its maps are gone
    detached_at = ok(attached, "show")["fence"]["epoch"]
    rolled = ok(attached, "rollback", "--epoch", "6")
    assert rolled["rolled_back"] is True and rolled["router"] == "detached", rolled
    assert (rolled["fence_epoch_before"], rolled["fence_epoch"]) == (detached_at, 6), rolled
    assert ok(attached, "rollback")["fence_epoch"] == 7, "one above its own without an epoch"
    assert ok(attached, "show")["fence"]["epoch"] == 7
    assert netns.clients(count=20)["served"] == {"proxy": 20}


def test_register_with_an_older_epoch_is_refused(attached, engine):
    from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
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


def rendered_exporter_unit(**overrides):
    """The role's exporter unit rendered with its defaults, as {directive: [values]}."""
    import yaml
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    role = os.path.join(os.path.dirname(__file__), "..", "..", "roles", "ebpf_router")
    with open(os.path.join(role, "defaults", "main.yml")) as handle:
        defaults = yaml.safe_load(handle)
    variables = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in defaults.items()}
    variables["ansible_managed"] = "Ansible managed"
    variables["ansible_facts"] = {"default_ipv4": {"address": "192.0.2.7"}}
    variables.update(overrides)
    with open(os.path.join(role, "templates", "zerolayer-route-exporter.service.j2")) as handle:
        text = Templar(loader=DataLoader(), variables=variables).template(
            trust_as_template(handle.read())
        )
    directives = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, _sep, val = line.partition("=")
            directives.setdefault(key, []).append(val)
    return directives


def test_exporter_unit_defaults_give_no_capability_and_no_stats():
    unit = rendered_exporter_unit()
    assert unit["CapabilityBoundingSet"] == [""]
    assert unit["AmbientCapabilities"] == [""]
    assert unit["SecureBits"] == ["noroot noroot-locked"]
    (exec_start,) = unit["ExecStart"]
    assert "--run-time-stats" not in exec_start
    assert "--listen-address 192.0.2.7 " in exec_start, "the node's address, not 0.0.0.0"
    for directive, wanted in (
        ("ProtectSystem", "strict"),
        ("ProtectKernelTunables", "yes"),
        ("MemoryDenyWriteExecute", "yes"),
        ("NoNewPrivileges", "yes"),
        ("RestrictAddressFamilies", "AF_INET AF_INET6"),
    ):
        assert unit[directive] == [wanted], directive
    # bpf() is in @privileged: it must be allowed again after that group is taken away.
    assert unit["SystemCallFilter"][-1] == "bpf"


def test_exporter_unit_with_run_time_stats_gets_cap_sys_admin_only():
    unit = rendered_exporter_unit(ebpf_router_exporter_run_time_stats=True)
    assert unit["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    assert unit["AmbientCapabilities"] == ["CAP_SYS_ADMIN"]
    assert unit["ExecStart"][0].endswith(" --run-time-stats")
