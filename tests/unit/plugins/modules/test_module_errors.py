"""A module fails with one clear message, never a traceback, whatever module_utils raises."""

import ast
import errno
import glob
import json
import os
import struct

import pytest
from ansible.module_utils.testing import patch_module_args
from ansible_collections.zerolayer.fleet.plugins.module_utils.common import errors
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.modules import route_info

MODULES_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", "plugins", "modules")
PIN = "/sys/fs/bpf/zerolayer/maps/zl_routes"


def run_main(module, monkeypatch, capsys, error, **args):
    """Run module.main() with router_report raising error; return (exit code, result)."""

    def raise_error(_layout):
        raise error

    monkeypatch.setattr(module, "router_report", raise_error)
    with patch_module_args(args), pytest.raises(SystemExit) as exited:
        module.main()
    return exited.value.code, json.loads(capsys.readouterr().out)


def test_an_os_error_fails_with_its_errno_and_path(monkeypatch, capsys):
    error = PermissionError(errno.EACCES, os.strerror(errno.EACCES), PIN)
    code, result = run_main(route_info, monkeypatch, capsys, error)
    assert code == 1
    assert result["failed"] is True
    assert result["msg"] == "system call failed on %s: Permission denied (EACCES)" % PIN
    assert (result["errno"], result["errno_name"], result["path"]) == (13, "EACCES", PIN)
    assert result["error_type"] == "PermissionError"
    assert "exception" not in result and "Traceback" not in json.dumps(result)


def test_an_os_error_without_a_path_still_names_the_errno(monkeypatch, capsys):
    _code, result = run_main(route_info, monkeypatch, capsys, OSError(errno.EIO, "I/O error"))
    assert result["msg"] == "system call failed: I/O error (EIO)"
    assert "path" not in result


@pytest.mark.parametrize(
    ("error", "message"),
    [
        (KeyError("weight_bp"), "(KeyError): missing key 'weight_bp'"),
        (ValueError("bad utf-8 in route name"), "(ValueError): bad utf-8 in route name"),
        (struct.error("unpack requires 56 bytes"), "(struct.error): unpack requires 56 bytes"),
    ],
    ids=["KeyError", "ValueError", "struct.error"],
)
def test_bad_data_fails_with_what_was_wrong(monkeypatch, capsys, error, message):
    code, result = run_main(route_info, monkeypatch, capsys, error)
    assert code == 1
    assert result["msg"] == "unexpected data " + message


def test_a_fleet_error_keeps_its_message_and_details(monkeypatch, capsys):
    error = FleetError("pin_dir /x must be on a bpffs", {"field": "pin_dir"})
    _code, result = run_main(route_info, monkeypatch, capsys, error)
    assert (result["msg"], result["field"]) == ("pin_dir /x must be on a bpffs", "pin_dir")


def test_a_programming_error_is_not_disguised():
    """Only the failures module_utils can meet at run time are caught: a TypeError is a bug."""
    assert not issubclass(TypeError, errors.MODULE_FAILURES)
    assert isinstance(errors.as_fleet_error(FileNotFoundError(2, "x", "/p")), FleetError)


def main_handlers(path):
    """The exception names each except clause of a module's main() catches."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    (main,) = [
        node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main"
    ]
    return [
        ast.unparse(node.type) for node in ast.walk(main) if isinstance(node, ast.ExceptHandler)
    ]


@pytest.mark.parametrize(
    "path",
    sorted(glob.glob(os.path.join(MODULES_DIR, "*.py"))),
    ids=os.path.basename,
)
def test_every_module_hands_its_failures_to_the_shared_helper(path):
    handlers = main_handlers(path)
    assert "MODULE_FAILURES" in handlers, handlers
    assert "FleetError" not in handlers, "a bare FleetError clause lets OSError through"


def test_the_commands_bad_input_is_one_fleet_error_with_exit_status_2(capsys):
    """zerolayer-routectl and zerolayer raise the same UsageError, a FleetError, and still
    answer it as before: exit 2, the field named (routectl's JSON) or the message (zerolayer)."""
    from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
    from ansible_collections.zerolayer.fleet.plugins.module_utils.node import node_cli

    assert node_cli.UsageError is rollout_cli.UsageError is errors.UsageError
    assert issubclass(errors.UsageError, FleetError)
    error = errors.UsageError("--weight must be a number", "weight")
    assert str(error) == error.message == "--weight must be a number"
    assert error.field == error.details["field"] == "weight"
    assert node_cli.run(["set-weight"]) == node_cli.EXIT_REJECTED == 2
    assert json.loads(capsys.readouterr().err)["field"] == "route"
    assert rollout_cli.main(["rollout", "status", "-o", "yaml"]) == rollout_cli.EXIT_BAD_INPUT
    assert capsys.readouterr().err.startswith("zerolayer: ")
