"""TEST DOUBLE of nvidia-smi for GPU-less sandbox nodes.

Not NVIDIA's program. It answers the two calls the cuda_mps role makes, against the GPUs
listed in STATE (written by the scenario's prepare step):
  -i GPU --query-gpu=compute_mode --format=csv,noheader
  -i GPU -c EXCLUSIVE_PROCESS|DEFAULT|PROHIBITED (or 3|0|2)
Every call is appended as a JSON line to RECORD for the tests to read.
"""

import json
import os
import sys

STATE = "/var/lib/zerolayer-test-doubles/nvidia-smi-state.json"
RECORD = "/var/log/zerolayer-test-doubles/nvidia-smi.jsonl"
MODES = {
    "0": "Default",
    "DEFAULT": "Default",
    "2": "Prohibited",
    "PROHIBITED": "Prohibited",
    "3": "Exclusive_Process",
    "EXCLUSIVE_PROCESS": "Exclusive_Process",
}


def record(argv, rc):
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    with open(RECORD, "a", encoding="utf-8") as handle:
        handle.write(json.dumps({"argv": argv, "rc": rc}) + "\n")


def find_gpu(state, selector):
    for gpu in state["gpus"]:
        if selector in (str(gpu["index"]), gpu["uuid"], gpu["pci_bus_id"]):
            return gpu
    return None


def run(argv):
    with open(STATE, encoding="utf-8") as handle:
        state = json.load(handle)
    if len(argv) < 3 or argv[0] != "-i":
        print("test double: unsupported arguments %r" % (argv,), file=sys.stderr)
        return 2
    gpu = find_gpu(state, argv[1])
    if gpu is None:
        print("No devices were found")
        return 6
    rest = argv[2:]
    if rest == ["--query-gpu=compute_mode", "--format=csv,noheader"]:
        print(gpu["compute_mode"])
        return 0
    if len(rest) == 2 and rest[0] == "-c" and rest[1].upper() in MODES:
        gpu["compute_mode"] = MODES[rest[1].upper()]
        temporary = STATE + ".new"
        with open(temporary, "w", encoding="utf-8") as handle:
            json.dump(state, handle)
        os.replace(temporary, STATE)
        mode = gpu["compute_mode"].upper()
        print("Set compute mode to %s for GPU %s." % (mode, gpu["pci_bus_id"]))
        print("All done.")
        return 0
    print("test double: unsupported arguments %r" % (argv,), file=sys.stderr)
    return 2


if __name__ == "__main__":
    arguments = sys.argv[1:]
    status = run(arguments)
    record(arguments, status)
    sys.exit(status)
