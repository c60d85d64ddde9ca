"""Repository and package selection of the nvidia_driver role, run on localhost.

The play (molecule/nvidia_driver/package_selection.yml) gives each supported
distribution's facts and detected devices as variables, runs the role's
select_packages.yml in check mode and asserts the chosen repository and packages. No GPU
and no package manager are involved: the selection only computes facts.
"""

import os
import subprocess

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
PLAYBOOK = os.path.join(ROOT, "molecule", "nvidia_driver", "package_selection.yml")


def run_selection(*extra):
    command = ["ansible-playbook", "-i", "localhost,", "-c", "local", PLAYBOOK, *extra]
    # The default output: the test counts the asserts' ok results, which the quiet one hides.
    environment = dict(
        os.environ,
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_FORCE_COLOR="0",
        ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default",
    )
    return subprocess.run(
        command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def ansible_playbook():
    if subprocess.run(["which", "ansible-playbook"], capture_output=True, check=False).returncode:
        pytest.fail("ansible-playbook is not on PATH: activate .venv first")


def test_every_distribution_selects_the_expected_packages(ansible_playbook):
    result = run_selection()
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert result.stdout.count("All assertions passed") == 6
    assert "failed=0" in result.stdout


def test_the_assertions_catch_a_wrong_selection(ansible_playbook):
    # Another branch changes every package name: the first case must fail and say so.
    result = run_selection("-e", "nvidia_driver_branch=535")
    assert result.returncode != 0
    assert "Ubuntu 22.04, H100, precompiled modules offered, exact version: got" in result.stdout
    assert "linux-modules-nvidia-535-server-open-generic" in result.stdout
