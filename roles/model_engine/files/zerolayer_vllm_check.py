"""Check a vLLM engine's settings against the installed vLLM before its unit is installed.

    python zerolayer_vllm_check.py ENGINE MODEL_DIR [--port-free HOST:PORT] -- FLAG...

Run with the engine's own venv python, so the flags are checked by the installed vLLM's own
argument parser (a flag it does not know, a dtype it does not take), not by a copy of it.
It also checks that the model directory holds a model config and a tokenizer that loads,
and, when asked, that nobody listens on the engine's port yet. It prints one line per
problem, each naming the engine, and exits 1 if there is any; it changes nothing.
"""

import contextlib
import io
import json
import os
import socket
import sys


def parser_problems(engine, flags):
    # The parser the engine runs with: `vllm serve`'s, through the launcher that gives vLLM
    # several keys (zerolayer_vllm_serve.py, installed beside this file), whose imports of
    # vLLM are so checked against the installed one too.
    import zerolayer_vllm_serve

    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors):
            zerolayer_vllm_serve.parse_serve_args(flags)
    except SystemExit:
        said = [line for line in errors.getvalue().splitlines() if "error:" in line]
        reason = said[-1].split("error:", 1)[1].strip() if said else errors.getvalue().strip()
        return ["engine %s: the installed vLLM refuses its flags: %s" % (engine, reason)]
    except (TypeError, ValueError, zerolayer_vllm_serve.Refused) as error:
        return ["engine %s: the installed vLLM refuses its flags: %s" % (engine, error)]
    except ImportError as error:
        return [
            "engine %s: the installed vLLM lacks what zerolayer_vllm_serve.py runs it with: %s"
            % (engine, error)
        ]
    return []


def model_problems(engine, model_dir):
    config = os.path.join(model_dir, "config.json")
    if not os.path.isdir(model_dir):
        return ["engine %s: model directory %s does not exist" % (engine, model_dir)]
    try:
        with open(config, encoding="utf-8") as handle:
            json.load(handle)
    except (OSError, ValueError) as error:
        return ["engine %s: %s is not a readable model config: %s" % (engine, config, error)]
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    # Whatever the tokenizer raises, it is said, with the engine's name.
    except Exception as error:
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        return [
            "engine %s: the tokenizer in %s does not load: %s: %s"
            % (engine, model_dir, type(error).__name__, first_line)
        ]
    return []


def port_problems(engine, address):
    host, _colon, port = address.rpartition(":")
    probe = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        probe.bind((host, int(port)))
    except OSError as error:
        return [
            "engine %s: port %s is already taken on this node: %s" % (engine, port, error.strerror)
        ]
    finally:
        probe.close()
    return []


def main(argv):
    if "--" not in argv or argv.index("--") < 2:
        print("usage: zerolayer_vllm_check.py ENGINE MODEL_DIR [--port-free HOST:PORT] -- FLAG...")
        return 2
    split = argv.index("--")
    own, flags = argv[:split], argv[split + 1 :]
    engine, model_dir = own[0], own[1]
    problems = []
    if len(own) == 4 and own[2] == "--port-free":
        problems += port_problems(engine, own[3])
    problems += model_problems(engine, model_dir)
    problems += parser_problems(engine, flags)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
