"""`vllm serve` with its API keys read from a file, never from its command line.

    ZEROLAYER_API_KEYS_FILE=PATH python zerolayer_vllm_serve.py FLAG...

Run with the engine's venv python; FLAG... are `vllm serve`'s flags, the model as --model.
vLLM reads one key from VLLM_API_KEY, several only from --api-key, that is from the command
line, which every local account reads in /proc/PID/cmdline. This reads the keys from PATH
(one a line; the role's model_engine_secrets_dir/api-keys, mode 0600, the engine account's),
parses the flags with `vllm serve`'s own parser, puts the keys into the parsed arguments and
runs `vllm serve` in this process: no process's arguments ever hold a key. vLLM's children
are started by multiprocessing's spawn, which hands them their arguments through a pipe.

Refused, before vLLM starts: --api-key among the flags, a keys file that cannot be read or
holds no key, and VLLM_USE_RUST_FRONTEND (vLLM gives that frontend its arguments, the keys
among them, on its command line). zerolayer_vllm_check.py parses flags with parse_serve_args
here, so the settings check and the engine judge them with the same parser.
"""

import os
import sys

KEYS_FILE_VARIABLE = "ZEROLAYER_API_KEYS_FILE"


class Refused(Exception):
    """A setting that would put a key where it does not belong, or no key at all."""


def read_keys(path):
    try:
        with open(path, encoding="utf-8") as handle:
            keys = [line.strip() for line in handle if line.strip()]
    except OSError as error:
        raise Refused("cannot read the API keys file %s: %s" % (path, error.strerror)) from error
    if not keys:
        raise Refused("the API keys file %s holds no key" % path)
    return keys


def parse_serve_args(flags):
    """`vllm serve`'s subcommand and the arguments it parsed and validated from `flags`.
    A flag it does not take exits (SystemExit), as `vllm serve` itself does."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    command = ServeSubcommand()
    parser = command.subparser_init(FlexibleArgumentParser(prog="vllm").add_subparsers())
    args = parser.parse_args(flags)
    if args.api_key:
        raise Refused(
            "--api-key puts the keys on the command line; give them in %s" % KEYS_FILE_VARIABLE
        )
    command.validate(args)
    return command, args


def refuse_rust_frontend():
    from vllm import envs

    if envs.VLLM_USE_RUST_FRONTEND:
        raise Refused(
            "VLLM_USE_RUST_FRONTEND is set: vLLM would start that frontend with the keys"
            " on its command line"
        )


def main(argv):
    # What vLLM's own CLI does first (cli_env_setup): children by spawn, not fork.
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    path = os.environ.get(KEYS_FILE_VARIABLE)
    try:
        if not path:
            raise Refused("%s names no API keys file" % KEYS_FILE_VARIABLE)
        keys = read_keys(path)
        refuse_rust_frontend()
        command, args = parse_serve_args(argv)
    except Refused as error:
        sys.stderr.write("zerolayer_vllm_serve: refused: %s\n" % error)
        return 2
    args.api_key = keys
    try:
        from vllm.logger import configure_logging_from_args
    except ImportError:  # a vLLM from before it; its serve configures logging itself
        pass
    else:
        configure_logging_from_args(args)
    command.cmd(args)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
