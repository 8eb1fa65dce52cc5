"""One run of an HTTP or TCP check, with Consul's statuses and output text (``agent/checks/check.go``).

HTTP: 2xx is passing, 429 warning, anything else (or no answer) critical; the output is
``HTTP GET <url>: 200 OK Output: <body>`` with the body cut to 4 KiB. A new connection per run, no
keep-alive, ``User-Agent: Consul Health Check``, default timeout 10 s. TCP: passing when a connection
opens, output ``TCP connect <addr>: Success``.
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request
from http.client import responses
from urllib.parse import urlsplit

from devconsul.definitions import CheckDefinition

DEFAULT_TIMEOUT = 10.0
BODY_MAX = 4096


def run_probe(defn: CheckDefinition) -> tuple[str, str]:
    timeout = defn.timeout or DEFAULT_TIMEOUT
    if defn.tcp:
        return _tcp(defn.tcp, timeout)
    return _http(defn, timeout)


def _http(defn: CheckDefinition, timeout: float) -> tuple[str, str]:
    method = (defn.method or "GET").upper()
    scheme = urlsplit(defn.http).scheme
    if scheme not in ("http", "https"):
        # Go's http client (Consul's) refuses these the same way; urllib would open file:// and data: URLs
        # and echo their content into the check's output.
        return "critical", f'{method.title()} "{defn.http}": unsupported protocol scheme "{scheme}"'

    headers = {"User-Agent": "Consul Health Check", "Accept": "text/plain, text/*, */*"}
    for name, values in defn.header.items():
        headers[name] = ", ".join(values) if isinstance(values, list) else str(values)
    data = defn.body.encode() if defn.body else None
    request = urllib.request.Request(defn.http, data=data, headers=headers, method=method)
    context = ssl._create_unverified_context() if defn.tls_skip_verify else None  # noqa: S323 - opt-in
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:
            code, body = resp.status or 0, resp.read(BODY_MAX)
    except urllib.error.HTTPError as exc:
        code, body = exc.code, exc.read(BODY_MAX)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return "critical", f'{method.title()} "{defn.http}": {reason}'
    output = f"HTTP {method} {defn.http}: {code} {responses.get(code, '')} Output: {body.decode(errors='replace')}"
    if 200 <= code <= 299:
        return "passing", output
    if code == 429:
        return "warning", output
    return "critical", output


def _tcp(address: str, timeout: float) -> tuple[str, str]:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return "passing", f"TCP connect {address}: Success"
    except (OSError, ValueError) as exc:
        return "critical", f"dial tcp {address}: {exc}"
