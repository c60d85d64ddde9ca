"""Bad input for every zerolayer-routectl subcommand and router module: refused, nothing changed.

Each case must fail with a message that names the field (and the allowed values where
there are some), and leave every map of the router and the node's fence file byte for
byte as they were.
"""

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

from .conftest import ENGINE_PORT, maps_bytes, routectl
from .test_modules import ansible


def register(route="chat", slot="0", port="9001", pid=("--pid", "1")):
    return ["register", "--route", route, "--slot", slot, "--port", port, *pid]


def fence_bytes(layout):
    try:
        with open(layout.fence_file, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


ROUTECTL_CASES = [
    (["set-weight", "--route", "chat", "--weight", "250"], "weight", "from 0 to 100"),
    (["set-weight", "--route", "chat", "--weight", "-1"], "weight", "0"),
    (["set-weight", "--route", "chat", "--weight", "abc"], "weight", "from 0 to 100"),
    (["set-weight", "--route", "chat", "--weight", "12.345"], "weight", "two decimals"),
    (["set-weight", "--route", "chat\n", "--weight", "5"], "route", "letters, digits"),
    (["set-weight", "--route", "nosuch", "--weight", "5"], "route", "known routes: chat"),
    (["set-weight", "--route", "chat", "--weight", "5", "--epoch", "x"], "epoch", "integer"),
    (["set-weight", "--route", "chat"], "weight", "required"),
    (["set-weight", "--route", "chat", "--hash", "address"], "hash", "one of connection, client"),
    (["set-weight", "--route", "chat", "--weight", "5", "--hash", "CLIENT"], "hash",
     "one of connection, client"),
    (["set-weight", "--route", "chat", "--hash", ""], "hash", "one of connection, client"),
    (register(slot="9"), "slot", "0 to 7"),
    (register(port="70000"), "port", "1 to 65535"),
    (register(port="0"), "port", "1 to 65535"),
    (register(pid=()), "pid", "--pid --unit"),
    (register(route="nosuch"), "route", "known routes"),
    (["rollback", "--epoch", "-3"], "epoch", None),
    (["detach", "--epoch", "x"], "epoch", "integer"),
    (["show", "--bogus"], "argv", None),
    (["no-such-command"], "command", None),
]  # fmt: skip


@pytest.mark.parametrize(
    "argv, field, allowed", ROUTECTL_CASES, ids=[" ".join(case[0]) for case in ROUTECTL_CASES]
)
def test_routectl_refuses_bad_input_and_changes_nothing(attached, argv, field, allowed):
    before, fence_before = maps_bytes(attached), fence_bytes(attached)
    status, error = routectl(attached, *argv)
    assert status == node_cli.EXIT_REJECTED, error
    assert error["field"] == field, error
    if allowed:
        assert allowed in error["error"], error
    assert maps_bytes(attached) == before
    assert fence_bytes(attached) == fence_before


MODULE_CASES = [
    ("route", {"name": "chat", "weight": "250"}, "weight must be a percentage from 0 to 100"),
    ("route", {"name": "chat", "hash": "address"},
     "value of hash must be one of: connection, client"),
    ("engine_socket", {"route": "chat", "slot": "9", "listen_port": ENGINE_PORT, "pid": "1"},
     "slot must be an integer from 0 to 7"),
    ("engine_socket", {"route": "nosuch", "slot": "0", "listen_port": ENGINE_PORT, "pid": "1"},
     "route 'nosuch' is not a known route"),
    ("router", {"state": "sideways"}, "value of state must be one of: attached, detached, absent"),
    ("router", {"state": "detached", "epoch": "minus"}, "epoch"),
]  # fmt: skip


@pytest.mark.parametrize(
    "module, args, message",
    MODULE_CASES,
    ids=["%s %s" % (case[0], case[1]) for case in MODULE_CASES],
)
def test_modules_refuse_bad_input_and_change_nothing(attached, module, args, message):
    before, fence_before = maps_bytes(attached), fence_bytes(attached)
    result = ansible(module, pin_dir=attached.pin_dir, fence_file=attached.fence_file, **args)
    assert result.get("failed") is True, result
    assert message in result["msg"], result["msg"]
    assert maps_bytes(attached) == before
    assert fence_bytes(attached) == fence_before
