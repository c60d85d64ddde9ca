"""HTTP client run inside a test netns: one new connection per request.

Counts responses by body, so the tests see who served each connection. Each
connection ends with an RST (SO_LINGER 0) after the server's FIN: no TIME_WAIT
is left on either side, so ports can be reused at once and never run out.

    http_client.py PORT --count N                 N connections, kernel-chosen source ports
    http_client.py PORT --count N --source-port P [--source-port Q ...]
                                                   N connections from each fixed source port
    http_client.py PORT --until-file F             connect until file F exists
    --port-range A:B                               bind each connection to the next source
                                                   port of A..B in turn, so the test knows
                                                   the 4-tuple of every connection (and can
                                                   say which path a failed one would take)
    --host H                                       server (and source) address, default
                                                   127.0.0.1; ::1 for IPv6
    --source-host S                                bind each connection to source address S
                                                   (a client of a cohort, e.g. 127.0.0.2)
    --client-hosts S1,S2,...                       N connections from each of these source
                                                   addresses in turn, reported per address
Prints one JSON object: {"served": {body: count}, "errors": n, "error_samples": [...],
"by_source_port": {port: [body, ...]}, "failed_source_ports": [port, ...],
"by_source_host": {address: [body, ...]}} (failed_source_ports: with --port-range, every
failed connection's source port; by_source_host: with --client-hosts).
"""

import argparse
import itertools
import json
import os
import socket
import struct
import sys

REQUEST = b"GET / HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"


def fetch(host, port, source_port=None, source_host=None):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.settimeout(10)
        if source_port is not None or source_host is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((source_host or host, source_port or 0))
        sock.connect((host, port))
        sock.sendall(REQUEST)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    response = b"".join(chunks)
    head, _, body = response.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError("unexpected response %r" % response[:80])
    return body.decode().strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--source-port", type=int, action="append", default=[])
    parser.add_argument("--until-file")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port-range")
    parser.add_argument("--source-host")
    parser.add_argument("--client-hosts")
    args = parser.parse_args()

    served, errors, samples, by_source, failed_ports, by_host = {}, 0, [], {}, [], {}
    cycle = None
    if args.port_range:
        first, last = (int(part) for part in args.port_range.split(":"))
        cycle = itertools.cycle(range(first, last + 1))

    def one(source_port=None, source_host=args.source_host):
        nonlocal errors
        if cycle is not None:
            source_port = next(cycle)
        try:
            body = fetch(args.host, args.port, source_port, source_host)
        except (OSError, RuntimeError) as exc:
            errors += 1
            if len(samples) < 5:
                samples.append(repr(exc))
            if cycle is not None:
                failed_ports.append(source_port)
            body = "error"
        else:
            served[body] = served.get(body, 0) + 1
        if source_port is not None and cycle is None:
            by_source.setdefault(str(source_port), []).append(body)
        if args.client_hosts:
            by_host.setdefault(source_host, []).append(body)

    if args.until_file:
        # Tell the test we run, then go on until told to stop.
        open(args.until_file + ".started", "w").close()
        while not os.path.exists(args.until_file):
            one()
    elif args.client_hosts:
        for _ in range(args.count):
            for source_host in args.client_hosts.split(","):
                one(source_host=source_host)
    elif args.source_port:
        for _ in range(args.count):
            for source_port in args.source_port:
                one(source_port)
    else:
        for _ in range(args.count):
            one()
    json.dump(
        {
            "served": served,
            "errors": errors,
            "error_samples": samples,
            "by_source_port": by_source,
            "failed_source_ports": failed_ports,
            "by_source_host": by_host,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
