"""The model_engine role's weight download and Hugging Face token, run by ansible-playbook.

The tasks run on this machine (connection local) inside a temporary directory: the token
file, then the download, whose `python` is the model_engine scenario's TEST DOUBLE of the
venv's python (it reaches no hub and writes a tiny model directory). The preflight runs the
same way with inputs it must refuse. Nothing outside the temporary directory is touched.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

# The role's tasks run commands as the engine's account (runuser), as root does on a node.
pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[4]
DOWNLOAD_DOUBLE = REPO / "molecule" / "model_engine" / "doubles" / "hf-download-double.sh"
TOKEN = "hf_unitTestThrowawayToken0042"  # noqa: S105 - a throwaway token of this test

DOWNLOAD_PLAY = """
- name: Token and weight download of one engine, as the role runs them
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Create the secrets directory as common.yml does
      ansible.builtin.file:
        path: "{{ model_engine_secrets_dir }}"
        state: directory
        mode: "0700"
    - name: Install the token
      ansible.builtin.include_role:
        name: zerolayer.fleet.model_engine
        tasks_from: huggingface_token.yml
    - name: Work out the engine as engine.yml does
      ansible.builtin.set_fact:
        _model_engine_service: "{{ engine }}"
        _model_engine_source: "{{ engine.model_source }}"
        _model_engine_weights_dir: "{{ model_engine_state_root }}/{{ engine.name }}/weights"
    - name: Download the weights
      ansible.builtin.include_role:
        name: zerolayer.fleet.model_engine
        tasks_from: weights_download.yml
"""

PREFLIGHT_PLAY = """
- name: The model_engine preflight alone
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Check the inputs
      ansible.builtin.include_role:
        name: zerolayer.fleet.model_engine
        tasks_from: preflight.yml
"""


def engine(name, **fields):
    entry = {
        "name": name,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "hardware_profile": {"gpu": 0, "memory": "8G", "cpu": "100%"},
        "inference_engine": {"kind": "vllm", "version": "0.11.0", "precision": "fp16"},
        "resource_limits": {
            "max_concurrent_requests": 4,
            "max_input_tokens": 64,
            "max_output_tokens": 8,
        },
        "listen_port": 8000 + len(name),
        "route": "chat",
        "slot": len(name),
    }
    entry.update(fields)
    return entry


def run_playbook(ansible_env, tmp_path, play, extra_vars):
    playbook = tmp_path / "play.yml"
    playbook.write_text(play)
    variables = tmp_path / "vars.json"
    # The modules run with this test's Python, where Ansible is installed.
    variables.write_text(json.dumps(extra_vars | {"ansible_python_interpreter": sys.executable}))
    env = dict(ansible_env)
    # The default callback with -vvv and --diff shows the most a run can show.
    env["ANSIBLE_STDOUT_CALLBACK"] = "default"
    return subprocess.run(
        [
            str(REPO / ".venv" / "bin" / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-vvv",
            "--diff",
            "-e",
            "@%s" % variables,
            str(playbook),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.fixture
def engine_root(tmp_path):
    """Install, state and secrets roots of one engine, its venv python the TEST DOUBLE."""
    venv_bin = tmp_path / "opt" / "gated" / "venv" / "bin"
    venv_bin.mkdir(parents=True)
    shutil.copy(DOWNLOAD_DOUBLE, venv_bin / "python")
    (venv_bin / "python").chmod(0o755)
    return {
        "model_engine_user": "root",
        "model_engine_group": "root",
        "model_engine_install_root": str(tmp_path / "opt"),
        "model_engine_state_root": str(tmp_path / "state"),
        "model_engine_secrets_dir": str(tmp_path / "secrets"),
        "model_engine_huggingface_token": TOKEN,
    }


def test_hub_download_keeps_the_token_in_a_0600_file_and_out_of_every_output(
    ansible_env, tmp_path, engine_root
):
    source = {"kind": "huggingface", "revision": "main"}
    extra = engine_root | {"engine": engine("gated", model_source=source)}
    run = run_playbook(ansible_env, tmp_path, DOWNLOAD_PLAY, extra)
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-6000:]
    # The playbook ran the token task and censored it, even at -vvv with --diff.
    assert "the output has been hidden" in output
    assert TOKEN not in output

    token = Path(engine_root["model_engine_secrets_dir"]) / "huggingface-token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert token.read_text().strip() == TOKEN

    state = Path(engine_root["model_engine_state_root"]) / "gated"
    record = (state / "hf-download-double.log").read_text()
    assert record == (
        "repo=meta-llama/Llama-3.1-8B-Instruct revision=main local_dir=%s uid=%d hf_endpoint="
        " hf_token_path=%s token_readable=yes hf_hub_offline=\n" % (state / "weights", 0, token)
    )
    assert (state / "weights" / "config.json").is_file()


def test_a_second_run_downloads_nothing_until_the_source_changes(
    ansible_env, tmp_path, engine_root
):
    record = Path(engine_root["model_engine_state_root"]) / "gated" / "hf-download-double.log"
    for revision, downloads in (("v1", 1), ("v1", 1), ("v2", 2)):
        source = {"kind": "mirror", "url": "http://hf-mirror.invalid", "revision": revision}
        extra = engine_root | {"engine": engine("gated", model_source=source)}
        run = run_playbook(ansible_env, tmp_path, DOWNLOAD_PLAY, extra)
        assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
        lines = record.read_text().splitlines()
        assert len(lines) == downloads, lines
    assert "revision=v2" in lines[-1]
    assert "hf_endpoint=http://hf-mirror.invalid" in lines[-1]


def test_no_token_means_no_token_file(ansible_env, tmp_path, engine_root):
    token = Path(engine_root["model_engine_secrets_dir"]) / "huggingface-token"
    token.parent.mkdir(mode=0o700)
    token.write_text("left from an earlier run\n")
    extra = engine_root | {
        "model_engine_huggingface_token": "",
        "engine": engine("gated", model_source={"kind": "huggingface"}),
    }
    run = run_playbook(ansible_env, tmp_path, DOWNLOAD_PLAY, extra)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
    assert not token.exists()
    record = Path(engine_root["model_engine_state_root"]) / "gated" / "hf-download-double.log"
    assert "hf_token_path= token_readable=no" in record.read_text()


def preflight(ansible_env, tmp_path, services, **extra):
    extra_vars = {
        "model_engine_services": services,
        "zerolayer_api_keys": ["sk-unit-test-engine-key-0001"],
        "cuda_mps_instances": [],
    } | extra
    run = run_playbook(ansible_env, tmp_path, PREFLIGHT_PLAY, extra_vars)
    return run.returncode, run.stdout + run.stderr


def test_preflight_accepts_multi_gpu_engines_on_their_own_gpus(ansible_env, tmp_path):
    model = tmp_path / "tiny"
    model.mkdir()
    (model / "config.json").write_text("{}")
    services = [
        engine("a", hardware_profile={"gpus": [0, 1], "memory": "8G", "cpu": "100%"}),
        engine(
            "bb",
            hardware_profile={"gpu": 2, "memory": "8G", "cpu": "100%"},
            model_source={"kind": "local", "path": str(model)},
        ),
        engine(
            "ccc",
            hardware_profile={"gpus": [3], "memory": "8G", "cpu": "100%"},
            model_source={"kind": "mirror", "url": "https://hf-mirror.invalid"},
        ),
    ]
    rc, output = preflight(ansible_env, tmp_path, services)
    assert rc == 0, output[-6000:]


def test_preflight_refuses_overlapping_sets_and_bad_sources_at_once(ansible_env, tmp_path):
    services = [
        engine("a", hardware_profile={"gpus": [0, 1], "memory": "8G", "cpu": "100%"}),
        engine("bb", hardware_profile={"gpus": [1, 2], "memory": "8G", "cpu": "100%"}),
        engine(
            "ccc",
            model_source={"kind": "mirror"},
            hardware_profile={"gpu": 5, "memory": "8G", "cpu": "100%"},
        ),
        engine(
            "dddd",
            inference_engine={"kind": "sim", "version": "1", "precision": "fp16"},
            hardware_profile={"gpu": None, "memory": "8G", "cpu": "100%"},
            model_source={"kind": "local", "path": "/srv/models/x"},
        ),
    ]
    rc, output = preflight(ansible_env, tmp_path, services)
    assert rc != 0
    for message in (
        "model_engine_services[1] (bb).hardware_profile.gpus [1, 2] overlaps"
        " model_engine_services[0] (a).hardware_profile.gpus [0, 1] on GPU 1",
        "model_engine_services[2] (ccc).model_source.url must be the http(s) URL of the internal"
        " Hugging Face mirror (HF_ENDPOINT) for kind mirror",
        "model_engine_services[3] (dddd).model_source: kind sim loads no weights",
    ):
        assert message in output, output[-6000:]


def test_preflight_refuses_a_token_that_is_not_one(ansible_env, tmp_path):
    rc, output = preflight(
        ansible_env,
        tmp_path,
        [engine("a")],
        model_engine_huggingface_token="hf token with spaces",  # noqa: S106 - not a real token
    )
    assert rc != 0
    assert "model_engine_huggingface_token must be empty or a Hugging Face access token" in output
    assert "hf token with spaces" not in output


def test_unit_test_runs_as_root():
    # runuser -u <engine account> needs root, as the role has on a node.
    assert os.geteuid() == 0
