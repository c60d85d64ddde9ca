"""Settings shared by every test: where the checkout and its tools are."""

import os
import pathlib
import shutil

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent
VENV_BIN = REPO / ".venv" / "bin"


def find_tool(name: str) -> str:
    """Path of a command from the project's venv, else from PATH."""
    candidate = VENV_BIN / name
    if candidate.exists():
        return str(candidate)
    found = shutil.which(name)
    if found is None:
        raise FileNotFoundError(f"{name} is not installed; run scripts/setup")
    return found


@pytest.fixture(scope="session")
def tool():
    """find_tool as a fixture: tool("molecule") is the venv's molecule."""
    return find_tool


@pytest.fixture(scope="session")
def repo() -> pathlib.Path:
    return REPO


@pytest.fixture(scope="session")
def ansible_env() -> dict:
    """Environment for ansible-* commands run from the checkout."""
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(REPO / "ansible.cfg")
    env["CONTAINERS_CONF"] = str(REPO / "tests" / "sandbox" / "containers.conf")
    env["PATH"] = f"{VENV_BIN}:{env.get('PATH', '')}"
    env.setdefault("LANG", "C.UTF-8")
    return env
