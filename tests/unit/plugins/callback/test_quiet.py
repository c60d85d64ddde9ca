"""The quiet stdout callback on a real ansible-playbook run: no FAILED - RETRYING for a loop
that waits, no lines for ok or skipped tasks, debug messages kept; -v gives the default."""

import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
PLAY = """
- hosts: localhost
  gather_facts: false
  tasks:
    - name: An ok task
      ansible.builtin.set_fact:
        seen: 1
    - name: A skipped task
      ansible.builtin.debug:
        msg: never shown
      when: false
    - name: Wait for a condition
      ansible.builtin.shell: >-
        n=$(cat "{counter}" 2>/dev/null || echo 0); echo $((n + 1)) | tee "{counter}"
      register: count
      changed_when: false
      until: count.stdout | int >= 3
      retries: 5
      delay: 0
    - name: Say where things stand
      ansible.builtin.debug:
        msg: all is well
"""


@pytest.fixture
def playbook(tmp_path):
    path = tmp_path / "play.yml"
    path.write_text(PLAY.replace("{counter}", str(tmp_path / "count")))
    return path


def run(playbook, *extra):
    env = dict(os.environ, ANSIBLE_CONFIG=os.path.join(ROOT, "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    result = subprocess.run(
        ["ansible-playbook", "-i", "localhost,", "-c", "local", str(playbook),
         "-e", "ansible_python_interpreter=/usr/bin/python3", *extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    return result.stdout


def test_the_sandbox_config_uses_the_quiet_callback():
    with open(os.path.join(ROOT, "ansible.cfg")) as handle:
        assert "stdout_callback = zerolayer.fleet.quiet" in handle.read()


def test_quiet_output_shows_waiting_and_messages_only(playbook):
    output = run(playbook)
    assert "FAILED" not in output, output
    assert "waiting: [localhost]: Wait for a condition (attempt 1 of 6)" in output, output
    assert "waiting: [localhost]: Wait for a condition (attempt 2 of 6)" in output, output
    assert "all is well" in output
    assert "TASK [An ok task]" not in output and "never shown" not in output
    assert "TASK [A skipped task]" not in output and "skipping:" not in output
    assert "ok=" in output.split("PLAY RECAP", 1)[1]


def test_verbose_output_is_the_default_one(playbook):
    output = run(playbook, "-v")
    assert "FAILED - RETRYING: [localhost]: Wait for a condition (4 retries left)." in output
    assert "TASK [An ok task]" in output and "skipping: [localhost]" in output
