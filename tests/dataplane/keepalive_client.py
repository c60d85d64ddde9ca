"""HTTP client run inside a test netns: one keep-alive connection, as a pooled client keeps it.

Sends GET PATH on the same connection every --interval seconds until --until-file exists,
and opens a new connection only when the server closed the last one (it said
"Connection: close", or closed it while idle). A request that finds its reused connection
closed before any answer byte is sent again once on a new one, as pooled clients do; that
is counted as a retry, not a failure. Writes --started-file once the first answer came.

Prints one JSON object: {"answers": [[unix time, path, connection number], ...],
"connections": n, "retries": n, "errors": [...]}; the path is the answer's
X-Zerolayer-Path header ("direct" when it has none).
"""

import argparse
import http.client
import json
import os
import time


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--path", default="/v1/models")
    parser.add_argument("--interval", type=float, default=0.05)
    parser.add_argument("--until-file", required=True)
    parser.add_argument("--started-file", required=True)
    args = parser.parse_args()

    answers, errors = [], []
    connections = retries = 0
    connection = None
    while not os.path.exists(args.until_file):
        for attempt in (1, 2):
            reused = connection is not None
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=10)
                connections += 1
            try:
                connection.request("GET", args.path)
                response = connection.getresponse()
                response.read()
            except (http.client.RemoteDisconnected, ConnectionError) as error:
                connection.close()
                connection = None
                if reused and attempt == 1:
                    retries += 1
                    continue
                errors.append(repr(error))
                break
            path = response.getheader("X-Zerolayer-Path") or "direct"
            answers.append([time.time(), path, connections])
            if response.will_close:
                connection.close()
                connection = None
            break
        if len(answers) == 1 and not os.path.exists(args.started_file):
            open(args.started_file, "w").close()
        time.sleep(args.interval)
    if connection is not None:
        connection.close()
    print(
        json.dumps(
            {"answers": answers, "connections": connections, "retries": retries, "errors": errors}
        )
    )


if __name__ == "__main__":
    main()
