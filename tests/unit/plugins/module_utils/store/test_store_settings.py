"""Where `zerolayer` finds its rollout store (module_utils/store/store_settings.py) and its options
anywhere on the line (rollout_cli.parse_args). The inventory source runs the real `ansible`
against a throw-away inventory; nothing here reaches a store."""

import json
import os
import subprocess
import sys

import pytest
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError
from ansible_collections.zerolayer.fleet.plugins.module_utils.controller import rollout_cli
from ansible_collections.zerolayer.fleet.plugins.module_utils.store import store_settings

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", "..", ".."))
PLAYBOOKS = os.path.join(REPO, "playbooks")
SECRET = "not-to-be-shown"  # noqa: S105 (a value the tests look for in the output)
SETTINGS = {
    "endpoints": ["https://10.0.0.1:2379"],
    "ca_file": "/pki/ca.pem",
    "user": "zerolayer-controller",
    "password_file": "/pki/controller.password",
    "prefix": "/zerolayer/",
}


def write(path, payload):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))
    return str(path)


def no_inventory(*_argv, **_kwargs):
    raise AssertionError("the inventory must not be read when an earlier source names a store")


@pytest.fixture
def home(tmp_path):
    """An environment with a home of its own and no store variable."""
    return {"HOME": str(tmp_path / "home")}


def test_the_user_file_follows_xdg_config_home(tmp_path):
    assert store_settings.user_config_path({"HOME": "/h"}) == "/h/.config/zerolayer/store.json"
    assert (
        store_settings.user_config_path({"HOME": "/h", "XDG_CONFIG_HOME": "/x"})
        == "/x/zerolayer/store.json"
    )


def test_store_config_wins_over_the_variable_and_the_user_file(tmp_path, home):
    named = write(tmp_path / "named.json", dict(SETTINGS, prefix="/named/"))
    home["ZEROLAYER_STORE_CONFIG"] = write(tmp_path / "env.json", dict(SETTINGS, prefix="/env/"))
    write(tmp_path / "home" / ".config" / "zerolayer" / "store.json", SETTINGS)
    settings, source = store_settings.find(named, [], {}, home, PLAYBOOKS, run=no_inventory)
    assert settings["prefix"] == "/named/" and source == "--store-config %s" % named


def test_the_variable_wins_over_the_user_file(tmp_path, home):
    path = write(tmp_path / "env.json", dict(SETTINGS, prefix="/env/"))
    home["ZEROLAYER_STORE_CONFIG"] = path
    write(tmp_path / "home" / ".config" / "zerolayer" / "store.json", SETTINGS)
    settings, source = store_settings.find(None, [], {}, home, PLAYBOOKS, run=no_inventory)
    assert settings["prefix"] == "/env/"
    assert source == "$ZEROLAYER_STORE_CONFIG (%s)" % path


def test_the_user_file_wins_over_the_inventory(tmp_path, home):
    path = write(tmp_path / "home" / ".config" / "zerolayer" / "store.json", SETTINGS)
    settings, source = store_settings.find(None, ["inv"], {}, home, PLAYBOOKS, run=no_inventory)
    assert settings == SETTINGS and source == path


def test_options_replace_what_the_source_holds_and_can_stand_alone(tmp_path, home):
    write(tmp_path / "home" / ".config" / "zerolayer" / "store.json", SETTINGS)
    settings, source = store_settings.find(
        None, [], {"user": "me", "ca_file": None}, home, PLAYBOOKS, run=no_inventory
    )
    assert settings == dict(SETTINGS, user="me")
    assert source.endswith("store.json, with command-line options")
    alone, source = store_settings.find(
        None, [], {"endpoints": ["https://e:2379"]}, {"HOME": "/nonexistent"}, PLAYBOOKS,
        run=no_inventory,
    )  # fmt: skip
    assert alone == {"endpoints": ["https://e:2379"]} and source == "command-line options"


@pytest.mark.parametrize("content", ["{not json", "[1, 2]"])
def test_a_named_file_that_cannot_be_read_is_an_error_not_a_fallback(tmp_path, home, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    write(tmp_path / "home" / ".config" / "zerolayer" / "store.json", SETTINGS)
    with pytest.raises(FleetError) as caught:
        store_settings.find(str(bad), [], {}, home, PLAYBOOKS, run=no_inventory)
    assert str(bad) in caught.value.message
    assert caught.value.details == {"field": "store_config", "outcome": "bad_input"}


def test_a_misspelt_key_is_named_with_the_allowed_ones(tmp_path, home):
    path = write(tmp_path / "store.json", {**SETTINGS, "ca-file": "/pki/ca.pem"})
    with pytest.raises(FleetError) as caught:
        store_settings.find(path, [], {}, home, PLAYBOOKS, run=no_inventory)
    assert "unknown key ca-file" in caught.value.message and "ca_file" in caught.value.message
    assert caught.value.details == {"field": "ca-file", "outcome": "bad_input"}


def test_nothing_found_names_every_place_looked_at(tmp_path, home):
    def empty_inventory(argv, **_kwargs):
        return subprocess.CompletedProcess(argv, 0, 'localhost | SUCCESS => {"msg": {}}', "")

    with pytest.raises(FleetError) as caught:
        store_settings.find(None, [], {}, home, PLAYBOOKS, run=empty_inventory)
    message = caught.value.message
    for place in ("--store-config", "$ZEROLAYER_STORE_CONFIG", "store.json (absent)",
                  "ansible.cfg's inventory (no rollout_store_endpoints)"):  # fmt: skip
        assert place in message, message


def test_an_inventory_ansible_cannot_read_is_an_error_naming_it(tmp_path, home):
    def failing(argv, **_kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "ERROR! no such inventory")

    with pytest.raises(FleetError) as caught:
        store_settings.find(None, ["/no/inv"], {}, home, PLAYBOOKS, run=failing)
    assert "/no/inv" in caught.value.message and "no such inventory" in caught.value.message
    assert caught.value.details["field"] == "inventory"


def test_the_inventory_is_rendered_by_ansible_with_paths_resolved(tmp_path, home):
    """The real `ansible`: group_vars templated as a playbook sees them (playbook_dir is the
    collection's playbooks), paths made absolute as the store's play writes them."""
    inventory = tmp_path / "inventory"
    (inventory / "group_vars").mkdir(parents=True)
    (inventory / "hosts.yml").write_text("all:\n  hosts:\n    node-1:\n")
    (inventory / "group_vars" / "all.yml").write_text(
        "store_host: 10.9.8.7\n"
        "rollout_store_endpoints: ['https://{{ store_host }}:2379']\n"
        "rollout_store_ca_file: '{{ playbook_dir }}/../pki/ca.pem'\n"
        "rollout_store_user: ctl\n"
    )
    settings, source = store_settings.find(None, [str(inventory)], {}, home, PLAYBOOKS)
    assert source == "inventory %s" % inventory
    assert settings == {
        "endpoints": ["https://10.9.8.7:2379"],
        "ca_file": os.path.realpath(os.path.join(REPO, "pki", "ca.pem")),
        "user": "ctl",
    }


def test_describe_hides_secrets_and_shows_paths():
    shown = store_settings.describe({**SETTINGS, "password": SECRET, "token": SECRET}, "here")
    assert shown["source"] == "here"
    assert {shown["settings"][key] for key in ("password", "token")} == {"(hidden)"}
    assert shown["settings"]["password_file"] == SETTINGS["password_file"]
    assert SECRET not in json.dumps(shown)


# ------------------------------------------------------------ options anywhere


@pytest.mark.parametrize(
    "argv",
    [
        ["rollout", "status", "chat", "-o", "json", "--prefix", "/p/"],
        ["-o", "json", "--prefix", "/p/", "rollout", "status", "chat"],
        ["-o", "json", "rollout", "status", "--prefix", "/p/", "chat"],
    ],
)
def test_global_options_go_before_or_after_the_verb(argv):
    args = rollout_cli.parse_args(argv)
    assert (args.output, args.prefix, args.rollout_id) == ("json", "/p/", "chat")


def test_options_nobody_gave_take_their_defaults():
    args = rollout_cli.parse_args(["rollout", "abort", "chat"])
    assert args.output == "table" and args.inventory == [] and args.store_config is None
    args = rollout_cli.parse_args(["rollout", "abort", "chat", "-i", "a", "-i", "b"])
    assert args.inventory == ["a", "b"]
    assert rollout_cli.parse_args(["rollout", "report", "chat", "--json"]).output == "json"


def test_a_bad_output_names_the_allowed_values():
    with pytest.raises(rollout_cli.UsageError) as caught:
        rollout_cli.parse_args(["rollout", "status", "-o", "yaml"])
    assert "table" in str(caught.value) and "json" in str(caught.value)


def test_version_and_config_by_the_command_itself(tmp_path):
    """scripts/zerolayer run by its path: --version is the collection's; config shows the
    source and the settings, secrets hidden."""
    command = [sys.executable, os.path.join(REPO, "scripts", "zerolayer")]
    version = subprocess.run(
        [*command, "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        expected = [line.split(":", 1)[1].strip() for line in handle if line.startswith("version:")]
    assert version.stdout.strip() == "zerolayer %s" % expected[0]
    password_file = tmp_path / "controller.password"
    password_file.write_text(SECRET)
    path = write(tmp_path / "store.json", {**SETTINGS, "password_file": str(password_file)})
    shown = subprocess.run(
        [*command, "config", "--store-config", path, "-o", "json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert json.loads(shown.stdout)["source"] == "--store-config %s" % path
    assert SECRET not in shown.stdout
