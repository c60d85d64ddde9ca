"""Verify the ebpf_router role on a sandbox node: real kernel, systemd, nginx and engine.

The proxy is nginx on the service port 8080 answering "proxy"; the engine is python3's
http.server on 8101 serving "engine". Requests go from inside the node to its own
non-loopback address, the way a client on the network would reach the service port.
Tests run in file order: the traffic tests change the weight and put it back to 0.
"""

import json
import shutil
import subprocess

ROUTECTL = "/usr/local/sbin/zerolayer-routectl"
PIN_DIR = "/sys/fs/bpf/zerolayer"
SERVICE_PORT = 8080
ENGINE_PORT = 8101
REQUESTS = 40
TIMED_SAMPLE_CONNECTIONS = 400
METRIC_NAMES = (
    "zerolayer_router_attached",
    "zerolayer_router_info",
    "zerolayer_router_run_seconds_total",
    "zerolayer_router_runs_total",
    "zerolayer_route_weight_ratio",
    "zerolayer_route_generation",
    "zerolayer_route_engine_sockets",
    "zerolayer_route_lookups_total",
    "zerolayer_route_decisions_total",
    "zerolayer_route_decision_duration_seconds",
)


def routectl(host, *args):
    result = host.run(" ".join([ROUTECTL, *args]))
    assert result.rc == 0, result.stderr
    return json.loads(result.stdout)


def node_address(host):
    """The node's first non-loopback IPv4 address."""
    addresses = host.check_output("hostname -I").split()
    candidates = [a for a in addresses if ":" not in a and not a.startswith("127.")]
    assert candidates, "node has no non-loopback IPv4 address: %r" % addresses
    return candidates[0]


def served_by(host, count=REQUESTS):
    """Who answered each of count new connections to the service port."""
    url = "http://%s:%d/" % (node_address(host), SERVICE_PORT)
    # One shell loop on the node: a round trip per request through the connection is slow.
    bodies = host.check_output(
        "for i in $(seq %d); do curl -sS --max-time 5 -H 'Connection: close' %s; done"
        % (count, url)
    )
    answers = {}
    for body in bodies.split():
        answers[body] = answers.get(body, 0) + 1
    assert sum(answers.values()) == count, bodies
    return answers


def metrics(host):
    """The exporter's text byte for byte.

    Some connections strip a command's trailing newline, which the text format requires:
    a marker printed after the text keeps it (and only what follows the marker is dropped).
    """
    scrape = host.run("curl -sS --max-time 5 http://127.0.0.1:9464/metrics && echo END")
    assert scrape.rc == 0, scrape.stderr
    output = scrape.stdout.rstrip("\n")
    assert output.endswith("\nEND"), "the exposition must end with a newline"
    return output[: -len("END")]


def metric_value(text, name, **labels):
    wanted = ",".join('%s="%s"' % item for item in labels.items())
    prefix = "%s{%s} " % (name, wanted) if labels else name + " "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line[len(prefix) :])
    raise AssertionError("no sample %s in:\n%s" % (prefix, text))


def test_bpffs_is_mounted(host):
    mount = host.mount_point("/sys/fs/bpf")
    assert mount.exists
    assert mount.filesystem == "bpf"


def test_pin_dir_is_private(host):
    pin_dir = host.file(PIN_DIR)
    assert pin_dir.is_directory
    assert pin_dir.mode == 0o700


def test_sk_lookup_link_is_pinned_and_attached(host):
    links = json.loads(host.check_output("bpftool --json link show pinned %s/link" % PIN_DIR))
    assert links["type"] == "netns"
    assert links["attach_type"] == "sk_lookup"
    assert links["netns_ino"] != 0
    listed = json.loads(host.check_output("bpftool --json link show"))
    assert any(link.get("attach_type") == "sk_lookup" for link in listed)


def test_route_and_engine_socket_are_in_place(host):
    shown = routectl(host, "show")
    assert shown["router"]["attached"] is True
    (route,) = shown["routes"]
    assert route["name"] == "chat"
    assert route["port"] == SERVICE_PORT
    assert route["weight"] == 0
    assert list(route["slots"]) == ["0"], "the engine socket is not registered in slot 0"


def test_engine_socket_is_the_engines_listener(host):
    cookie = routectl(host, "show")["routes"][0]["slots"]["0"]
    engine_pid = host.check_output("systemctl show -p MainPID --value zl-test-engine.service")
    listeners = host.check_output("ss -Htlnp 'sport = :%d'" % ENGINE_PORT)
    assert "pid=%s," % engine_pid in listeners
    assert cookie > 0


def test_units_are_installed_and_running(host):
    router = host.service("zerolayer-router.service")
    assert router.is_enabled
    assert (
        host.check_output("systemctl show -p ActiveState --value zerolayer-router.service")
        == "active"
    )
    exporter = host.service("zerolayer-route-exporter.service")
    assert exporter.is_enabled
    assert exporter.is_running
    assert host.socket("tcp://0.0.0.0:9464").is_listening


def test_config_matches_inventory(host):
    config = json.loads(host.file("/etc/zerolayer/router.json").content_string)
    assert config["pin_dir"] == PIN_DIR
    assert config["routes"][0]["engines"] == [
        {"slot": 0, "unit": "zl-test-engine.service", "port": ENGINE_PORT}
    ]


def test_cli_rejects_bad_input_naming_the_field(host):
    result = host.run("%s set-weight --route chat --weight 101" % ROUTECTL)
    assert result.rc == 2
    error = json.loads(result.stderr)
    assert error["field"] == "weight"
    assert routectl(host, "show")["routes"][0]["weight"] == 0


def test_exporter_serves_valid_metrics(host):
    text = metrics(host)
    for name in METRIC_NAMES:
        assert "# TYPE %s " % name in text, name
    assert metric_value(text, "zerolayer_router_attached") == 1
    assert metric_value(text, "zerolayer_route_engine_sockets", route="chat") == 1
    promtool = shutil.which("promtool")
    assert promtool, "promtool (package prometheus) is needed on the controller"
    check = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout + check.stderr


def test_weight_100_sends_new_connections_to_the_engine(host):
    result = routectl(host, "set-weight", "--route", "chat", "--weight", "100")
    assert result["after"]["weight"] == 100
    assert result["after"]["generation"] == result["before"]["generation"] + 1
    # The program times one decision in 16, picked by the 4-tuple: 400 connections time
    # about 25 of theirs (none at all has odds of about 1 in 10^11).
    assert served_by(host, TIMED_SAMPLE_CONNECTIONS) == {"engine": TIMED_SAMPLE_CONNECTIONS}
    text = metrics(host)
    assert metric_value(text, "zerolayer_route_weight_ratio", route="chat", port="8080") == 1
    assert (
        metric_value(text, "zerolayer_route_decisions_total", route="chat", outcome="engine")
        >= TIMED_SAMPLE_CONNECTIONS
    )
    timed = metric_value(text, "zerolayer_route_decision_duration_seconds_count")
    assert 1 <= timed < metric_value(text, "zerolayer_route_lookups_total", route="chat")


def test_rollback_sends_new_connections_to_the_proxy(host):
    result = routectl(host, "rollback")
    assert result["rolled_back"] is True
    (route,) = result["routes"]
    assert route["weight"] == 0 and route["confirmed"] is True
    assert served_by(host) == {"proxy": REQUESTS}


def test_boot_unit_reattaches_after_detach(host):
    # The rollback before raised the node's fence: a raise needs the node's current epoch.
    epoch = routectl(host, "show")["fence"]["epoch"]
    assert epoch >= 1, "the rollback fences the node"
    refused = host.run("%s set-weight --route chat --weight 100" % ROUTECTL)
    assert refused.rc == 2 and '"field": "epoch"' in refused.stderr, refused.stderr
    routectl(host, "set-weight", "--route", "chat", "--weight", "100", "--epoch", str(epoch))
    detached = routectl(host, "detach")
    assert detached["attached"] is False
    assert served_by(host, 10) == {"proxy": 10}, "a detached router must not steer"
    assert metric_value(metrics(host), "zerolayer_router_attached") == 0
    restart = host.run("systemctl restart zerolayer-router.service")
    assert restart.rc == 0, restart.stderr
    shown = routectl(host, "show")
    assert shown["router"]["attached"] is True
    assert shown["routes"][0]["weight"] == 100, "re-attach must keep the live weight"
    assert served_by(host, 10) == {"engine": 10}
    routectl(host, "set-weight", "--route", "chat", "--weight", "0")


def test_register_hook_reregisters_the_engine(host):
    """The engine units' hook: zerolayer-register-engine ROUTE SLOT PORT UNIT."""
    host.run_expect([0], "systemctl restart zl-test-engine.service")
    stale = routectl(host, "show")["routes"][0]["slots"]
    assert stale == {}, "a restarted engine's old socket must leave the map"
    hook = host.run("/usr/local/sbin/zerolayer-register-engine chat 0 8101 zl-test-engine.service")
    assert hook.rc == 0, hook.stderr
    assert json.loads(hook.stdout)["changed"] is True
    assert list(routectl(host, "show")["routes"][0]["slots"]) == ["0"]
