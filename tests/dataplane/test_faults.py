"""The data plane under faults: SYN cookies, an engine or the proxy restarted under load."""

import json
import subprocess
import sys
import time

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane import router_lifecycle
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.engine_sockets import (
    register_engine_socket,
)
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.metrics import read_counters
from ansible_collections.zerolayer.fleet.plugins.module_utils.dataplane.routes import set_route

from .conftest import CLIENT, ENGINE_PORT, SERVICE_PORT, four_sigma_bounds
from .decision_model import Seeds, takes_engine_path

FLOOD_CLIENTS = 4
FLOOD_CONNECTIONS = 500  # per client


@pytest.fixture
def routed(layout, netns, proxy, engine, router_object):
    router_lifecycle.attach(layout, router_object, netns.path)
    set_route(layout, "svc", port=SERVICE_PORT, weight=0)
    register_engine_socket(layout, "svc", engine.pid, ENGINE_PORT, family="inet", timeout=10)
    return layout


def tcp_ext(netns, *names):
    """Counters of /proc/net/netstat (TcpExt) as the netns sees them."""
    lines = netns.run(["cat", "/proc/net/netstat"]).stdout.splitlines()
    header, values = next(
        (lines[i].split(), lines[i + 1].split())
        for i in range(0, len(lines), 2)
        if lines[i].startswith("TcpExt:")
    )
    table = dict(zip(header[1:], (int(value) for value in values[1:])))
    return {name: table[name] for name in names}


def flood(netns, clients, connections):
    """clients processes at once, each making connections new connections; merged report."""
    argv = [sys.executable, CLIENT, str(SERVICE_PORT), "--count", str(connections)]
    procs = [
        netns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _n in range(clients)
    ]
    merged = {"served": {}, "errors": 0, "error_samples": []}
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        report = json.loads(out)
        for body, count in report["served"].items():
            merged["served"][body] = merged["served"].get(body, 0) + count
        merged["errors"] += report["errors"]
        merged["error_samples"] += report["error_samples"]
    return merged


def test_with_syn_cookies_forced_every_handshake_completes_on_one_path(routed, netns):
    # Per netns: only the test's own namespace answers every SYN with a cookie.
    netns.run(["sysctl", "-q", "-w", "net.ipv4.tcp_syncookies=2"])
    set_route(routed, "svc", weight=20)
    cookies_before = tcp_ext(netns, "SyncookiesSent", "SyncookiesRecv")
    counters_before = read_counters(routed, 0)

    report = flood(netns, FLOOD_CLIENTS, FLOOD_CONNECTIONS)
    total = FLOOD_CLIENTS * FLOOD_CONNECTIONS
    assert report["errors"] == 0, report["error_samples"]
    low, high = four_sigma_bounds(total, 0.2)
    assert low <= report["served"].get("engine", 0) <= high, report["served"]
    assert sum(report["served"].values()) == total

    cookies = tcp_ext(netns, "SyncookiesSent", "SyncookiesRecv")
    assert cookies["SyncookiesSent"] - cookies_before["SyncookiesSent"] >= total
    assert cookies["SyncookiesRecv"] - cookies_before["SyncookiesRecv"] >= total
    # No request socket: the final ACK is looked up again, and lands where the SYN did.
    counters = read_counters(routed, 0)
    delta = {name: counters[name] - counters_before[name] for name in counters}
    assert delta["lookups"] == 2 * total, delta
    assert delta["to_engine"] == 2 * report["served"]["engine"], delta
    assert delta["to_proxy_by_weight"] == 2 * report["served"]["proxy"], delta
    assert delta["fallback_no_socket"] == delta["assign_errors"] == 0, delta


def test_engine_restarted_under_load_falls_back_and_returns(routed, netns, engine):
    set_route(routed, "svc", weight=100)
    stop = netns.background_clients()
    time.sleep(1)
    before_stop = read_counters(routed, 0)
    netns.stop(engine)  # its listener closes: the kernel drops it from the sockmap
    time.sleep(1)
    down = read_counters(routed, 0)
    restarted = netns.start_nginx(ENGINE_PORT, "engine")
    register_engine_socket(routed, "svc", restarted.pid, ENGINE_PORT, family="inet", timeout=10)
    time.sleep(1)
    report = stop()

    fell_back = down["fallback_no_socket"] - before_stop["fallback_no_socket"]
    print("engine restart at 100%%: %s, fell back while down: %d" % (report, fell_back))
    assert fell_back > 0, "no connection reached the proxy while the engine was down"
    assert report["served"].get("proxy", 0) >= fell_back
    # Connections already queued on the engine's listener when it closed are reset by the
    # kernel: the only failures, and never more than one accept backlog's worth.
    assert report["errors"] <= 511, report
    after = netns.clients(count=100)
    assert after["errors"] == 0 and after["served"] == {"engine": 100}, after


@pytest.mark.parametrize("weight", [0, 20])
def test_proxy_restarted_under_load_fails_only_proxy_path_connections(routed, netns, proxy, weight):
    set_route(routed, "svc", weight=weight)
    source_ports = (30000, 39999)
    stop = netns.background_clients(port_range=source_ports)
    time.sleep(1)
    netns.stop(proxy)
    time.sleep(0.5)
    netns.start_nginx(SERVICE_PORT, "proxy")
    time.sleep(1)
    report = stop()

    seeds = Seeds.of(routed)
    failed = report["failed_source_ports"]
    on_engine_path = [
        port
        for port in failed
        if takes_engine_path(("127.0.0.1", port, "127.0.0.1", SERVICE_PORT), weight * 100, seeds)
    ]
    print(
        "proxy restart at %d%%: served %s, failed %d (all on the proxy path: %s)"
        % (weight, report["served"], len(failed), not on_engine_path)
    )
    assert report["errors"] == len(failed)
    # Every failure is explained: a connection whose 4-tuple the router leaves to the
    # proxy, while no proxy listened. The direct path failed nothing.
    assert on_engine_path == [], on_engine_path
    assert failed, "the proxy was down for 0.5 s and no connection noticed: a broken test"
    assert report["served"].get("proxy", 0) > 0
    if weight:
        assert report["served"].get("engine", 0) > 0
