"""What roles/model_engine renders for each engine kind and key count, by Ansible itself (one
local ansible-playbook run over the role's defaults, vars and templates): no API key in a
unit's ExecStart, which becomes the engine's command line (/proc/PID/cmdline, readable by
every local account), except Triton's, whose key tritonserver takes only there, expanded by
systemd from its 0600 environment file (tasks/preflight.yml refuses it where /proc shows it).
"""

import json
from pathlib import Path

import pytest

from unit.helpers.local_playbook import run_local_playbook

REPO = Path(__file__).resolve().parents[4]
ROLE = REPO / "roles/model_engine"
KEYS = ["sk-render-first-key-0001", "sk-render-second-key-002"]

ENGINES = {
    "vllm_cpu": {
        "kind": "vllm",
        "hardware_profile": {"gpu": None, "memory": "4G", "cpu": "200%"},
        "precision": "fp32",
        "gpus": [],
    },
    "vllm_gpu": {
        "kind": "vllm",
        "hardware_profile": {"gpus": [0, 1], "memory": "64G", "cpu": "800%"},
        "precision": "fp16",
        "gpus": [0, 1],
    },
    "triton": {
        "kind": "triton",
        "hardware_profile": {"gpu": 2, "memory": "32G", "cpu": "400%"},
        "precision": "fp16",
        "gpus": [2],
    },
}
CASES = [(name, count) for name in ENGINES for count in (1, 2) if name != "triton" or count == 1]


def service(name, engine):
    return {
        "name": name,
        "model": "zerolayer/render-test",
        "hardware_profile": engine["hardware_profile"],
        "inference_engine": {
            "kind": engine["kind"], "version": "0.32.0", "precision": engine["precision"],
        },
        "resource_limits": {
            "max_concurrent_requests": 4, "max_input_tokens": 384, "max_output_tokens": 128,
        },
        "listen_port": 8101,
        "route": "chat",
        "slot": 0,
        "model_source": {"kind": "local", "path": "/srv/models/render-test"},
    }  # fmt: skip


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """{(engine, key count): {"unit": text, "env": text}}, rendered by one playbook run."""
    work = tmp_path_factory.mktemp("render")
    tasks = []
    for name, count in CASES:
        engine = ENGINES[name]
        case_vars = {
            "zerolayer_api_keys": KEYS[:count],
            "_model_engine_service": service(name, engine),
            "_model_engine_gpus": engine["gpus"],
            "_model_engine_unit": "zerolayer-engine-" + name,
            "_model_engine_dir": "/etc/zerolayer/engines/" + name,
            "_model_engine_source": {"kind": "local", "path": "/srv/models/render-test"},
            "_model_engine_weights_dir": "/srv/models/render-test",
        }
        for part, template in (("unit", "service"), ("env", "env")):
            source = ROLE / "templates" / ("engine-%s.%s.j2" % (engine["kind"], template))
            tasks.append(
                {
                    "name": "Render %s of %s with %d key(s)" % (part, name, count),
                    "ansible.builtin.copy": {
                        "content": "{{ lookup('ansible.builtin.template', '%s') }}" % source,
                        "dest": str(work / ("%s-%d.%s" % (name, count, part))),
                        "mode": "0600",
                    },
                    "vars": case_vars,
                }
            )
    play = [
        {
            "name": "Render the model_engine units",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(ROLE / "defaults/main.yml"), str(ROLE / "vars/main.yml")],
            "tasks": tasks,
        }
    ]
    run_local_playbook(play, work, "render.yml")
    return {
        (name, count): {
            part: (work / ("%s-%d.%s" % (name, count, part))).read_text()
            for part in ("unit", "env")
        }
        for name, count in CASES
    }


def exec_start(unit):
    """The ExecStart command of a rendered unit, its continuation lines joined."""
    lines = unit.replace("\\\n", " ").splitlines()
    [command] = [line for line in lines if line.startswith("ExecStart=")]
    return command


@pytest.mark.parametrize(("name", "count"), CASES)
def test_no_key_in_any_command_the_unit_runs(rendered, name, count):
    unit = rendered[(name, count)]["unit"]
    commands = [line for line in unit.replace("\\\n", " ").splitlines() if line.startswith("Exec")]
    assert commands, unit
    for command in commands:
        for key in KEYS:
            assert key not in command, command
    assert "--api-key" not in exec_start(unit)
    # Nor anywhere else in the unit file, which is mode 0644.
    for key in KEYS:
        assert key not in unit


@pytest.mark.parametrize("name", ["vllm_cpu", "vllm_gpu"])
def test_one_vllm_key_goes_by_vllms_own_variable(rendered, name):
    files = rendered[(name, 1)]
    assert "VLLM_API_KEY=%s\n" % KEYS[0] in files["env"]
    assert "ZEROLAYER_API_KEYS_FILE" not in files["unit"]
    assert "zerolayer_vllm_serve.py" not in exec_start(files["unit"])


@pytest.mark.parametrize("name", ["vllm_cpu", "vllm_gpu"])
def test_several_vllm_keys_go_by_the_keys_file_to_the_launcher(rendered, name):
    files = rendered[(name, 2)]
    for key in KEYS:
        assert key not in files["env"]
    assert "VLLM_API_KEY" not in files["env"].replace("# ", "")
    assert "Environment=ZEROLAYER_API_KEYS_FILE=/etc/zerolayer/engine-secrets/api-keys" in (
        files["unit"].splitlines()
    )
    command = exec_start(files["unit"]).split()
    assert command[1:3] == ["/usr/local/lib/zerolayer/zerolayer_vllm_serve.py", "--model"], command
    assert "--middleware" in command and "zerolayer_vllm_paths.ServedPathsOnly" in command


def test_triton_takes_its_key_from_systemds_environment_only(rendered):
    files = rendered[("triton", 1)]
    assert '"--http-restricted-api=${ZEROLAYER_TRITON_RESTRICTED_API}"' in exec_start(files["unit"])
    assert json.dumps(KEYS[0])[1:-1] in files["env"]
