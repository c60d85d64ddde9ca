"""The official OpenAI Python SDK against a node's service port, as a client application
would call it: chat completions with and without stream=True, and the model list.

    python openai_sdk_client.py BASE_URL KEY_FILE MODEL CALLS

Each call uses a new client (a new TCP connection), so the router decides the path of every
call afresh. Prints one JSON summary: calls made and failed, the failures, what the SDK
parsed (finish reasons, usage, chunk counts, the model list) for the test to check.
"""

import json
import sys

from openai import OpenAI

MAX_TOKENS = 8


def one_call(base_url, key, model, stream):
    client = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    try:
        messages = [{"role": "user", "content": "hello fleet"}]
        # ignore_eos: every answer is MAX_TOKENS long, so a stream's chunk count is known.
        extra = {"ignore_eos": True}
        if not stream:
            answer = client.chat.completions.create(
                model=model, messages=messages, max_tokens=MAX_TOKENS, extra_body=extra
            )
            return {
                "stream": False,
                "finish_reason": answer.choices[0].finish_reason,
                "completion_tokens": answer.usage.completion_tokens,
                "content_chars": len(answer.choices[0].message.content or ""),
            }
        chunks = list(
            client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=MAX_TOKENS,
                stream=True,
                stream_options={"include_usage": True},
                extra_body=extra,
            )
        )
        with_choices = [chunk for chunk in chunks if chunk.choices]
        return {
            "stream": True,
            "finish_reason": with_choices[-1].choices[0].finish_reason if with_choices else None,
            "content_chunks": sum(1 for chunk in with_choices if chunk.choices[0].delta.content),
            "completion_tokens": chunks[-1].usage.completion_tokens if chunks[-1].usage else None,
        }
    finally:
        client.close()


def main(argv):
    base_url, key_file, model, calls = argv[0], argv[1], argv[2], int(argv[3])
    with open(key_file, encoding="utf-8") as handle:
        key = handle.read().strip()
    results, failures = [], []
    for number in range(calls):
        try:
            results.append(one_call(base_url, key, model, stream=number % 2 == 1))
        # Every failure is reported, by type: the test shows them.
        except Exception as error:
            failures.append("%s: %s" % (type(error).__name__, error))
    listing = OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)
    try:
        models = [entry.id for entry in listing.models.list()]
    finally:
        listing.close()
    print(
        json.dumps(
            {
                "calls": calls,
                "failed": len(failures),
                "failures": failures[:5],
                "results": results,
                "models": models,
                "max_tokens": MAX_TOKENS,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
