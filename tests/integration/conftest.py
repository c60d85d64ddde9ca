"""Integration tests import the collection through the checkout's collections path
(tests/conftest.py puts it on sys.path)."""

import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def runtime():
    """The vLLM CPU runtime scripts/setup test builds (its venv and tiny model)."""
    repo = Path(__file__).resolve().parents[2]
    where = subprocess.run(
        [str(repo / "scripts/vllm-cpu-runtime"), "path"], capture_output=True, text=True, check=True
    ).stdout.strip()
    runtime = Path(where)
    if not (runtime / ".recipe.sha256").exists():
        pytest.fail("the vLLM CPU runtime is not built at %s: run scripts/setup test" % runtime)
    return runtime
