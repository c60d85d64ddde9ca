"""Runs a playbook on localhost with this checkout's collection, for tests of task files and
templates that only Ansible can evaluate (set_fact arithmetic, rendered units)."""

import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[3]


def run_local_playbook(plays, work, name="play.yml", succeed=True):
    """Writes `plays` to work/name and runs it against localhost with this interpreter; the
    run must succeed, or with succeed=False may fail. The checkout's ansible.cfg is left out
    (no sandbox inventory)."""
    playbook = work / name
    playbook.write_text(yaml.safe_dump(plays))
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=str(REPO / ".collections"), LANG="C")
    env.pop("ANSIBLE_CONFIG", None)
    run = subprocess.run(
        [
            str(REPO / ".venv/bin/ansible-playbook"),
            *("-i", "localhost,", str(playbook)),
            *("-e", "ansible_python_interpreter=%s" % sys.executable),
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=str(work),
        timeout=300,
        check=False,
    )
    if succeed:
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    return run
