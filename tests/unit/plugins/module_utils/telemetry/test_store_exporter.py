"""The rollout store's exposition: what the store's keys say per wave, and its text."""

import datetime
import http.client
import json
import re
import shutil
import subprocess
import threading
import types

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import record_codec
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import exposition
from ansible_collections.zerolayer.fleet.plugins.module_utils.rollout import rollout as r
from ansible_collections.zerolayer.fleet.plugins.module_utils.telemetry import store_exporter as se

T0 = datetime.datetime(2025, 3, 1, 12, 0, 0, tzinfo=datetime.timezone.utc)
SCHEDULE = [{"weight": 5, "hold": 60}, {"weight": 100, "hold": 0}]


def record(rollout_id="chat-a:wave_canary", *steps):
    planned, _changed, _note = r.plan(None, rollout_id, SCHEDULE, None, False, T0, "sre@ctl")
    planned["fence_epoch"] = 3
    for minutes, action, params in steps:
        planned, _changed = r.apply(
            planned, action, params, T0 + datetime.timedelta(minutes=minutes), "sre@ctl"
        )
    return planned


def encoded(value):
    return record_codec.encode_record(value).encode()


def owner(rollout_id="chat-a", ttl_s=30):
    return json.dumps({"host": "ctl", "pid": 42, "rollout_id": rollout_id, "ttl_s": ttl_s}).encode()


def raw(records=(), owners=(), fence=b'{"epoch": 4, "action": "fast"}'):
    return {"fence": fence, "owners": list(owners), "records": list(records)}


def store_key(*parts):
    """RolloutStore.key of the default prefix, for stand-ins of a store."""
    return "/zerolayer/" + "/".join(parts)


def samples(text):
    """{(name, frozenset(labels)): value} of an exposition text."""
    found = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.fullmatch(r"([a-z_:]+)(?:\{(.*)\})? (\S+)", line)
        assert match, line
        labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        found[(match.group(1), labels)] = float(match.group(3))
    return found


def wave_labels(wave="wave_canary", rollout_id="chat-a", **more):
    return frozenset({"rollout_id": rollout_id, "wave": wave, **more}.items())


def test_running_wave_with_an_owner():
    state = se.store_state(
        raw([("chat-a/wave_canary", encoded(record()))], [("gpu_nodes", owner(), 27)])
    )
    assert state["up"] and state["fence_epoch"] == 4 and state["unreadable"] == 0
    (wave,) = state["waves"]
    assert wave == {
        "rollout_id": "chat-a",
        "wave": "wave_canary",
        "outcome": "running",
        "running": True,
        "paused": False,
        "paused_since": None,
        "owned": True,
        "lease_remaining_s": 27,
        "lease_ttl_s": 30,
        "fence_epoch": 3,
        "last_progress": T0.timestamp(),
        "deadline_s": None,
        "stuck": False,
        "abort_when_stuck": False,
    }
    got = samples(se.render(state))
    assert got[("zerolayer_rollout_store_up", frozenset())] == 1
    assert got[("zerolayer_rollout_store_fence_epoch", frozenset())] == 4
    assert got[("zerolayer_rollout_store_wave_info", wave_labels(outcome="running"))] == 1
    assert got[("zerolayer_rollout_store_wave_running", wave_labels())] == 1
    assert got[("zerolayer_rollout_store_wave_owned", wave_labels())] == 1
    assert got[("zerolayer_rollout_store_wave_owner_lease_remaining_seconds", wave_labels())] == 27
    assert got[("zerolayer_rollout_store_wave_owner_lease_ttl_seconds", wave_labels())] == 30
    assert got[("zerolayer_rollout_store_wave_fence_epoch", wave_labels())] == 3
    assert ("zerolayer_rollout_store_wave_paused_since_timestamp_seconds", wave_labels()) not in got


def test_running_wave_whose_owner_is_gone():
    text = se.render(se.store_state(raw([("chat-a/wave_canary", encoded(record()))])))
    got = samples(text)
    assert got[("zerolayer_rollout_store_wave_running", wave_labels())] == 1
    assert got[("zerolayer_rollout_store_wave_owned", wave_labels())] == 0
    assert "zerolayer_rollout_store_wave_owner_lease_remaining_seconds" not in text


def test_an_owner_of_another_rollout_does_not_own_the_wave():
    state = se.store_state(
        raw([("chat-a/wave_canary", encoded(record()))], [("gpu_nodes", owner("chat-b"), 27)])
    )
    assert state["waves"][0]["owned"] is False


def test_an_owner_whose_lease_expired_reads_minus_one():
    state = se.store_state(
        raw([("chat-a/wave_canary", encoded(record()))], [("gpu_nodes", owner(), -1)])
    )
    assert state["waves"][0]["owned"] is True
    assert state["waves"][0]["lease_remaining_s"] == -1


def test_of_two_scopes_for_one_rollout_the_longer_lease_counts():
    state = se.store_state(
        raw(
            [("chat-a/wave_canary", encoded(record()))],
            [("rack_a", owner(), 4), ("rack_b", owner(ttl_s=60), 55)],
        )
    )
    assert (state["waves"][0]["lease_remaining_s"], state["waves"][0]["lease_ttl_s"]) == (55, 60)


def test_paused_wave_says_since_when():
    paused = record(
        "chat-a:wave_canary",
        (1, "stage_started", {"stage": 0}),
        (2, "pause", {"reason": "look"}),
        (3, "verdict", {"verdict": {"verdict": "pass"}}),
    )
    state = se.store_state(raw([("chat-a/wave_canary", encoded(paused))]))
    (wave,) = state["waves"]
    since = (T0 + datetime.timedelta(minutes=2)).timestamp()
    assert (wave["outcome"], wave["running"], wave["paused"]) == ("paused", False, True)
    assert wave["paused_since"] == since, "the pause, not the record's later change"
    got = samples(se.render(state))
    assert got[("zerolayer_rollout_store_wave_paused", wave_labels())] == 1
    assert got[("zerolayer_rollout_store_wave_running", wave_labels())] == 0
    assert (
        got[("zerolayer_rollout_store_wave_paused_since_timestamp_seconds", wave_labels())] == since
    )


def test_the_latest_pause_counts_after_a_resume():
    paused_again = record(
        "chat-a:wave_canary",
        (1, "pause", {}),
        (2, "resume", {}),
        (5, "pause", {}),
    )
    assert se.paused_since(paused_again) == (T0 + datetime.timedelta(minutes=5)).timestamp()
    resumed = r.apply(paused_again, "resume", {}, T0, "sre@ctl")[0]
    assert se.paused_since(resumed) is None


def test_finished_waves_have_only_their_outcome():
    done = record(
        "chat-a:wave_canary",
        (1, "stage_started", {"stage": 0}),
        (2, "rolled_back", {"details": {"mode": "fast"}}),
    )
    state = se.store_state(raw([("chat-a/wave_canary", encoded(done))], [("g", owner(), 20)]))
    assert state["waves"] == [
        {"rollout_id": "chat-a", "wave": "wave_canary", "outcome": "rolled_back"}
    ]
    got = samples(se.render(state))
    wave_series = {name for name, _labels in got if name.startswith("zerolayer_rollout_store_wave")}
    assert wave_series == {"zerolayer_rollout_store_wave_info"}
    assert got[("zerolayer_rollout_store_wave_info", wave_labels(outcome="rolled_back"))] == 1


def test_no_fence_yet_is_epoch_zero():
    state = se.store_state(raw(fence=None))
    assert (state["fence_epoch"], state["unreadable"], state["waves"]) == (0, 0, [])
    assert samples(se.render(state))[("zerolayer_rollout_store_fence_epoch", frozenset())] == 0


@pytest.mark.parametrize(
    "bad",
    [
        ("records", ("verify", b"one")),
        ("records", ("chat-a/wave_rest", b'{"format": 1}')),
        ("records", ("chat-a/wave_rest", b"{")),
        ("owners", ("gpu_nodes", b"not json", 10)),
        ("owners", ("gpu_nodes", b'{"host": "ctl"}', 10)),
        ("fence", b"7"),
        ("fence", b'{"epoch": "4"}'),
    ],
)
def test_a_key_it_does_not_understand_is_counted_and_the_rest_exported(bad):
    where, value = bad
    keys = raw([("chat-a/wave_canary", encoded(record()))], [("gpu_nodes", owner(), 27)])
    if where == "fence":
        keys["fence"] = value
    else:
        keys[where].append(value)
    state = se.store_state(keys)
    assert state["unreadable"] == 1
    assert [wave["wave"] for wave in state["waves"]] == ["wave_canary"]
    text = se.render(state)
    assert samples(text)[("zerolayer_rollout_store_unreadable_keys", frozenset())] == 1
    assert ("zerolayer_rollout_store_fence_epoch" in text) is (where != "fence")


def test_a_store_that_cannot_be_read_gives_only_up_zero_and_the_version():
    def refused(_key):
        raise FleetError("the rollout store cannot be reached (x: refused)")

    unreachable = types.SimpleNamespace(client=types.SimpleNamespace(get=refused), key=store_key)
    state = se.collect(unreachable)
    # Run from the checkout, not from the node artifact: its version says so.
    assert state == {
        "up": False,
        "error": "the rollout store cannot be reached (x: refused)",
        "node_artifact": "unpackaged",
    }
    assert se.render(state) == (
        "# HELP zerolayer_node_artifact_info %s\n# TYPE zerolayer_node_artifact_info gauge\n"
        'zerolayer_node_artifact_info{version="unpackaged"} 1\n'
        "# HELP zerolayer_rollout_store_up %s\n# TYPE zerolayer_rollout_store_up gauge\n"
        "zerolayer_rollout_store_up 0\n"
        % (exposition._HELP["zerolayer_node_artifact_info"], se._HELP["zerolayer_rollout_store_up"])
    )


def test_label_values_are_escaped():
    state = {
        "up": True,
        "fence_epoch": 0,
        "unreadable": 0,
        "waves": [{"rollout_id": "a", "wave": 'w"\\', "outcome": "completed"}],
    }
    assert 'wave="w\\"\\\\"' in se.render(state)


def test_every_family_has_help_and_type():
    state = se.store_state(
        raw(
            [
                ("chat-a/wave_canary", encoded(record("x", (1, "pause", {})))),
                ("chat-a/wave_rest", encoded(deadlined())),
            ],
            [("gpu_nodes", owner(), 27)],
        )
    )
    state["alarms"] = {"NOSPACE": 0, "CORRUPT": 0}  # collect() reads them beside the keys
    state["watchers"] = {"n1": 1}  # and the watchers' presence
    text = se.render(state)
    families = set(re.findall(r"^# TYPE (\S+) gauge$", text, re.MULTILINE))
    assert families == set(se._HELP), "every series is rendered for this state"
    assert set(re.findall(r"^# HELP (\S+) ", text, re.MULTILINE)) == families


def test_promtool_accepts_the_text():
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed")
    state = se.store_state(
        raw(
            [("chat-a/wave_canary", encoded(record("x", (1, "pause", {}))))],
            [("gpu_nodes", owner(), 27)],
        )
    )
    result = subprocess.run(
        [promtool, "check", "metrics"],
        input=se.render(state),
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_store_config_names_what_is_wrong(tmp_path):
    path = tmp_path / "store.json"
    path.write_text(json.dumps({"endpoints": ["https://127.0.0.1:2379"], "node": "x"}))
    with pytest.raises(FleetError, match=r"unknown key\(s\) node; allowed: endpoints, ca"):
        se.store_from_config(str(path))
    path.write_text(json.dumps({"endpoints": []}))
    with pytest.raises(FleetError, match="names no endpoints"):
        se.store_from_config(str(path))
    with pytest.raises(FleetError, match="cannot be read"):
        se.store_from_config(str(tmp_path / "missing.json"))


def test_store_config_builds_the_client(tmp_path):
    password = tmp_path / "exporter.password"
    password.write_text("s3cret\n")
    path = tmp_path / "store.json"
    path.write_text(
        json.dumps(
            {
                "endpoints": ["http://127.0.0.1:2379"],
                "user": "zerolayer-store-exporter",
                "password_file": str(password),
                "prefix": "/zerolayer/",
            }
        )
    )
    store = se.store_from_config(str(path), timeout=1.5)
    assert store.prefix == "/zerolayer/"
    assert (store.client.user, store.client.password, store.client.timeout) == (
        "zerolayer-store-exporter",
        "s3cret",
        1.5,
    )


def test_command_line_refuses_a_bad_port(capsys):
    with pytest.raises(SystemExit) as stopped:
        se.exporter_main(["--store-config", "/nonexistent", "--port", "70000"])
    assert stopped.value.code == 2
    assert "--port must be a TCP port number from 1 to 65535" in capsys.readouterr().err


def test_command_line_reports_a_bad_config(capsys, tmp_path):
    assert se.exporter_main(["--store-config", str(tmp_path / "missing.json")]) == 1
    assert "zerolayer-store-exporter: store config" in capsys.readouterr().err


def test_reader_logs_a_failure_once_and_the_recovery():
    logged = []
    answers = iter([FleetError("down"), FleetError("down"), None])

    def get(_key):
        answer = next(answers)
        if answer is not None:
            raise answer

    client = types.SimpleNamespace(
        get=get, get_prefix=lambda _prefix: [], call=lambda _path, _body: {"alarms": []}
    )
    reader = se.StoreReader(types.SimpleNamespace(client=client, key=store_key), logged.append)
    assert [reader()["up"] for _scrape in range(3)] == [False, False, True]
    assert logged == ["rollout store not read: down\n", "rollout store read again\n"]


def test_http_server_answers_metrics_and_404(monkeypatch):
    state = se.store_state(raw([("chat-a/wave_canary", encoded(record()))]))
    ready = threading.Event()
    servers = []

    def started(server):
        servers.append(server)
        ready.set()

    thread = threading.Thread(
        target=se.serve,
        args=(None, "127.0.0.1", 0),
        kwargs={"ready": started},
        daemon=True,
    )
    # serve() builds its reader from the store; a stand-in that returns the state is enough.
    monkeypatch.setattr(se, "collect", lambda _store, **_options: state)
    try:
        thread.start()
        assert ready.wait(10)
        port = servers[0].server_address[1]
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("GET", "/metrics")
        answer = connection.getresponse()
        body = answer.read().decode()
        assert answer.status == 200
        assert answer.getheader("Content-Type") == se.exposition.CONTENT_TYPE
        assert body == se.render(state)
        connection.request("GET", "/other")
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 404
        connection.close()
    finally:
        if servers:
            servers[0].shutdown()
        thread.join(10)


def deadlined(deadline_s=600, *steps):
    """A wave planned at T0 with a progress deadline, then steps (minutes, action, params)."""
    wave = record("chat-a:wave_canary", *steps)
    wave["progress_deadline"] = {"deadline_s": deadline_s, "abort": False}
    wave["fence_epoch"] = 4  # the fleet's fence in raw(): not fenced
    return wave


@pytest.mark.parametrize(
    "minutes, owners, stuck",
    [
        (9, [], False),  # within the deadline
        (11, [], True),  # past it, nobody owns the wave
        (11, [("gpu_nodes", owner(), 20)], False),  # past it, a live runner holds the scope
        (11, [("gpu_nodes", owner(), -1)], True),  # an owner key whose lease expired
        (11, [("gpu_nodes", owner("chat-b"), 20)], True),  # another rollout's owner
    ],
)
def test_a_wave_is_stuck_past_its_deadline_without_a_live_owner(minutes, owners, stuck):
    now = T0 + datetime.timedelta(minutes=minutes)
    state = se.store_state(raw([("chat-a/wave_canary", encoded(deadlined()))], owners), now)
    (wave,) = state["waves"]
    assert wave["stuck"] is stuck
    got = samples(se.render(state))
    assert got[("zerolayer_rollout_store_wave_stuck", wave_labels())] == (1 if stuck else 0)
    assert got[("zerolayer_rollout_store_wave_progress_deadline_seconds", wave_labels())] == 600
    assert (
        got[("zerolayer_rollout_store_wave_last_progress_timestamp_seconds", wave_labels())]
        == T0.timestamp()
    )


def test_progress_is_the_last_record_write_and_a_paused_wave_is_never_stuck():
    moved = deadlined(600, (8, "stage_started", {"stage": 0}))
    now = T0 + datetime.timedelta(minutes=17)
    (wave,) = se.store_state(raw([("chat-a/wave_canary", encoded(moved))]), now)["waves"]
    assert wave["stuck"] is False, "9 minutes since the stage started, within 10"
    assert wave["last_progress"] == (T0 + datetime.timedelta(minutes=8)).timestamp()
    paused = deadlined(600, (1, "pause", {"reason": "look"}))
    later = T0 + datetime.timedelta(hours=5)
    (wave,) = se.store_state(raw([("chat-a/wave_canary", encoded(paused))]), later)["waves"]
    assert wave["stuck"] is False, "a pause waits for a person: not stuck"


def test_a_wave_without_a_deadline_and_a_finished_wave_are_never_stuck():
    later = T0 + datetime.timedelta(days=3)
    (wave,) = se.store_state(raw([("chat-a/wave_canary", encoded(record()))]), later)["waves"]
    assert (wave["deadline_s"], wave["stuck"]) == (None, False)
    done = deadlined(60, (1, "rolled_back", {}))
    text = se.render(se.store_state(raw([("chat-a/wave_canary", encoded(done))]), later))
    assert "zerolayer_rollout_store_wave_stuck" not in text


def test_a_wave_a_rollback_fenced_is_not_stuck():
    fenced = deadlined()
    fenced["fence_epoch"] = 3  # the fleet's fence is 4 in raw(): a rollback came since
    later = T0 + datetime.timedelta(hours=2)
    (wave,) = se.store_state(raw([("chat-a/wave_canary", encoded(fenced))]), later)["waves"]
    assert wave["stuck"] is False, "its nodes are at 0 already: fenced, not stuck"
    (wave,) = se.store_state(
        raw([("chat-a/wave_canary", encoded(fenced))], fence=b'{"epoch": 3}'), later
    )["waves"]
    assert wave["stuck"] is True


# ---------------------------------------------------------------- alarms and events' retention


def alarm_store(alarms):
    """A stand-in store with no keys whose alarm list is `alarms` (etcd's JSON)."""
    asked = []

    def call(path, body):
        asked.append((path, body))
        return {"alarms": alarms}

    client = types.SimpleNamespace(get=lambda _key: None, get_prefix=lambda _prefix: [], call=call)
    return types.SimpleNamespace(client=client, key=store_key), asked


def test_alarms_are_counted_per_kind_and_known_ones_are_always_there():
    store, asked = alarm_store(
        [
            {"memberID": "1", "alarm": "NOSPACE"},
            {"memberID": "2", "alarm": "NOSPACE"},
            {"memberID": "2", "alarm": "NONE"},
            "not an alarm",
        ]
    )
    assert se.read_alarms(store) == {"NOSPACE": 2, "CORRUPT": 0}
    assert asked == [("/v3/maintenance/alarm", {"action": "GET"})]
    quiet, _asked = alarm_store([])
    got = samples(se.render(se.collect(quiet)))
    assert got[("zerolayer_rollout_store_alarm_active", frozenset({("alarm", "NOSPACE")}))] == 0
    assert got[("zerolayer_rollout_store_alarm_active", frozenset({("alarm", "CORRUPT")}))] == 0


def test_a_store_whose_alarms_cannot_be_read_is_not_up():
    def refused(_path, _body):
        raise FleetError("the rollout store refused /v3/maintenance/alarm: no leader")

    store, _asked = alarm_store([])
    store.client.call = refused
    state = se.collect(store)
    assert (state["up"], state["error"]) == (
        False,
        "the rollout store refused /v3/maintenance/alarm: no leader",
    )


def test_command_line_refuses_a_bad_events_retention(capsys):
    for bad in ("-1", "nan", "10000"):
        with pytest.raises(SystemExit) as stopped:
            se.exporter_main(["--store-config", "/nonexistent", "--events-retention-days", bad])
        assert stopped.value.code == 2
        assert "--events-retention-days must be days from 0" in capsys.readouterr().err


def test_events_prune_runs_after_its_first_wait_and_logs_failures_once(monkeypatch):
    logged, results = (
        [],
        iter(
            [
                {"deleted": 3, "kept": 1, "undated": 0},
                FleetError("down"),
                FleetError("down"),
                {"deleted": 0, "kept": 1, "undated": 0},
            ]
        ),
    )
    calls = []

    def prune(store, retention_s):
        calls.append(retention_s)
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    monkeypatch.setattr(se.events_retention, "prune", prune)
    thread = se.EventsPrune(object(), 86400, log=logged.append)
    for _round in range(4):
        thread.prune_once()
    assert calls == [86400.0] * 4
    assert logged == [
        "events pruned: 3 older than 86400 s deleted, 1 kept",
        "events prune: down",
        "events prune: store read again",
    ]
    with pytest.raises(FleetError, match="retention_s must be a number of seconds above 0"):
        se.EventsPrune(object(), 0)


def test_events_prune_thread_waits_first_then_stops(monkeypatch):
    ran = threading.Event()
    monkeypatch.setattr(se.events_retention, "prune", lambda *_a: ran.set() or {"deleted": 0})
    thread = se.EventsPrune(object(), 60, interval_s=3600, first_s=0.05, log=lambda _l: None)
    thread.start()
    try:
        assert ran.wait(5), "the first prune comes after first_s"
    finally:
        thread.stop()
        thread.join(5)
    assert not thread.is_alive()


def presence_store(present, records=(), refuse_presence=None):
    """A stand-in store whose presence/ holds the nodes present (and one key below a node,
    which names no node), or refuses its read with refuse_presence (an error message)."""

    def get_prefix(prefix):
        if prefix == store_key("presence", ""):
            if refuse_presence:
                raise FleetError(refuse_presence)
            keys = [store_key("presence", node) for node in present]
            keys.append(store_key("presence", "n9", "extra"))
            return [types.SimpleNamespace(key=key, value=b"{}", lease=7) for key in keys]
        if prefix == store_key("rollouts", ""):
            return [
                types.SimpleNamespace(key=store_key("rollouts", key), value=value, lease=0)
                for key, value in records
            ]
        return []

    client = types.SimpleNamespace(
        get=lambda _key: None, get_prefix=get_prefix, call=lambda _path, _body: {"alarms": []}
    )
    return types.SimpleNamespace(client=client, key=store_key)


def wave_with_nodes(*nodes):
    planned = record("chat-a:wave_canary")
    planned["nodes"] = {node: {} for node in nodes}
    return encoded(planned)


def test_watchers_present_are_counted_and_each_known_node_reads_1_or_0():
    known = set()
    store = presence_store(["n1", "n2"], [("chat-a/wave_canary", wave_with_nodes("n1", "n3"))])
    state = se.collect(store, T0, known)
    # n3 is a node of a running wave with no presence: 0; n9/extra names no node.
    assert state["watchers"] == {"n1": 1, "n2": 1, "n3": 0}
    assert known == {"n1", "n2"}
    got = samples(se.render(state))
    assert got[("zerolayer_rollout_store_watchers_present", frozenset())] == 2
    assert got[("zerolayer_rollout_store_watcher_present", frozenset({("node", "n3")}))] == 0
    assert got[("zerolayer_rollout_store_watcher_present", frozenset({("node", "n1")}))] == 1

    # n2's watcher stops: the exporter knew it, so it reads 0 rather than going unexported.
    state = se.collect(presence_store(["n1"]), T0, known)
    assert state["watchers"] == {"n1": 1, "n2": 0}
    got = samples(se.render(state))
    assert got[("zerolayer_rollout_store_watchers_present", frozenset())] == 1
    assert got[("zerolayer_rollout_store_watcher_present", frozenset({("node", "n2")}))] == 0


def test_a_finished_waves_nodes_are_not_expected_to_watch():
    finished = record("chat-a:wave_canary", (1, "abort", {}))
    finished["nodes"] = {"old-node": {}}
    state = se.collect(presence_store([], [("chat-a/wave_canary", encoded(finished))]), T0)
    assert state["watchers"] == {}
    text = se.render(state)
    assert "zerolayer_rollout_store_watchers_present 0" in text
    assert "zerolayer_rollout_store_watcher_present{" not in text


def test_a_user_that_may_not_read_presence_leaves_only_its_series_out():
    store = presence_store(["n1"], refuse_presence="the rollout store refused: permission denied")
    state = se.collect(store, T0)
    assert state["up"] is True and "watchers" not in state
    assert "zerolayer_rollout_store_watcher" not in se.render(state)
    # Any other failure of that read is a failed scrape, as for the other keys.
    state = se.collect(presence_store(["n1"], refuse_presence="etcdserver: no leader"), T0)
    assert state["up"] is False


def test_the_reader_remembers_the_nodes_it_saw_present():
    reader = se.StoreReader(presence_store(["n1"]), log=lambda _line: None)
    assert reader()["watchers"] == {"n1": 1}
    reader.store.client.get_prefix = presence_store([]).client.get_prefix
    assert reader()["watchers"] == {"n1": 0}
