"""zerolayer-routectl argument handling: every refusal is one JSON line naming the field.

These cases fail before any BPF object is touched, so they need no kernel; the
subcommands' effects are tested on a real kernel in tests/dataplane.
"""

import io
import json
import os

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli


def invoke(argv):
    out, err = io.StringIO(), io.StringIO()
    status = node_cli.run(argv, stdout=out, stderr=err)
    return status, out.getvalue(), err.getvalue()


def refused(argv):
    status, out, err = invoke(argv)
    assert status == node_cli.EXIT_REJECTED
    assert out == ""
    assert err.count("\n") == 1, "exactly one JSON line on stderr"
    return json.loads(err)


@pytest.fixture
def missing_config(tmp_path):
    """--config pointing nowhere, so the machine's /etc/zerolayer never leaks in."""
    return ["--config", str(tmp_path / "absent.json")]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ([], "command"),
        (["frobnicate"], "command"),
        (["set-weight"], "route"),
        (["set-weight", "--route", "chat"], "weight"),
        (["set-weight", "--route", "chat", "--weight"], "weight"),
        (["register", "--route", "chat", "--slot", "x", "--port", "8101", "--pid", "1"], "slot"),
        (["register", "--route", "chat", "--slot", "-1", "--port", "8101", "--pid", "1"], "slot"),
        (["register", "--route", "chat", "--slot", "0", "--port", "8101"], "pid"),
        (
            ["register", "--route", "c", "--slot", "0", "--port", "1", "--pid", "1", "--unit", "u"],
            "unit",
        ),
        (["register", "--route", "c", "--slot", "0", "--port", "1", "--pid", "one"], "pid"),
        (
            [
                "register",
                "--route",
                "c",
                "--slot",
                "0",
                "--port",
                "1",
                "--pid",
                "1",
                "--timeout",
                "x",
            ],
            "timeout",
        ),
        (["show", "--verbose"], "argv"),
    ],
)
def test_usage_errors_name_the_option(argv, field, missing_config):
    error = refused(missing_config + argv)
    assert error["field"] == field, error
    assert error["error"]


@pytest.mark.parametrize(
    ("argv", "field", "words"),
    [
        (["set-weight", "--route", "chat", "--weight", "101"], "weight", "from 0 to 100"),
        (["set-weight", "--route", "chat", "--weight", "12.345"], "weight", "two decimals"),
        (["set-weight", "--route", "chat", "--weight", "ten"], "weight", "percentage"),
        (["set-weight", "--route", "bad name", "--weight", "5"], "route", "letters, digits"),
        (
            ["register", "--route", "chat", "--slot", "8", "--port", "8101", "--pid", "1"],
            "slot",
            "0 to 7",
        ),
        (
            ["register", "--route", "chat", "--slot", "0", "--port", "70000", "--pid", "1"],
            "port",
            "1 to 65535",
        ),
        (
            ["register", "--route", "chat", "--slot", "0", "--port", "http", "--pid", "1"],
            "port",
            "TCP port",
        ),
    ],
)
def test_values_are_checked_before_the_kernel(argv, field, words, missing_config):
    error = refused(missing_config + argv)
    assert error["field"] == field
    assert words in error["error"]


def test_relative_pin_dir_is_refused(missing_config):
    error = refused([*missing_config, "--pin-dir", "relative/dir", "rollback"])
    assert error["field"] == "pin_dir"


def test_pin_dir_may_follow_the_subcommand(tmp_path, missing_config):
    error = refused([*missing_config, "show", "--pin-dir", "not/absolute"])
    assert error["field"] == "pin_dir"


def test_unpinned_router_is_refused_naming_pin_dir(tmp_path, missing_config):
    pin_dir = str(tmp_path / "no-router")
    error = refused(
        [*missing_config, "--pin-dir", pin_dir, "set-weight", "--route", "chat", "--weight", "5"]
    )
    assert error["field"] == "pin_dir"
    assert pin_dir in error["error"]
    assert not os.path.exists(pin_dir)


def test_pin_dir_comes_from_the_config(tmp_path):
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"pin_dir": str(tmp_path / "from-config")}))
    error = refused(["--config", str(config), "rollback"])
    assert str(tmp_path / "from-config") in error["error"]


def test_unreadable_config_names_config(tmp_path):
    config = tmp_path / "router.json"
    config.write_text("{not json")
    error = refused(["--config", str(config), "show"])
    assert error["field"] == "config"


def test_attach_requires_the_config(missing_config):
    error = refused([*missing_config, "attach"])
    assert error["field"] == "config"


def test_attach_refuses_malformed_routes(tmp_path):
    config = tmp_path / "router.json"
    config.write_text(json.dumps({"pin_dir": str(tmp_path / "p"), "routes": [{"name": "x"}]}))
    error = refused(["--config", str(config), "attach"])
    assert error["field"] == "routes"


def test_show_without_router_reports_nothing_attached(tmp_path, missing_config):
    status, out, err = invoke([*missing_config, "--pin-dir", str(tmp_path / "none"), "show"])
    assert status == 0, err
    shown = json.loads(out)
    assert shown["router"]["attached"] is False
    assert shown["routes"] == []


def test_register_hook_wants_four_arguments(capsys):
    assert node_cli.register_hook_main(["chat", "0", "8101"]) == node_cli.EXIT_REJECTED
    error = json.loads(capsys.readouterr().err)
    assert error["field"] == "argv"
    assert "ROUTE SLOT PORT UNIT" in error["error"]


def test_register_hook_maps_positions_to_options(monkeypatch):
    seen = []
    monkeypatch.setattr(node_cli, "run", lambda argv: seen.append(argv) or 0)
    assert node_cli.register_hook_main(["chat", "1", "8101", "engine-a.service"]) == 0
    assert seen == [
        [
            "register",
            "--route",
            "chat",
            "--slot",
            "1",
            "--port",
            "8101",
            "--unit",
            "engine-a.service",
        ]
    ]


def test_help_is_not_an_error():
    with pytest.raises(SystemExit) as exit_info:
        node_cli.build_parser().parse_args(["--help"])
    assert exit_info.value.code == 0
