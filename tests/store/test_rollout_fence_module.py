"""rollout_fence through Ansible against a real etcd: raise and count in one call, the count's
rules, and bad input refused with the field named."""

import json
import os
import subprocess
import sys

import pytest

from .adhoc import REPO, run_module


def rollout_fence(etcd_url, prefix, **args):
    return run_module("rollout_fence", etcd_url, prefix, **args)


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


def test_wait_direct_collects_the_watchers_reports_of_the_epoch_or_later(etcd_url, store):
    def report(epoch, drained):
        return {
            "epoch": epoch,
            "drained": drained,
            "first": {"chat": 2},
            "left": {} if drained else {"chat": 1},
            "drained_after_s": 0.3 if drained else None,
        }

    store.client.put(store.key("acks", "n1", "direct"), report(4, True))
    store.client.put(store.key("acks", "n2", "direct"), report(5, False))
    store.client.put(store.key("acks", "n3", "direct"), report(3, True))  # an older rollback's
    store.client.put(store.key("acks", "n4"), {"epoch": 4, "confirmed": True})  # no report
    store.client.put(store.key("acks", "stranger", "direct"), report(4, True))  # not asked
    collected = rollout_fence(
        etcd_url, store.prefix, action="wait_direct", epoch=4,
        nodes=["n1", "n2", "n3", "n4"], wait_s=0.5,
    )  # fmt: skip
    assert sorted(collected["direct"]) == ["n1", "n2"], collected
    assert collected["direct"]["n2"]["left"] == {"chat": 1}
    assert collected["unreported"] == ["n3", "n4"]


@pytest.mark.parametrize(
    "args, field",
    [
        ({"action": "raise", "nodes": ["n1"], "quiet_s": 0}, "quiet_s"),
        ({"action": "wait_acks", "epoch": 1, "nodes": ["n1"], "quiet_s": -1}, "quiet_s"),
        ({"action": "wait_acks", "epoch": 0, "nodes": ["n1"]}, "epoch"),
        ({"action": "wait_acks", "epoch": 1, "nodes": ["n1"], "wait_s": -1}, "wait_s"),
        ({"action": "wait_direct", "epoch": 0, "nodes": ["n1"]}, "epoch"),
        ({"action": "wait_direct", "epoch": 1, "nodes": ["n1"], "wait_s": -1}, "wait_s"),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_the_fence_stays(etcd_url, store, args, field):
    refused = rollout_fence(etcd_url, store.prefix, **args)
    assert refused.get("failed") and refused["field"] == field, refused
    assert store.fence()["epoch"] == 0, "a refused call raised the fence"


def run_module_file(etcd_url, prefix, tmp_path, **args):
    """The module itself, as it runs on a host the task is delegated to (no action plugin)."""
    args_file = tmp_path / "args.json"
    args_file.write_text(
        json.dumps({"ANSIBLE_MODULE_ARGS": dict(args, endpoints=[etcd_url], prefix=prefix)})
    )
    done = subprocess.run(
        [sys.executable, os.path.join(REPO, "plugins", "modules", "rollout_fence.py"),
         str(args_file)],
        env=dict(os.environ, PYTHONPATH=os.path.join(REPO, ".collections")),
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)


def test_the_module_on_a_host_and_the_controller_s_own_run_give_the_same_answers(
    etcd_url, store, tmp_path
):
    on_host = run_module_file(
        etcd_url, store.prefix, tmp_path, action="raise", reason="t", nodes=["n1"], wait_s=0.3
    )
    on_controller = rollout_fence(
        etcd_url, store.prefix, action="raise", reason="t", nodes=["n1"], wait_s=0.3
    )
    # AnsibleModule returns its invocation; the controller's in-process run has no module.
    assert "invocation" in on_host and "invocation" not in on_controller
    assert (on_host["fence"]["epoch"], on_controller["fence"]["epoch"]) == (1, 2)
    for result in (on_host, on_controller):
        assert result["lagging"] == ["n1"] and result["acked"] == {}, result
        assert result["ended_at_unix"] >= result["fence"]["at_unix"], result
    assert set(on_host) - {"invocation"} <= set(on_controller), (on_host, on_controller)
    refused = run_module_file(etcd_url, store.prefix, tmp_path, action="raise", quiet_s=0)
    assert refused.get("failed") and refused["field"] == "quiet_s", refused
    assert store.fence()["epoch"] == 2, "a refused call raised the fence"
