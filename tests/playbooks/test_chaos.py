"""Chaos on the sandbox fleet while a canary stage's weight is in place and load runs.

Each case states what it proves. The other chaos cases of the drill live beside the
playbooks they exercise (test_canary_playbooks.py): Prometheus down during a gate (the
stage holds, never rolls back), a node unreachable during a rollback (the others roll back,
the report names it, exit non-zero), a canary run killed mid-hold and resumed (only the
remaining hold is waited). An engine's slice under memory pressure is seen by the node's
route exporter.
"""

from __future__ import annotations

import re
import time
import urllib.request

import pytest

pytestmark = [pytest.mark.sandbox, pytest.mark.xdist_group("sandbox-fleet")]

ENGINE_UNIT = "zerolayer-engine-chat.service"


def engine_counts(fleet):
    return {node: route_of(fleet, node)["counters"]["to_engine"] for node in fleet.nodes}


def is_active(fleet, node, unit):
    return fleet.exec(node, "systemctl", "is-active", unit, check=False).stdout.strip() == "active"


def route_of(fleet, node):
    routes = fleet.show(node)["routes"]
    return next(route for route in routes if route["name"] == fleet.route["name"])


def wait_for(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError("timed out after %d s waiting for %s" % (timeout, what))


def direct_requests(summary):
    return summary["paths"].get("direct", {}).get("requests", 0)


def test_engine_killed_under_load_falls_back_to_the_proxy_and_reregisters(fleet, baseline, load):
    """Proves: when an engine dies, new connections its slot would have taken go to the
    proxy (fallback, no reset from the router); the restarted engine registers its new
    socket by itself (the unit's ExecStartPost), with no Ansible run; only that node's
    requests fail, and only while its engine is down.

    One load client per side, so every request is counted where it went: the other nodes'
    client for the whole test, the victim's while its engine dies and comes back, and a
    fresh client on the victim once its new socket is registered."""
    victim, others = fleet.nodes[0], fleet.nodes[1:]
    assert others, "the chaos test needs at least two GPU nodes"
    fleet.set_weight(50)
    on_others = load("engine-killed-others", others)
    on_victim = load("engine-killed-victim", [victim])
    on_victim.wait_for(lambda s: direct_requests(s) >= 20, "direct requests on the victim")
    before = route_of(fleet, victim)
    fleet.exec(victim, "systemctl", "kill", "--signal=SIGKILL", ENGINE_UNIT)

    def reregistered():
        route = route_of(fleet, victim)
        return route if route["slots"] and route["slots"] != before["slots"] else None

    after = wait_for(reregistered, 60, "the restarted engine's socket in slot 0")
    while_down = on_victim.stop()
    # A fresh client on the victim: none of its requests may fail, and it reaches the
    # engine's new socket on the direct path.
    on_victim_again = load("engine-back-victim", [victim])
    on_victim_again.wait_for(
        lambda s: direct_requests(s) >= 20, "direct requests on the victim's new engine"
    )
    on_others.wait_for_more(20)
    back = on_victim_again.stop()
    elsewhere = on_others.stop()

    fallbacks = after["counters"]["fallback_no_socket"] - before["counters"]["fallback_no_socket"]
    assert fallbacks > 0, (before["counters"], after["counters"])
    assert is_active(fleet, victim, ENGINE_UNIT)
    assert elsewhere["requests_failed"] == 0, elsewhere["failures_by_cause"]
    assert direct_requests(elsewhere) > 0 and elsewhere["requests_ok"] > 0, elsewhere["paths"]
    assert back["requests_failed"] == 0, back["failures_by_cause"]
    assert direct_requests(back) >= 20, back["paths"]
    # While the engine was down the proxy kept serving the victim's requests.
    assert while_down["paths"].get("proxy", {}).get("requests", 0) > 0, while_down["paths"]
    print(
        "engine killed: %d fallbacks to the proxy; on %s %d requests failed while its engine "
        "was down (%s), 0 of %d after; 0 of %d on the other nodes"
        % (
            fallbacks,
            victim,
            while_down["requests_failed"],
            while_down["failures_by_cause"],
            back["requests_ok"],
            elsewhere["requests_ok"],
        )
    )


def test_proxy_restarted_at_full_weight_loses_no_request(fleet, baseline, load):
    """Proves: at weight 100 the direct path does not depend on the proxy: nginx restarted
    on every node under load, twice, and not one request fails."""
    fleet.set_weight(100)
    client = load("proxy-restarted")
    try:
        client.wait_for_more(50)
        engine_before = engine_counts(fleet)
        for _round in range(2):
            for node in fleet.nodes:
                fleet.exec(node, "systemctl", "restart", "nginx.service")
            # Requests keep flowing between and after the restarts.
            client.wait_for_more(50)
        engine_after = engine_counts(fleet)
    finally:
        summary = client.stop()
    assert summary["requests_failed"] == 0, summary["failures_by_cause"]
    assert summary["requests_ok"] > 100
    for node in fleet.nodes:
        assert engine_after[node] > engine_before[node], node
        assert is_active(fleet, node, "nginx.service"), node


# A process that keeps reading a file larger than its memory limit, dropping the file's
# cached pages before each pass: every pass charges new page cache to the process's memory
# cgroup, which the kernel must reclaim at the limit, and that reclaim is a memory stall
# (PSI). Page cache rather than anonymous memory: nodes have no swap, so anonymous memory
# over the limit would end in the OOM killer instead of a stall. On a hybrid-cgroup host (the
# sandbox's) the memory controller is cgroup v1 and not delegated to the node's systemd, so
# the process joins a v1 memory group made for it; PSI still counts its stalls in its
# unified cgroup, the engine's slice.
STRESS = """
import os, sys, time
path, memcg, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
if memcg:
    with open(os.path.join(memcg, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
end = time.monotonic() + seconds
while time.monotonic() < end:
    with open(path, "rb") as data:
        os.posix_fadvise(data.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        while data.read(1 << 20):
            pass
"""
STRESS_UNIT = "zl-test-memory-stress.service"
STRESS_FILE = "/var/tmp/zl-test-memory-stress.bin"
STRESS_MEMCG_V1 = "/sys/fs/cgroup/memory/zl-test-memory-stress"
STRESS_LIMIT = "32M"
STRESS_FILE_MIB = 128


def engine_pressure(fleet, node, engine):
    """{(family suffix, kind): value} of the engine's memory pressure series on the node's
    route exporter, scraped as Prometheus scrapes it."""
    port = fleet.node_vars[node].get("ebpf_router_exporter_port", 9464)
    url = "http://%s:%d/metrics" % (fleet.address(node), port)
    with urllib.request.urlopen(url, timeout=10) as reply:  # noqa: S310 - the node's exporter
        text = reply.read().decode()
    found = {}
    pattern = re.compile(
        r'^zerolayer_engine_memory_pressure_(\w+)\{engine="%s"(?:,kind="(\w+)")?[^}]*\} (\S+)$'
        % re.escape(engine),
        re.M,
    )
    for suffix, kind, value in pattern.findall(text):
        found[(suffix, kind or None)] = float(value)
    return found


def test_an_engine_slice_under_memory_pressure_shows_in_the_route_exporter(fleet):
    """Proves: the route exporter reads the engine slice's own PSI. A process started inside
    the engine's slice (zerolayer-engine-<name>.slice), made to reclaim memory all the time,
    moves that engine's stall counter and its 10 s average on the node's /metrics."""
    node = fleet.nodes[0]
    engine = fleet.engine["name"]
    engine_slice = "zerolayer-engine-%s.slice" % engine
    before = engine_pressure(fleet, node, engine)
    assert before.get(("ok", None)) == 1, before
    assert ("seconds_total", "some") in before and ("ratio", "some") in before, before
    # A unified host's systemd enforces the unit's own limit; a hybrid one's cannot.
    unified = fleet.exec(node, "test", "-e", "/sys/fs/cgroup/cgroup.controllers", check=False)
    memcg = "" if unified.returncode == 0 else STRESS_MEMCG_V1
    started = time.monotonic()
    try:
        fleet.exec(
            node,
            "dd",
            "if=/dev/zero",
            "of=" + STRESS_FILE,
            "bs=1M",
            "count=%d" % STRESS_FILE_MIB,
            "status=none",
        )
        if memcg:
            fleet.exec(node, "mkdir", memcg)
            fleet.exec(
                node, "sh", "-c", 'echo %s > "$1"/memory.limit_in_bytes' % STRESS_LIMIT, "-", memcg
            )
        fleet.exec(
            node,
            "systemd-run",
            "--unit",
            STRESS_UNIT,
            "--slice",
            engine_slice,
            "--collect",
            # The test stops it; the limit on its run time is for a test that cannot.
            "-p",
            "RuntimeMaxSec=60",
            "-p",
            "MemoryMax=%s" % STRESS_LIMIT,
            "python3",
            "-c",
            STRESS,
            STRESS_FILE,
            memcg,
            "45",
        )
        group = fleet.exec(node, "systemctl", "show", "-P", "ControlGroup", STRESS_UNIT).stdout
        assert group.strip().endswith("/%s/%s" % (engine_slice, STRESS_UNIT)), group

        def moved():
            now = engine_pressure(fleet, node, engine)
            grew = now[("seconds_total", "some")] > before[("seconds_total", "some")]
            return now if grew and now[("ratio", "some")] > 0 else None

        during = wait_for(moved, 30, "the engine's memory stalls on its exporter")
    finally:
        fleet.exec(
            node,
            "sh",
            "-c",
            'systemctl stop "$1" 2>/dev/null; if [ -n "$2" ] && [ -d "$2" ]; then rmdir "$2"; fi;'
            ' rm -f "$3"',
            "-",
            STRESS_UNIT,
            memcg,
            STRESS_FILE,
        )
    print(
        "engine %s on %s: PSI some total %.6f -> %.6f s, avg10 %.4f -> %.4f, in %.1f s"
        % (
            engine,
            node,
            before[("seconds_total", "some")],
            during[("seconds_total", "some")],
            before[("ratio", "some")],
            during[("ratio", "some")],
            time.monotonic() - started,
        )
    )
    assert fleet.exec(node, "systemctl", "is-active", STRESS_UNIT, check=False).returncode != 0
    assert fleet.exec(node, "test", "-e", STRESS_FILE, check=False).returncode != 0
