"""consul_io/client.py: one error type with one-line messages, the one token rule, timeouts."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from cli import neterr
from consul_io.client import ConsulIO, ConsulUnavailable, TokenError, read_token_file, resolve_token

pytestmark = pytest.mark.integration

TOKEN = "5c0b1c9e-6a7e-4f1e-9a43-1d8c2f4b7e10"


def token_file(tmp_path, text: str, mode: int = 0o600):
    path = tmp_path / "consul.token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_a_token_is_the_value_itself_else_a_0600_file_else_none(tmp_path):
    path = token_file(tmp_path, "b1d2e3f4-0000-4000-8000-000000000000\n")
    assert resolve_token(TOKEN) == TOKEN
    assert resolve_token(TOKEN, str(path)) == TOKEN  # the value wins over the file
    assert resolve_token(None, str(path)) == resolve_token("", path) == "b1d2e3f4-0000-4000-8000-000000000000"
    assert resolve_token(None, None) is None and resolve_token("", "") is None


@pytest.mark.parametrize(("text", "mode", "message"), [
    (TOKEN, 0o640, "readable by group/others (mode 0640); chmod 600"),
    (TOKEN, 0o604, "readable by group/others (mode 0604); chmod 600"),
    ("", 0o600, "must hold one Consul ACL token (found nothing)"),
    (f"{TOKEN} {TOKEN}", 0o600, "must hold one Consul ACL token (found whitespace)"),
])
def test_unusable_token_files_are_refused_naming_the_file(tmp_path, text, mode, message):
    path = token_file(tmp_path, text, mode)
    with pytest.raises(TokenError) as info:
        resolve_token(token_file=str(path))
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    assert TOKEN not in str(info.value)  # a secret never goes into a message


def test_a_configured_token_file_that_is_missing_is_an_error_not_no_token(tmp_path):
    """Every reader's rule (the agent's too): no token would only turn into 403s on every call later."""
    with pytest.raises(TokenError, match=r"consul.token: cannot read the Consul token file: No such file"):
        resolve_token(token_file=tmp_path / "consul.token")
    with pytest.raises(TokenError, match=r"consul.token: cannot read the Consul token file: No such file"):
        read_token_file(tmp_path / "consul.token")


def test_a_token_value_with_whitespace_is_refused_without_echoing_it():
    with pytest.raises(TokenError) as info:
        resolve_token("abc def")
    assert "abc" not in str(info.value)


def test_bad_addresses_are_named():
    with pytest.raises(ConsulUnavailable, match=r"Consul address 'nonsense' is not HOST:PORT"):
        ConsulIO("nonsense")
    with pytest.raises(ConsulUnavailable, match=r"is not HOST:PORT"):
        ConsulIO("127.0.0.1:99999")
    with pytest.raises(ConsulUnavailable, match=r"'ftp://127.0.0.1:8500': the scheme must be http or https"):
        ConsulIO("ftp://127.0.0.1:8500")


@pytest.mark.parametrize(("address", "scheme", "expected"), [
    ("127.0.0.1:8501", None, "http"), ("127.0.0.1:8501", "https", "https"),
    ("https://127.0.0.1:8501", None, "https"), ("https://127.0.0.1:8501", "https", "https"),
    ("http://127.0.0.1:8500", "http", "http")])
def test_the_scheme_is_the_addresss_or_the_one_given(address, scheme, expected):
    """An https:// address is spoken to over https: read as plain http, the token would go out in cleartext."""
    io = ConsulIO(address, scheme=scheme)
    assert io.scheme == expected and io.client.http.base_uri == f"{expected}://127.0.0.1:{address[-4:]}"
    assert io.address == f"127.0.0.1:{address[-4:]}"


def test_an_address_that_contradicts_the_scheme_is_refused():
    with pytest.raises(ConsulUnavailable, match=r"'https://127.0.0.1:8501' says https but the scheme given is http"):
        ConsulIO("https://127.0.0.1:8501", scheme="http")
    with pytest.raises(ConsulUnavailable, match=r"'http://127.0.0.1:8500' says http but the scheme given is https"):
        ConsulIO("http://127.0.0.1:8500", scheme="https")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_refused_connection_is_one_consul_unavailable_line():
    io = ConsulIO(f"127.0.0.1:{free_port()}", token=TOKEN)
    with pytest.raises(ConsulUnavailable) as info:
        io.kv_read("clusterctl/eas/dc1/n1")
    message = str(info.value)
    assert message.startswith("GET kv/clusterctl/eas/dc1/n1: connection refused or no route to 127.0.0.1:")
    assert "\n" not in message and TOKEN not in message
    assert neterr.reason(info.value) == "connection refused"  # the cause stays chained for the CLI's one line


class _Slow(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's name)
        time.sleep(1.0)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Consul-Index", "1")
        self.end_headers()
        self.wfile.write(b"[]")

    def log_message(self, *args):
        pass


class _Garbage(_Slow):
    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Consul-Index", "1")
        self.end_headers()
        self.wfile.write(b'[{"Key": "k", "Value": "bm90IGpzb24=", "ModifyIndex": 1}]')  # base64 "not json"


@pytest.fixture
def serve():
    servers = []

    def start(handler) -> str:
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_address[1]}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_every_call_has_a_timeout(serve):
    io = ConsulIO(serve(_Slow), timeout_s=0.2)
    started = time.monotonic()
    with pytest.raises(ConsulUnavailable, match=r"GET health/state/any: no answer from 127\.0\.0\.1:\d+ within 0\.2s"):
        io.health_service()
    assert time.monotonic() - started < 0.9


def test_a_value_that_is_not_json_is_an_error_with_an_excerpt(serve):
    io = ConsulIO(serve(_Garbage))
    with pytest.raises(ConsulUnavailable, match=r"GET kv/k: the value is not JSON .*'not json'"):
        io.kv_get_json("k")


def test_the_environment_never_overrides_the_given_token_or_tls_verification(monkeypatch):
    """py-consul sets its default token from CONSUL_HTTP_TOKEN ahead of the constructor's and
    reads CONSUL_HTTP_SSL_VERIFY; ConsulIO passes its own token on every call and verify explicitly, so the
    operator's environment does not change which token preflight, the edge or the agent send."""
    from devconsul.server import DevConsulServer

    monkeypatch.setenv("CONSUL_HTTP_TOKEN", "the-operators-env-token")
    monkeypatch.setenv("CONSUL_HTTP_SSL_VERIFY", "false")
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token="the-configured-token") as server:
        io = ConsulIO(server.address, token="the-configured-token")
        assert io.kv_put("clusterctl/l9", "x") and io.kv_read("clusterctl/l9")[1] == "x"
        with pytest.raises(ConsulUnavailable):  # a token the server does not know is refused, env or not
            ConsulIO(server.address, token="not-this-one").kv_put("clusterctl/l9", "y")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)  # this machine's bundle would be the CA to verify with
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)  # (test_a_ca_bundle_in_the_environment_is_used_...)
    assert ConsulIO("127.0.0.1:8500", scheme="https").client.http.verify is True


class _Recording(_Slow):
    """Answers every GET with one KV entry and records the request line's target (an absolute URL when the
    client sent it through this server as a proxy)."""

    targets: list[str] = []

    def do_GET(self):  # noqa: N802
        self.targets.append(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("X-Consul-Index", "7")
        self.end_headers()
        self.wfile.write(b'[{"Key": "k", "Value": "eA==", "ModifyIndex": 7}]')  # base64 "x"


def _no_proxy_environment(monkeypatch):
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY", "no_proxy",
                 "NO_PROXY", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        monkeypatch.delenv(name, raising=False)


def test_the_environment_is_read_once_not_on_every_call(serve, monkeypatch):
    """requests read the proxy variables, ~/.netrc and the CA bundle variables on every call: a third of a call's
    CPU, several calls a second in the agent. Guards against: 3 calls, 3 reads of each."""
    import requests.sessions

    _no_proxy_environment(monkeypatch)
    io = ConsulIO(serve(_Recording))
    reads = []
    monkeypatch.setattr(requests.sessions, "get_environ_proxies", lambda *a, **k: reads.append("proxies") or {})
    monkeypatch.setattr(requests.sessions, "get_netrc_auth", lambda *a, **k: reads.append("netrc"))
    for _ in range(3):
        assert io.kv_read("k") == (7, "x")
    assert reads == []


@pytest.mark.parametrize("no_proxy, through_proxy", [("", True), ("127.0.0.1", False)])
def test_a_proxy_in_the_environment_still_carries_the_calls_unless_no_proxy_names_the_address(
    serve, monkeypatch, no_proxy, through_proxy
):
    _no_proxy_environment(monkeypatch)
    _Recording.targets = []
    proxy = serve(_Recording)
    monkeypatch.setenv("HTTP_PROXY", f"http://{proxy}")
    monkeypatch.setenv("NO_PROXY", no_proxy)
    consul = serve(_Recording)
    io = ConsulIO(consul)
    monkeypatch.delenv("HTTP_PROXY")  # read once, at construction: what the process started with
    assert io.kv_read("k") == (7, "x") and io.kv_read("k") == (7, "x")
    expected = f"http://{consul}/v1/kv/k" if through_proxy else "/v1/kv/k"
    assert _Recording.targets == [expected, expected]


def test_a_ca_bundle_in_the_environment_is_used_when_no_ca_file_is_given(monkeypatch, tmp_path):
    _no_proxy_environment(monkeypatch)
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tmp_path / "bundle.pem"))
    assert ConsulIO("127.0.0.1:8500", scheme="https").client.http.verify == str(tmp_path / "bundle.pem")
    assert ConsulIO("127.0.0.1:8500", scheme="https", ca_file="/etc/consul/ca.pem").client.http.verify == (
        "/etc/consul/ca.pem"
    )


def test_a_check_and_set_is_one_transaction_that_answers_the_next_index():
    """kv_cas_write: the index it answers is the entry's ModifyIndex (what the next check-and-set needs, so the
    publisher reads nothing after a write); a stale index is None and writes nothing; an ACL denial is raised
    with Consul's words. Runs against a real Consul too when CONSUL_HTTP_ADDR is set (no ACLs there)."""
    import os

    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token="the-token") as server:
        address, token = (os.environ["CONSUL_HTTP_ADDR"], os.environ.get("CONSUL_HTTP_TOKEN")) if os.environ.get(
            "CONSUL_HTTP_ADDR") else (server.address, "the-token")
        io = ConsulIO(address, token=token)
        key = f"clusterctl/test-cas/{time.time_ns()}"
        first = io.kv_cas_write(key, '{"seq": 1}', 0)
        assert first is not None and io.kv_read(key) == (first, '{"seq": 1}')
        assert io.kv_cas_write(key, '{"seq": 9}', 0) is None  # create-only, and it exists
        second = io.kv_cas_write(key, '{"seq": 2}', first)
        assert second is not None and second > first and io.kv_read(key) == (second, '{"seq": 2}')
        assert io.kv_cas_write(key, '{"seq": 9}', first) is None and io.kv_read(key)[1] == '{"seq": 2}'
        io.client.kv.delete(key, token=token)
        if address == server.address:
            with pytest.raises(ConsulUnavailable, match=r"PUT txn \(cas kv/k\): 403 ACL not found"):
                ConsulIO(server.address, token="not-this-one").kv_cas_write("k", "{}", 0)
            with pytest.raises(ConsulUnavailable, match=r"PUT txn \(cas kv/k\): refused: .*[Pp]ermission denied"):
                ConsulIO(server.address).kv_cas_write("k", "{}", 0)  # anonymous: no key write


class _TxnAnswer(_Slow):
    answer: tuple[int, bytes] = (200, b"")

    def do_PUT(self):  # noqa: N802
        code, body = self.answer
        self.send_response(code)
        self.end_headers()
        self.wfile.write(body)


@pytest.mark.parametrize("answer, message", [
    ((200, b"<html>oops</html>"), r": unexpected answer 200: '<html>oops</html>'"),
    ((200, b'{"Results": null, "Errors": null}'), r": unexpected answer 200: '\{\"Results\": null"),
    ((409, b'{"Results": null, "Errors": "stale"}'), r": unexpected answer 409"),
    ((503, b"rate limit exceeded"), r": 503 rate limit exceeded"),
])
def test_a_check_and_set_answer_that_is_not_consul_s_is_an_error_with_an_excerpt(serve, monkeypatch, answer, message):
    monkeypatch.setattr(_TxnAnswer, "answer", answer)
    with pytest.raises(ConsulUnavailable, match=r"PUT txn \(cas kv/k\)" + message):
        ConsulIO(serve(_TxnAnswer)).kv_cas_write("k", "{}", 0)
