"""playbooks/tasks/scope_owner.yml, the rollout scope of site.yml, engine_upgrade.yml and
restore.yml, run as those playbooks run it (one include to acquire, others to confirm and to
release) in a local ansible-playbook against a real etcd member.

Ansible sets a skipped task's register too: the release and confirm includes skip the
acquire task, so the owner they read must not come from its register. Once it did, and
every run left its scope held until the lease's TTL after it ended (the next run waited for
it, another controller was refused) and no confirmation ever ran.
"""

from pathlib import Path

import pytest
from unit.helpers.local_playbook import run_local_playbook

pytestmark = pytest.mark.etcd

REPO = Path(__file__).resolve().parents[2]
SCOPE_TASKS = str(REPO / "playbooks" / "tasks" / "scope_owner.yml")
SCOPE = "gpu_nodes"
CONFIRM = "Confirm this run still owns the rollout scope"


def tasks_shown(stdout):
    """(task name, what the default callback printed under it) in the order they ran."""
    shown = []
    for block in stdout.split("\nTASK [")[1:]:
        name, _stars, body = block.partition("]")
        shown.append((name, body.lstrip("* \n")))
    return shown


def scope_step(action):
    """One include of the task file, as the playbooks write it."""
    return {
        "name": "Scope: %s" % action,
        "ansible.builtin.include_tasks": SCOPE_TASKS,
        "vars": {
            "_scope_action": action,
            "_scope_pattern": SCOPE,
            "_scope_rollout_id": "tasks-test",
        },
    }


# Taken, confirmed and given up, as site.yml, engine_upgrade.yml and restore.yml do.
ROUND_TRIP = (scope_step("acquire"), scope_step("confirm"), scope_step("release"))


def play(etcd_url, store, *tasks):
    return [
        {
            "name": "The rollout scope, as a playbook takes it",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars": {"rollout_store_endpoints": [etcd_url], "canary_owner_ttl": 30},
            "module_defaults": {
                "group/zerolayer.fleet.store": {"endpoints": [etcd_url], "prefix": store.prefix}
            },
            "tasks": list(tasks),
        }
    ]


def test_the_release_include_gives_the_scope_up_at_once(etcd_url, store, tmp_path):
    plays = play(etcd_url, store, *ROUND_TRIP)
    run = run_local_playbook(plays, tmp_path)
    # Free now, not 30 s later when the lease would expire.
    assert store.owner(SCOPE) is None, run.stdout[-3000:]
    # The confirmation and the release ran (the same task of the file): neither was skipped.
    outcomes = [body.split(":")[0] for name, body in tasks_shown(run.stdout) if name == CONFIRM]
    assert outcomes == ["skipping", "ok", "ok"], run.stdout[-3000:]


def test_the_confirm_include_stops_a_run_that_lost_its_scope(etcd_url, store, tmp_path):
    # The lease taken away behind the run's back, as when its heartbeat could not renew it.
    lose = {
        "name": "Lose the lease",
        "zerolayer.fleet.rollout_owner": {
            "action": "release",
            "scope": SCOPE,
            "lease": "{{ _scope_owner.owner.lease }}",
        },
    }
    after = {"name": "Never reached", "ansible.builtin.debug": {"msg": "written"}}
    plays = play(etcd_url, store, scope_step("acquire"), lose, scope_step("confirm"), after)
    run = run_local_playbook(plays, tmp_path, succeed=False)
    assert run.returncode != 0, run.stdout[-3000:]
    assert "no longer owns scope %s" % SCOPE in run.stdout, run.stdout[-3000:]
    assert "TASK [Never reached]" not in run.stdout
    assert store.owner(SCOPE) is None


def test_with_no_store_no_scope_is_taken_and_nothing_fails(etcd_url, store, tmp_path):
    plays = play(etcd_url, store, *ROUND_TRIP)
    plays[0]["vars"]["rollout_store_endpoints"] = []
    run = run_local_playbook(plays, tmp_path)
    assert "ok: [localhost]" not in run.stdout, run.stdout[-3000:]
    assert store.owner(SCOPE) is None
