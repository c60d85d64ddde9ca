"""One module of the collection run ad hoc on localhost against the test's etcd, as a
playbook would run it; returns its result (the JSON callback's view of it)."""

import json
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def run_module(module, etcd_url, prefix, check=False, diff=False, **args):
    env = dict(
        os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"
    )
    argv = [
        os.path.join(REPO, ".venv", "bin", "ansible"),
        "localhost", "-i", "localhost,", "-c", "local",
        "-e", "ansible_python_interpreter=/usr/bin/python3",
        "-m", "zerolayer.fleet.%s" % module,
        "-a", json.dumps(dict(args, endpoints=[etcd_url], prefix=prefix)),
    ] + (["--check"] if check else []) + (["--diff"] if diff else [])  # fmt: skip
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120
    )
    try:
        return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        pytest.fail("ansible printed no result (rc %d): %s %s" % (
            proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))  # fmt: skip
