"""The fast push to one node (playbooks/tasks/fast_push.yml), run by ansible-playbook on this
machine against a node that hangs: its zerolayer-routectl is a script that sleeps. The push
must end that node at rollback_fast_node_timeout_s and report it unconfirmed, saying why,
instead of holding the rollback for as long as the node hangs."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HANG_S = 120


def test_a_node_that_hangs_is_ended_at_the_timeout_and_reported_unconfirmed(tmp_path):
    pid_file = tmp_path / "routectl.pid"
    routectl = tmp_path / "routectl"
    routectl.write_text("#!/bin/sh\necho $$ > %s\nexec sleep %d\n" % (pid_file, HANG_S))
    routectl.chmod(0o755)
    playbook = tmp_path / "push.yml"
    playbook.write_text(
        """
- hosts: localhost
  connection: local
  gather_facts: false
  vars:
    rollback_routectl: %s
    rollback_fast_node_timeout_s: 2
    ansible_python_interpreter: "{{ ansible_playbook_python }}"
    _rollback_epoch: ""
  tasks:
    - ansible.builtin.include_tasks: %s
    - ansible.builtin.copy:
        content: "{{ {'confirmation': ['localhost'] | zerolayer.fleet.rollback_confirmations(
          {}, {}, 'fast', {'localhost': _rollback_fast}) | first} | to_json }}"
        dest: %s
"""
        % (routectl, REPO / "playbooks/tasks/fast_push.yml", tmp_path / "out.json")
    )
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"))
    started = time.monotonic()
    try:
        run = subprocess.run(
            ["ansible-playbook", "-i", "localhost,", str(playbook)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=HANG_S, check=False,
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        # The sleep the hung push left behind (ours, by its pid).
        if pid_file.exists():
            try:
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert pid_file.exists(), "the push never ran the node's command:\n" + run.stdout[-3000:]
    assert run.returncode == 0, run.stdout[-3000:]
    assert took < 60, "the push waited %.0f s for a node that hangs" % took
    entry = json.loads((tmp_path / "out.json").read_text())["confirmation"]
    assert entry["confirmed"] is False and entry["reached"] is True, entry
    assert "timed out after 2 second" in entry["error"].lower(), entry
