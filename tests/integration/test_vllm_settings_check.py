"""roles/model_engine/files/zerolayer_vllm_check.py run with the real vLLM CPU runtime
(scripts/vllm-cpu-runtime, built by scripts/setup test), as the role runs it before a vLLM
engine's unit changes: the installed vLLM's own parser judges the flags.

One run per case: each imports vLLM (about 10 s on these machines).
"""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CHECK = REPO / "roles/model_engine/files/zerolayer_vllm_check.py"
# What the role renders for the sandbox's CPU engine, but the model (vars/main.yml).
GOOD_FLAGS = [
    "--served-model-name", "zerolayer/sim-chat", "--host", "0.0.0.0", "--port", "8101",
    "--max-num-seqs", "4", "--max-model-len", "512", "--dtype", "float32", "--enforce-eager",
    "--middleware", "zerolayer_vllm_paths.ServedPathsOnly", "--disable-fastapi-docs",
]  # fmt: skip


def check(runtime, *flags, model=None):
    model = model or str(runtime / "models/tiny-llama")
    argv = [str(runtime / "venv/bin/python"), str(CHECK), "chat", model, "--", "--model", model]
    return subprocess.run(
        [*argv, *flags],
        capture_output=True,
        text=True,
        timeout=300,
        env={"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PATH": "/usr/bin:/bin"},
        check=False,
    )


def problems(result):
    """The check's own lines (a library may print to stdout too while vLLM is imported)."""
    return [line for line in result.stdout.splitlines() if line.startswith("engine ")]


def test_the_flags_the_role_renders_pass(runtime):
    result = check(runtime, *GOOD_FLAGS)
    assert (result.returncode, problems(result)) == (0, []), result.stderr[-2000:]


def test_a_flag_the_installed_vllm_does_not_know_is_named(runtime):
    result = check(runtime, *GOOD_FLAGS, "--no-such-flag")
    assert result.returncode == 1
    assert problems(result) == [
        "engine chat: the installed vLLM refuses its flags: unrecognized arguments: --no-such-flag"
    ]


def test_a_value_the_installed_vllm_does_not_take_is_named_with_the_allowed_ones(runtime):
    flags = [flag if flag != "float32" else "float17" for flag in GOOD_FLAGS]
    result = check(runtime, *flags)
    assert result.returncode == 1
    assert len(problems(result)) == 1, result.stdout
    line = problems(result)[0]
    assert line.startswith(
        "engine chat: the installed vLLM refuses its flags: argument --dtype: invalid choice:"
        " 'float17' (choose from"
    ), line
    assert "'float32'" in line, line


def test_a_model_directory_that_does_not_exist_is_named(runtime, tmp_path):
    result = check(runtime, *GOOD_FLAGS, model=str(tmp_path / "absent"))
    assert result.returncode == 1
    assert "engine chat: model directory %s does not exist" % (tmp_path / "absent") in (
        problems(result)
    )
