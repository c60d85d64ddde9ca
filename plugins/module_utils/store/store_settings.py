# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Where the operator's command finds its rollout store, first match wins (as kubectl finds
its cluster):

  1. --store-config FILE
  2. $ZEROLAYER_STORE_CONFIG
  3. the per-user file the store's play writes for the controller:
     $XDG_CONFIG_HOME/zerolayer/store.json, else ~/.config/zerolayer/store.json
  4. the inventory: -i INVENTORY (repeatable), else the one ansible.cfg or $ANSIBLE_INVENTORY
     names, read for the rollout_store_* variables as a playbook on the controller sees them

Options given on the command line (--endpoints, --ca-file, ...) then replace the matching
settings of whichever source was found, or stand alone. A file named by 1 or 2 that cannot
be read is an error, never a reason to try the next source: a person who names a file means
that file.

The settings are paths and names only: the password stays in its file. `describe` shows
them for `zerolayer config` and hides any value whose key names a secret.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

CONFIG_ENV = "ZEROLAYER_STORE_CONFIG"
KEYS = ("endpoints", "ca_file", "cert_file", "key_file", "user", "password_file", "prefix")
# What a settings file may hold: the keys above and the client's timeout.
ALLOWED_KEYS = (*KEYS, "timeout")
SECRET_WORDS = ("password", "token", "secret")
INVENTORY_TIMEOUT_S = 60


def user_config_path(environ):
    """The per-user store settings file: $XDG_CONFIG_HOME/zerolayer/store.json or
    ~/.config/zerolayer/store.json."""
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(
        environ.get("HOME") or os.path.expanduser("~"), ".config"
    )
    return os.path.join(base, "zerolayer", "store.json")


def read_settings_file(path, field):
    try:
        with open(path) as handle:
            settings = json.load(handle)
    except (OSError, ValueError) as exc:
        raise FleetError(
            "store config %s cannot be read: %s" % (path, exc),
            {"field": field, "outcome": "bad_input"},
        ) from None
    if not isinstance(settings, dict):
        raise FleetError(
            "store config %s must hold a JSON object with %s; got %s"
            % (path, ", ".join(KEYS), type(settings).__name__),
            {"field": field, "outcome": "bad_input"},
        )
    # A misspelt key (ca-file, endpoint) would silently mean "not set": name it instead.
    unknown = sorted(set(settings) - set(ALLOWED_KEYS))
    if unknown:
        raise FleetError(
            "store config %s: unknown key %s; the keys are %s"
            % (path, ", ".join(unknown), ", ".join(ALLOWED_KEYS)),
            {"field": unknown[0], "outcome": "bad_input"},
        )
    return settings


def inventory_settings(inventories, playbook_dir, run=subprocess.run):
    """The rollout_store_* variables of localhost in the inventories (the configured one when
    none is given; rollout_store_timeout included), rendered by Ansible itself: {} when they
    name no endpoints."""
    expression = "{{ {%s} | to_json }}" % ", ".join(
        "'%s': rollout_store_%s | default(none)" % (key, key) for key in ALLOWED_KEYS
    )
    argv = [_ansible_command(), "localhost", "--playbook-dir", playbook_dir]
    for inventory in inventories:
        argv += ["-i", inventory]
    argv += ["-m", "ansible.builtin.debug", "-a", "msg=%s" % expression]
    # The ad hoc command's own output (the minimal callback, part of ansible-core): whatever
    # stdout callback the person's ansible.cfg loads for playbooks is left out.
    env = dict(
        os.environ,
        ANSIBLE_LOAD_CALLBACK_PLUGINS="0",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_CALLBACK_RESULT_FORMAT="json",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    try:
        result = run(
            argv,
            env=env,
            capture_output=True,
            text=True,
            timeout=INVENTORY_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise FleetError(
            "the inventory could not be read for the rollout store (%s): %s"
            % (" ".join(inventories) or "ansible.cfg's inventory", exc),
            {"field": "inventory", "outcome": "bad_input"},
        ) from None
    try:
        # "localhost | SUCCESS => {...}"
        message = json.loads(result.stdout.split(" => ", 1)[1])["msg"]
        settings = message if isinstance(message, dict) else json.loads(message)
    except (ValueError, KeyError, IndexError, TypeError):
        raise FleetError(
            "the inventory %s could not be read for the rollout store (ansible exited %d): %s"
            % (
                " ".join(inventories) or "of ansible.cfg",
                result.returncode,
                (result.stderr or result.stdout).strip()[-600:],
            ),
            {"field": "inventory", "outcome": "bad_input"},
        ) from None
    settings = {key: value for key, value in settings.items() if value not in (None, "", [])}
    # Paths as the store's play writes them (its realpath filter): ../ and links resolved.
    for key in [key for key in settings if key.endswith("_file")]:
        settings[key] = os.path.realpath(settings[key])
    return settings if settings.get("endpoints") else {}


def _ansible_command():
    """`ansible` beside this Python (a virtual environment's), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "ansible")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("ansible") or "ansible"


def find(store_config, inventories, overrides, environ, playbook_dir, run=subprocess.run):
    """(settings, source): the first source that names a store, with the command line's
    options over it. Raises FleetError naming every place it looked when none does."""
    overrides = {key: value for key, value in overrides.items() if value}
    looked = []
    settings, source = None, None
    if store_config:
        settings = read_settings_file(store_config, "store_config")
        source = "--store-config %s" % store_config
    elif environ.get(CONFIG_ENV):
        path = environ[CONFIG_ENV]
        settings, source = read_settings_file(path, CONFIG_ENV), "$%s (%s)" % (CONFIG_ENV, path)
    else:
        looked += ["--store-config", "$%s" % CONFIG_ENV]
        path = user_config_path(environ)
        if os.path.exists(path):
            settings, source = read_settings_file(path, "store_config"), path
        else:
            looked.append("%s (absent)" % path)
    if settings is None and not overrides.get("endpoints"):
        settings = inventory_settings(inventories, playbook_dir, run)
        where = "inventory %s" % " ".join(inventories) if inventories else "ansible.cfg's inventory"
        if settings:
            source = where
        else:
            looked.append("%s (no rollout_store_endpoints)" % where)
    settings = dict(settings or {})
    if overrides:
        settings.update(overrides)
        source = "%s, with command-line options" % source if source else "command-line options"
    if not settings.get("endpoints"):
        raise FleetError(
            "no rollout store found; looked at %s. Run the store's play (playbooks/site.yml, "
            "tag rollout_store), which writes %s, or give --store-config FILE, -i INVENTORY or "
            "--endpoints URL" % (", ".join(looked), user_config_path(environ)),
            {"field": "store_config", "outcome": "bad_input"},
        )
    return settings, source


def describe(settings, source):
    """What `zerolayer config` shows: the source and the settings, secrets hidden."""
    shown = {}
    for key, value in sorted(settings.items()):
        secret = any(word in key for word in SECRET_WORDS) and not key.endswith("_file")
        shown[key] = "(hidden)" if secret else value
    return {"source": source, "settings": shown}
