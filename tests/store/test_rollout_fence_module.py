"""rollout_fence through Ansible against a real etcd: raise and count in one call, the count's
rules, and bad input refused with the field named."""

import json
import os
import subprocess

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def rollout_fence(etcd_url, prefix, **args):
    """One ad hoc run of the module on localhost; its result."""
    env = dict(
        os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.posix.json", ANSIBLE_LOAD_CALLBACK_PLUGINS="1"
    )
    argv = [
        os.path.join(REPO, ".venv", "bin", "ansible"),
        "localhost", "-i", "localhost,", "-c", "local",
        "-e", "ansible_python_interpreter=/usr/bin/python3",
        "-m", "zerolayer.fleet.rollout_fence",
        "-a", json.dumps(dict(args, endpoints=[etcd_url], prefix=prefix)),
    ]  # fmt: skip
    proc = subprocess.run(
        argv, cwd=REPO, env=env, capture_output=True, text=True, check=False, timeout=120
    )
    try:
        return json.loads(proc.stdout)["plays"][0]["tasks"][0]["hosts"]["localhost"]
    except (ValueError, KeyError, IndexError):
        pytest.fail("ansible printed no result (rc %d): %s %s" % (
            proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:]))  # fmt: skip


def test_raise_with_nodes_counts_their_acknowledgements_in_the_same_call(etcd_url, store):
    # n1's watcher has acknowledged an epoch at or above any the raise can make.
    store.client.put(store.key("acks", "n1"), {"epoch": 99, "action": "fast", "confirmed": True})
    raised = rollout_fence(
        etcd_url, store.prefix, action="raise", rollback_mode="fast", reason="test",
        nodes=["n1", "n2"], wait_s=5, quiet_s=0.2,
    )  # fmt: skip
    assert raised["store_updated"] is True and raised["fence"]["epoch"] == 1, raised
    assert list(raised["acked"]) == ["n1"] and raised["lagging"] == ["n2"], raised
    assert raised["acked"]["n1"]["seen_after_s"] >= 0
    # The quiet rule ended it long before wait_s: n2 gets the push that much sooner.
    assert raised["waited_s"] < 3, raised


def test_raise_without_nodes_counts_nothing(etcd_url, store):
    raised = rollout_fence(etcd_url, store.prefix, action="raise", reason="test")
    assert raised["store_updated"] is True and "acked" not in raised, raised


@pytest.mark.parametrize(
    "args, field",
    [
        ({"action": "raise", "nodes": ["n1"], "quiet_s": 0}, "quiet_s"),
        ({"action": "wait_acks", "epoch": 1, "nodes": ["n1"], "quiet_s": -1}, "quiet_s"),
        ({"action": "wait_acks", "epoch": 0, "nodes": ["n1"]}, "epoch"),
        ({"action": "wait_acks", "epoch": 1, "nodes": ["n1"], "wait_s": -1}, "wait_s"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_the_fence_stays(etcd_url, store, args, field):
    refused = rollout_fence(etcd_url, store.prefix, **args)
    assert refused.get("failed") and refused["field"] == field, refused
    assert store.fence()["epoch"] == 0, "a refused call raised the fence"
