# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""A small client of etcd's v3 API over its JSON gateway, with Python's standard library only.

The GPU nodes have nothing but the standard library, and the controller uses the same code,
so both sides speak to the store the same way (see docs/rollout-store.md for why no client
library). Keys and values travel base64-encoded in the JSON; revisions come back as strings.

Every failure raises FleetError: StoreUnavailable when no endpoint answered (callers decide
what an outage means for them: a rollback goes on, a canary holds), FleetError with the
store's own message when the store answered with an error (permission denied, say).
"""

from __future__ import annotations

import base64
import http.client
import json
import re
import socket
import ssl
import urllib.parse

from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

DEFAULT_TIMEOUT_S = 3.0
# Requests that change nothing a second copy would change again: a read, a login, a lease
# (one granted twice leaves an unused lease that expires by its TTL). Asked once more when no
# endpoint answered in time: a member busy for a moment (a slow fsync on a loaded disk) is
# not an outage. Writes are never asked twice: the first may have been applied.
RETRIED_PATHS = frozenset(
    ("/v3/kv/range", "/v3/auth/authenticate", "/v3/lease/grant", "/v3/lease/timetolive")
)
# A token to sign in again for: expired or unknown ("invalid auth token"), or a JWT signed
# before the last change of users, roles or permissions ("revision of auth store is old":
# etcd keeps the auth revision in the JWT and refuses it after any such change; etcd's Go
# client signs in again on both).
_TOKEN_TO_RENEW = re.compile(r"auth token|revision of auth store is old")


class StoreUnavailable(FleetError):
    """No endpoint of the store could be reached (or none answered in time)."""


# etcd's answer to a renewal of a lease it does not hold (released, expired, unknown).
LEASE_GONE = "lease not found"


def lease_gone(exc):
    """Whether a store error says the lease is gone, rather than that the store failed the
    request (a timeout, a leader change, a busy apply): only the first loses the lease."""
    return LEASE_GONE in str(exc)


def _b64(text):
    data = text if isinstance(text, bytes) else text.encode()
    return base64.b64encode(data).decode("ascii")


def _unb64(text):
    return base64.b64decode(text or "")


def prefix_end(prefix):
    """The range_end that makes a range over every key starting with prefix."""
    data = bytearray(prefix.encode())
    while data:
        if data[-1] < 0xFF:
            data[-1] += 1
            return bytes(data)
        data.pop()
    return b"\0"


class KeyValue:
    """One key of the store as a range or a watch returns it."""

    __slots__ = ("create_revision", "key", "lease", "mod_revision", "value", "version")

    def __init__(self, raw):
        self.key = _unb64(raw.get("key")).decode()
        self.value = _unb64(raw.get("value"))
        self.mod_revision = int(raw.get("mod_revision", 0))
        self.create_revision = int(raw.get("create_revision", 0))
        self.version = int(raw.get("version", 0))
        self.lease = int(raw.get("lease", 0))

    def json(self):
        """The value as JSON, or a FleetError naming the key."""
        try:
            return json.loads(self.value.decode())
        except ValueError as exc:
            raise FleetError(
                "store key %s does not hold JSON: %s" % (self.key, exc), {"key": self.key}
            ) from None


class EtcdClient:
    """The store's endpoints, TLS material and timeout; one HTTP request per call."""

    def __init__(
        self,
        endpoints,
        ca_file=None,
        cert_file=None,
        key_file=None,
        timeout=None,
        user=None,
        password=None,
    ):
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        endpoints = [str(e).rstrip("/") for e in endpoints or [] if str(e).strip()]
        if not endpoints:
            raise FleetError(
                "endpoints must name at least one store URL, e.g. https://10.0.0.5:2379",
                {"field": "endpoints"},
            )
        for endpoint in endpoints:
            if not endpoint.startswith(("http://", "https://")):
                raise FleetError(
                    "endpoints: %r must start with https:// (or http:// for a store without "
                    "TLS)" % endpoint,
                    {"field": "endpoints", "value": endpoint},
                )
        self.endpoints = endpoints
        self.timeout = float(timeout or DEFAULT_TIMEOUT_S)
        # etcd's JSON gateway talks to the server over a connection of its own, so the client
        # certificate authenticates the TLS link but not the user: the user signs in with its
        # password and sends the token it gets with every request.
        self.user = user
        self.password = password
        self._token = None
        self._context = None
        if any(e.startswith("https://") for e in endpoints):
            try:
                self._context = ssl.create_default_context(cafile=ca_file)
                if cert_file:
                    self._context.load_cert_chain(cert_file, key_file)
            except (OSError, ssl.SSLError) as exc:
                raise FleetError(
                    "store TLS files cannot be loaded (ca %s, cert %s, key %s): %s"
                    % (ca_file, cert_file, key_file, exc),
                    {"field": "ca_file"},
                ) from None

    # ------------------------------------------------------------ transport

    def _open(self, path, body, timeout, token=True):
        """POST body to path on the first endpoint that answers; an open _Response."""
        if token and self.user and self._token is None:
            self._authenticate()
        headers = {"Content-Type": "application/json"}
        if token and self._token:
            headers["Authorization"] = self._token
        data = json.dumps(body).encode()
        errors = []
        for endpoint in self.endpoints:
            url = urllib.parse.urlsplit(endpoint)
            if url.scheme == "https":
                connection = http.client.HTTPSConnection(
                    url.hostname, url.port or 2379, timeout=timeout, context=self._context
                )
            else:
                connection = http.client.HTTPConnection(
                    url.hostname, url.port or 2379, timeout=timeout
                )
            try:
                connection.request("POST", url.path.rstrip("/") + path, data, headers)
                response = connection.getresponse()
            except (OSError, http.client.HTTPException) as exc:  # refused, timed out, TLS
                connection.close()
                errors.append("%s: %s" % (endpoint, exc))
                continue
            if response.status >= 400:
                text = response.read()
                connection.close()
                raise self._answered_error(path, response.status, response.reason, text)
            return _Response(connection, response)
        raise StoreUnavailable(
            "the rollout store cannot be reached (%s)" % "; ".join(errors),
            {"endpoints": self.endpoints},
        )

    @staticmethod
    def _answered_error(path, status, reason, text):
        try:
            answer = json.loads(text.decode() or "{}")
        except ValueError:
            answer = {}
        message = answer.get("message") or answer.get("error") or reason
        return FleetError(
            "the rollout store refused %s: %s (HTTP %s)" % (path, message, status),
            {"status": status, "store_error": message},
        )

    def _authenticate(self):
        if self.password is None:
            raise FleetError(
                "the rollout store user %s has no password (password_file)" % self.user,
                {"field": "password_file"},
            )
        try:
            answer = self.call(
                "/v3/auth/authenticate", {"name": self.user, "password": self.password}, token=False
            )
        except StoreUnavailable:
            raise
        except FleetError as exc:
            if "authentication failed" not in exc.message:
                raise
            # A login refused is bad input (the user or its password), named as such.
            raise FleetError(
                "the rollout store refused the login of user %s (%s): check user and "
                "password_file" % (self.user, exc.details.get("store_error") or exc.message),
                dict(exc.details, field="password_file"),
            ) from None
        self._token = answer.get("token")

    def call(self, path, body, token=True):
        """POST body to path; the decoded JSON answer. An expired token is renewed once; a
        request of RETRIED_PATHS that no endpoint answered is sent once more."""
        try:
            return self._call_once_more_if_unanswered(path, body, token)
        except FleetError as exc:
            if not (token and self.user and _TOKEN_TO_RENEW.search(exc.message)):
                raise
        self._token = None
        return self._call_once_more_if_unanswered(path, body, token)

    def _call_once_more_if_unanswered(self, path, body, token):
        try:
            return self._call(path, body, token)
        except StoreUnavailable:
            if path not in RETRIED_PATHS:
                raise
        return self._call(path, body, token)

    def _call(self, path, body, token):
        try:
            with self._open(path, body, self.timeout, token) as response:
                answer = json.loads(response.read().decode() or "{}")
        except (OSError, ValueError) as exc:
            if isinstance(exc, FleetError):
                raise
            raise StoreUnavailable(
                "the rollout store did not answer %s: %s" % (path, exc),
                {"endpoints": self.endpoints},
            ) from None
        if "error" in answer and "result" not in answer:
            raise FleetError(
                "the rollout store refused %s: %s" % (path, answer.get("message") or answer),
                {"store_error": answer.get("message")},
            )
        return answer

    # ------------------------------------------------------------ kv

    def get(self, key):
        """The KeyValue at key, or None."""
        answer = self.call("/v3/kv/range", {"key": _b64(key)})
        kvs = answer.get("kvs") or []
        return KeyValue(kvs[0]) if kvs else None

    def get_prefix(self, prefix, min_create_revision=0):
        """Every KeyValue under prefix (created at min_create_revision or later, when given)."""
        return self.get_prefix_at(prefix, min_create_revision)[0]

    def get_prefix_at(self, prefix, min_create_revision=0, min_mod_revision=0):
        """(every KeyValue under prefix, the store's revision of that read); with
        min_mod_revision, only those written at that revision or later."""
        body = {"key": _b64(prefix), "range_end": _b64(prefix_end(prefix))}
        if min_create_revision:
            body["min_create_revision"] = str(int(min_create_revision))
        if min_mod_revision:
            body["min_mod_revision"] = str(int(min_mod_revision))
        answer = self.call("/v3/kv/range", body)
        return [KeyValue(raw) for raw in answer.get("kvs") or []], self.revision(answer)

    def revision(self, answer):
        return int(answer.get("header", {}).get("revision", 0))

    def put(self, key, value, lease=0):
        return self.revision(self.call("/v3/kv/put", _put_request(key, value, lease)))

    def delete(self, key):
        return int(self.call("/v3/kv/deleterange", {"key": _b64(key)}).get("deleted", 0))

    def put_if(self, key, value, mod_revision, lease=0, also=(), unchanged_since=None):
        """Compare-and-swap: put only if key's mod_revision is still mod_revision (0: absent).

        also: (key, value) pairs put in the same transaction, only when the swap succeeds.
        unchanged_since: (prefix, revision): and only if no key under prefix was written
        after revision (a read of the prefix at that revision still holds).
        Returns (succeeded, current KeyValue or None when it failed).
        """
        puts = [{"request_put": _put_request(key, value, lease)}]
        puts.extend(
            {"request_put": _put_request(other, other_value)} for other, other_value in also
        )
        answer = self.call(
            "/v3/kv/txn",
            {
                "compare": [_written_at(key, mod_revision), *_unchanged_since(unchanged_since)],
                "success": puts,
                "failure": [{"request_range": {"key": _b64(key)}}],
            },
        )
        if answer.get("succeeded"):
            return True, None
        for response in answer.get("responses") or []:
            kvs = response.get("response_range", {}).get("kvs") or []
            if kvs:
                return False, KeyValue(kvs[0])
        return False, None

    def put_if_reading(self, key, value, mod_revision, read_prefix):
        """Compare-and-swap as put_if, and in the same transaction a read of the keys under
        read_prefix (keys only): what was there at the very revision of the put.

        Returns (succeeded, the store's revision, [KeyValue] read; empty when it failed).
        """
        answer = self.call(
            "/v3/kv/txn",
            {
                "compare": [_written_at(key, mod_revision)],
                "success": [
                    {"request_put": _put_request(key, value)},
                    {
                        "request_range": {
                            "key": _b64(read_prefix),
                            "range_end": _b64(prefix_end(read_prefix)),
                            "keys_only": True,
                        }
                    },
                ],
            },
        )
        if not answer.get("succeeded"):
            return False, self.revision(answer), []
        kvs = []
        for response in answer.get("responses") or []:
            kvs.extend(KeyValue(raw) for raw in response.get("response_range", {}).get("kvs") or [])
        return True, self.revision(answer), kvs

    def get_prefix_pages(self, prefix, page_size):
        """Lists of KeyValue under prefix, page_size keys at a time, in key order: a prefix
        of any size read within etcd's response limits."""
        start, end = prefix.encode(), prefix_end(prefix)
        while True:
            answer = self.call(
                "/v3/kv/range",
                {"key": _b64(start), "range_end": _b64(end), "limit": str(int(page_size))},
            )
            kvs = [KeyValue(raw) for raw in answer.get("kvs") or []]
            if kvs:
                yield kvs
            if not answer.get("more") or not kvs:
                return
            # The next page starts right after the last key of this one.
            start = kvs[-1].key.encode() + b"\0"

    def delete_if_unchanged(self, keys):
        """Delete [(key, mod_revision)] in one transaction, only if none was written since it
        was read (a key deleted since fails too); whether they were deleted."""
        answer = self.call(
            "/v3/kv/txn",
            {
                "compare": [_written_at(key, mod_revision) for key, mod_revision in keys],
                "success": [{"request_delete_range": {"key": _b64(key)}} for key, _rev in keys],
            },
        )
        return bool(answer.get("succeeded"))

    # ------------------------------------------------------------ leases

    def grant_lease(self, ttl_s):
        answer = self.call("/v3/lease/grant", {"TTL": str(int(ttl_s))})
        return int(answer["ID"])

    def keep_alive(self, lease):
        """Renew lease once; the TTL left (0 or less: it had expired). A lease the store no
        longer knows may also come back as an error: lease_gone(exc) tells it from others."""
        answer = self.call("/v3/lease/keepalive", {"ID": str(lease)})
        return int(answer.get("result", {}).get("TTL", 0))

    def lease_ttl(self, lease):
        """Seconds left on lease (-1 when it has expired or never existed)."""
        answer = self.call("/v3/lease/timetolive", {"ID": str(lease)})
        return int(answer.get("TTL", -1))

    def revoke_lease(self, lease):
        try:
            self.call("/v3/lease/revoke", {"ID": str(lease)})
        except FleetError as exc:
            if "not found" not in str(exc):
                raise

    # ------------------------------------------------------------ watch

    def watch(self, key, start_revision=0, timeout=None):
        """Yield lists of KeyValue changed at key, as the store sends them.

        The response stays open; each line is one JSON object. timeout bounds the wait for
        each line (None: the client's timeout); StoreUnavailable ends the watch, also when the
        store cancels it (start_revision was compacted away): the caller reads afresh and
        watches again from the revision of that read, at once rather than after timeout.
        """
        body = {"create_request": {"key": _b64(key)}}
        if start_revision:
            body["create_request"]["start_revision"] = str(int(start_revision))
        response = self._open("/v3/watch", body, timeout or self.timeout)
        try:
            for line in response:
                try:
                    result = json.loads(line.decode()).get("result", {})
                except ValueError:
                    continue
                if result.get("canceled"):
                    raise _cancelled(key, start_revision, result, self.endpoints)
                events = result.get("events") or []
                if events:
                    yield [KeyValue(event.get("kv", {})) for event in events]
        except (OSError, socket.timeout) as exc:
            raise StoreUnavailable(
                "the watch of %s ended: %s" % (key, exc), {"endpoints": self.endpoints}
            ) from None
        finally:
            response.close()


def _cancelled(key, start_revision, result, endpoints):
    """Why the store cancelled a watch: its start revision compacted away (read afresh and
    watch again at once: StoreUnavailable) or an answer such as a denied permission (an
    error the caller reports and retries later, never in a tight loop)."""
    compacted = int(result.get("compact_revision") or 0)
    if compacted:
        return StoreUnavailable(
            "the store cancelled the watch of %s: revision %s was compacted (the oldest kept is "
            "%d); read it again" % (key, start_revision, compacted),
            {"endpoints": endpoints, "compact_revision": compacted},
        )
    return FleetError(
        "the store cancelled the watch of %s: %s"
        % (key, result.get("cancel_reason") or "no reason given"),
        {"endpoints": endpoints},
    )


class _Response:
    """An answer of the store and its connection, closed together."""

    def __init__(self, connection, response):
        self.connection = connection
        self.response = response

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def read(self):
        return self.response.read()

    def __iter__(self):
        while True:
            line = self.response.readline()
            if not line:
                return
            yield line

    def close(self):
        self.response.close()
        self.connection.close()


def _written_at(key, mod_revision):
    """The compare that key was last written at mod_revision (0: that it is absent)."""
    return {
        "key": _b64(key),
        "target": "MOD",
        "result": "EQUAL",
        "mod_revision": str(int(mod_revision)),
    }


def _unchanged_since(read):
    """The compare that a whole prefix read at a revision still holds: every key in its range
    was last written at or before that revision (a key written since fails it)."""
    if read is None:
        return []
    prefix, revision = read
    return [
        {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "target": "MOD",
            "result": "LESS",
            "mod_revision": str(int(revision) + 1),
        }
    ]


def _put_request(key, value, lease=0):
    """The body of one put, alone (/v3/kv/put) or in a transaction (request_put)."""
    body = {"key": _b64(key), "value": _b64(_encode(value))}
    if lease:
        body["lease"] = str(lease)
    return body


def _encode(value):
    if isinstance(value, (bytes, str)):
        return value
    return json.dumps(value, sort_keys=True)
