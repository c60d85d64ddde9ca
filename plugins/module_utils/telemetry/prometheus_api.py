# Copyright: zerolayer.fleet contributors
# Apache License 2.0 (see LICENSE)
"""Instant queries against Prometheus' HTTP API (/api/v1/query).

Every way a query can go wrong (server down, timeout, TLS, HTTP error, a
Prometheus error reply, a reply of the wrong shape) raises FleetError with
details["kind"] set, so the gate layer can turn it into a `hold` with the cause
instead of a failure. "unreachable" and "timeout" mean the server could not be
asked at all; "query" means the server answered with an error.
"""

from __future__ import annotations

import json
import socket
import ssl
from urllib.error import HTTPError, URLError
from urllib.parse import urlencode

from ansible.module_utils.urls import ConnectionError as UrlsConnectionError
from ansible.module_utils.urls import open_url
from ansible_collections.zerolayer.fleet.plugins.module_utils.common.errors import FleetError

QUERY_PATH = "/api/v1/query"
QUERY_RANGE_PATH = "/api/v1/query_range"
UNREACHABLE_KINDS = ("unreachable", "timeout")


class Sample:
    """One series of an instant query result: its labels and its value."""

    def __init__(self, labels, value):
        self.labels = dict(labels)
        self.value = value

    def label_text(self):
        """The labels as PromQL writes them, for messages: {instance="n1",path="direct"}."""
        if not self.labels:
            return "{}"
        pairs = ",".join('%s="%s"' % (key, self.labels[key]) for key in sorted(self.labels))
        return "{%s}" % pairs

    def __repr__(self):
        return "Sample(%s, %r)" % (self.label_text(), self.value)


def parse_sample_value(text):
    """Prometheus sends sample values as strings: "0.5", "NaN", "+Inf", "-Inf"."""
    try:
        return float(text)
    except (TypeError, ValueError):
        raise FleetError(
            "Prometheus returned a sample value that is not a number: %r" % (text,),
            {"kind": "query"},
        ) from None


def _reply_data(payload):
    if not isinstance(payload, dict):
        raise FleetError("Prometheus reply is not a JSON object", {"kind": "query"})
    if payload.get("status") != "success":
        raise FleetError(
            "Prometheus query error: %s: %s"
            % (payload.get("errorType", "unknown"), payload.get("error", "no message")),
            {"kind": "query"},
        )
    data = payload.get("data")
    if not isinstance(data, dict):
        raise FleetError("Prometheus reply has no data object", {"kind": "query"})
    return data.get("resultType"), data.get("result")


# What a reply of the right status but the wrong shape raises while it is read (a proxy in
# front of Prometheus, another API): a query error like any other, so a gate holds.
SHAPE_ERRORS = (AttributeError, KeyError, IndexError, TypeError, ValueError)


def _shape_error(result_type, result):
    return FleetError(
        "Prometheus reply has an unexpected shape for a %s: %.200r" % (result_type, result),
        {"kind": "query"},
    )


def parse_range_response(payload):
    """{series labels as text: [(unix time, value), ...]} of a decoded /api/v1/query_range reply."""
    result_type, result = _reply_data(payload)
    if result_type != "matrix":
        raise FleetError(
            "a range query returned a %s, not a matrix" % result_type, {"kind": "query"}
        )
    try:
        return {
            Sample(item.get("metric", {}), None).label_text(): [
                (float(at), parse_sample_value(value)) for at, value in item.get("values", [])
            ]
            for item in result
        }
    except SHAPE_ERRORS:
        raise _shape_error(result_type, result) from None


def parse_query_response(payload):
    """The samples of a decoded /api/v1/query reply.

    A vector gives one Sample per series, a scalar one Sample without labels.
    Range vectors and strings cannot be compared with a threshold and are refused.
    """
    result_type, result = _reply_data(payload)
    try:
        if result_type == "scalar":
            return [Sample({}, parse_sample_value(result[1]))]
        if result_type == "vector":
            return [
                Sample(item.get("metric", {}), parse_sample_value(item["value"][1]))
                for item in result
            ]
    except SHAPE_ERRORS:
        raise _shape_error(result_type, result) from None
    raise FleetError(
        "the query returns a %s; a gate needs an instant vector or a scalar "
        "(wrap a range selector in a function such as rate() or max_over_time())" % result_type,
        {"kind": "query"},
    )


def _error_from_http(error):
    """Prometheus replies 400/422/503 with a JSON body naming the error."""
    try:
        body = json.loads(error.read().decode("utf-8"))
        detail = "%s: %s" % (body.get("errorType", "unknown"), body.get("error", "no message"))
    except Exception:
        detail = str(error.reason)
    kind = "unreachable" if error.code in (502, 503, 504) else "query"
    return FleetError(
        "Prometheus answered HTTP %d: %s" % (error.code, detail),
        {"kind": kind, "status": error.code},
    )


def _is_timeout(error):
    reason = getattr(error, "reason", error)
    return isinstance(reason, (socket.timeout, TimeoutError)) or "timed out" in str(reason)


class PrometheusClient:
    """Instant queries against one Prometheus server.

    `opener` is open_url's signature; tests pass their own to fake replies.
    """

    def __init__(
        self, url, timeout=10, bearer_token=None, validate_certs=True, ca_path=None, opener=open_url
    ):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise FleetError(
                "prometheus_url must be an http:// or https:// URL; got %r" % (url,),
                {"field": "prometheus_url"},
            )
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.bearer_token = bearer_token
        self.validate_certs = validate_certs
        self.ca_path = ca_path
        self.opener = opener

    def _headers(self):
        headers = {
            "Accept": "application/json",
            "Content-Type": "application/x-www-form-urlencoded",
        }
        if self.bearer_token:
            headers["Authorization"] = "Bearer %s" % self.bearer_token
        return headers

    def query(self, promql):
        """The samples of an instant query evaluated at the server's current time."""
        return parse_query_response(self._post(QUERY_PATH, {"query": promql}))

    def query_range(self, promql, start, end, step):
        """{labels as text: [(unix time, value), ...]} of a range query (for reports and plots)."""
        payload = self._post(
            QUERY_RANGE_PATH, {"query": promql, "start": start, "end": end, "step": step}
        )
        return parse_range_response(payload)

    def _post(self, path, params):
        # POST keeps long queries out of URLs (and out of proxy logs).
        body = urlencode(params)
        try:
            response = self.opener(
                self.url + path,
                data=body,
                headers=self._headers(),
                method="POST",
                timeout=self.timeout,
                validate_certs=self.validate_certs,
                ca_path=self.ca_path,
            )
            raw = response.read()
        except HTTPError as error:
            raise _error_from_http(error) from None
        except (URLError, UrlsConnectionError, ssl.SSLError, OSError) as error:
            kind = "timeout" if _is_timeout(error) else "unreachable"
            raise FleetError(
                "Prometheus at %s %s: %s"
                % (
                    self.url,
                    "timed out" if kind == "timeout" else "is unreachable",
                    getattr(error, "reason", error),
                ),
                {"kind": kind},
            ) from None
        try:
            return json.loads(raw.decode("utf-8"))
        except ValueError:
            raise FleetError("Prometheus reply is not JSON", {"kind": "query"}) from None
