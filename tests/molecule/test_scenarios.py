"""Every molecule scenario, run end to end (create, converge, idempotence, verify, destroy).

Each scenario builds on the sandbox node image and verifies real state inside systemd nodes;
molecule destroys its containers even when a step fails.
"""

import pathlib
import subprocess

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

SCENARIOS = sorted(p.parent.name for p in (REPO / "molecule").glob("*/molecule.yml"))


@pytest.mark.molecule
@pytest.mark.sandbox
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_scenario(scenario, ansible_env, tool):
    result = subprocess.run(
        [tool("molecule"), "test", "-s", scenario],
        cwd=REPO,
        env=ansible_env,
        capture_output=True,
        text=True,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"molecule test -s {scenario} failed:\n{output[-20000:]}"


def test_every_role_has_a_scenario():
    roles = sorted(p.name for p in (REPO / "roles").iterdir() if (p / "tasks").is_dir())
    missing = [role for role in roles if role not in SCENARIOS]
    assert not missing, f"roles without a molecule scenario of the same name: {missing}"
