"""Client keys at the edge, the admin listener, the IUs' own key and TLS, end to end on loopback."""

from __future__ import annotations

import datetime
import ipaddress
import json
import logging
import socket
import ssl
import time
import urllib.error
import urllib.request

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge.access_config import AccessConfig
from edge.auth import hash_key, new_key
from tests.helpers.edge import MODEL, Pool, metric, post, running_edge, scripted_pool

pytestmark = pytest.mark.integration

UNIT_KEY = "unit-key-0123456789abcdef"


def completion() -> dict:
    return {"model": MODEL, "prompt": "hello " * 10, "max_tokens": 1}


def keys_file(tmp_path, *tenants: str) -> tuple[str, dict[str, str]]:
    keys = {tenant: new_key() for tenant in tenants}
    path = tmp_path / "api-keys"
    path.write_text("# tenant sha256:<hex>\n" + "".join(f"{t} {hash_key(k)}\n" for t, k in keys.items()))
    path.chmod(0o600)
    return str(path), keys


def secret_file(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text + "\n")
    path.chmod(0o600)
    return str(path)


def access(tmp_path, **fields) -> AccessConfig:
    return AccessConfig(admin_listen="127.0.0.1:0", **fields)


def picks(edge) -> float:
    """Routing decisions the edge made (each routed request is one, and only routed ones are announced)."""
    with urllib.request.urlopen(edge.admin_url("/metrics"), timeout=5) as answer:
        lines = answer.read().decode().splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith("eas_edge_picks_total{"))


def bearer(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def recording_iu(seen_headers: list):
    async def handler(request):
        seen_headers.append(dict(request.headers))
        return web.json_response({"id": "c", "object": "text_completion", "choices": [{"text": "x"}]})
    return handler


def test_without_a_valid_key_the_answer_is_401_and_nothing_reaches_an_iu(consul_addr, tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    path, keys = keys_file(tmp_path, "team-a", "team-b")
    seen: list = []
    with scripted_pool(consul_addr, ("n9-iu0", recording_iu(seen))) as (pool, _ius), \
            running_edge(pool, access=access(tmp_path, keys_file=path)) as edge:
        url, refused = edge.url("/v1/completions"), {}
        for headers, reason in (({}, "missing"), ({"Authorization": "Basic abc"}, "malformed"),
                                (bearer("sk-eas-not-a-key"), "unknown"), (bearer(keys["team-a"] + "x"), "unknown")):
            status, answer_headers, body = post(url, completion(), headers=headers)
            error = json.loads(body)["error"]
            assert status == 401 and error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
            assert answer_headers["WWW-Authenticate"] == "Bearer"
            refused[reason] = refused.get(reason, 0) + 1
            assert metric(edge, "eas_edge_auth_failures_total", f'reason="{reason}"') == refused[reason]
        assert seen == [] and refused == {"missing": 1, "malformed": 1, "unknown": 2}
        assert picks(edge) == 0  # nothing routed (so nothing announced)
        for tenant in ("team-a", "team-b", "team-a"):
            status, _, _ = post(url, completion(), headers=bearer(keys[tenant]))
            assert status == 200
        assert len(seen) == 3 and picks(edge) == 3
        assert metric(edge, "eas_edge_tenant_requests_total", 'code="200",tenant="team-a"') == 2
        assert metric(edge, "eas_edge_tenant_requests_total", 'code="200",tenant="team-b"') == 1
        # /healthz stays open for load balancers
        with urllib.request.urlopen(edge.url("/healthz"), timeout=5) as answer:
            assert answer.status == 200
    assert not any(key in caplog.text for key in keys.values())  # keys are never logged


def test_the_401_comes_before_the_body_is_read(consul_addr, tmp_path):
    """A client without a key cannot make the edge wait for (or buffer) a body it announced."""
    path, _keys = keys_file(tmp_path, "team-a")
    with scripted_pool(consul_addr, ("n9-iu0", recording_iu([]))) as (pool, _ius), \
            running_edge(pool, access=access(tmp_path, keys_file=path)) as edge:
        host, port = edge.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 4000000\r\n\r\n")  # the body never comes
            started = time.monotonic()
            head = sock.recv(4096)
        assert head.startswith(b"HTTP/1.1 401 ") and time.monotonic() - started < 2


def test_metrics_are_on_the_admin_listener_only(consul_addr, tmp_path):
    path, keys = keys_file(tmp_path, "team-a")
    with scripted_pool(consul_addr, ("n9-iu0", recording_iu([]))) as (pool, _ius), \
            running_edge(pool, access=access(tmp_path, keys_file=path)) as edge:
        for headers in ({}, bearer(keys["team-a"])):
            request = urllib.request.Request(edge.url("/metrics"), headers=headers)
            with pytest.raises(urllib.error.HTTPError) as info:
                urllib.request.urlopen(request, timeout=5)
            assert info.value.code == 404
        with urllib.request.urlopen(edge.admin_url("/metrics"), timeout=5) as answer:
            assert "eas_edge_requests_total" in answer.read().decode()
        assert edge.edge.admin_address != edge.address


def test_the_edge_sends_the_units_key_and_never_the_clients(consul_addr, tmp_path):
    path, keys = keys_file(tmp_path, "team-a")
    seen: list = []
    unit_key = secret_file(tmp_path, "iu-api-key", UNIT_KEY)
    with scripted_pool(consul_addr, ("n9-iu0", recording_iu(seen))) as (pool, _ius), \
            running_edge(pool, access=access(tmp_path, keys_file=path, upstream_api_key_file=unit_key)) as edge:
        assert post(edge.url("/v1/completions"), completion(), headers=bearer(keys["team-a"]))[0] == 200
    assert seen[0]["Authorization"] == f"Bearer {UNIT_KEY}"
    assert keys["team-a"] not in json.dumps(seen)


def test_units_that_require_a_key_refuse_requests_around_the_edge_and_serve_through_it(consul_addr, tmp_path):
    """The simulated vLLM enforces its key as vLLM does; the edge holds the key, a client going around it not."""
    unit_key = secret_file(tmp_path, "iu-api-key", UNIT_KEY)
    pool = Pool(consul_addr, nodes=1, ius_per_node=1, agents=False, iu_api_key=UNIT_KEY)
    try:
        direct = next(iter(pool.ius.values())).address
        status, _, body = post(f"http://{direct}/v1/completions", completion())
        assert status == 401 and json.loads(body) == {"error": "Unauthorized"}
        with running_edge(pool, access=access(tmp_path, auth_none=True, upstream_api_key_file=unit_key)) as edge:
            assert post(edge.url("/v1/completions"), completion())[0] == 200
            with urllib.request.urlopen(edge.url("/v1/models"), timeout=10) as answer:
                assert json.load(answer)["data"][0]["id"] == MODEL
        with running_edge(pool, access=access(tmp_path, auth_none=True)) as keyless:
            status, _, body = post(keyless.url("/v1/completions"), completion())
            assert status == 401 and json.loads(body)["error"]["type"] == "authentication_error"
    finally:
        pool.stop()


def self_signed(tmp_path) -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edge.test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("edge.test"),
                                                         x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "edge.crt", tmp_path / "edge.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    return str(cert_path), str(key_path)


def test_the_edge_serves_clients_over_tls_with_the_configured_certificate(consul_addr, tmp_path):
    path, keys = keys_file(tmp_path, "team-a")
    cert, key = self_signed(tmp_path)
    with scripted_pool(consul_addr, ("n9-iu0", recording_iu([]))) as (pool, _ius), \
            running_edge(pool, access=access(tmp_path, keys_file=path, tls_cert_file=cert, tls_key_file=key)) as edge:
        assert edge.url("/v1/completions").startswith("https://")
        trusting = ssl.create_default_context(cafile=cert)
        status, _, _ = post(edge.url("/v1/completions"), completion(), headers=bearer(keys["team-a"]),
                            context=trusting)
        assert status == 200
        with pytest.raises(urllib.error.URLError) as info:  # a client that does not trust it refuses
            post(edge.url("/v1/completions"), completion(), headers=bearer(keys["team-a"]),
                 context=ssl.create_default_context())
        assert isinstance(info.value.reason, ssl.SSLCertVerificationError)
        host, port = edge.address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:  # plain HTTP gets no answer
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: edge\r\n\r\n")
            assert not sock.recv(4096).startswith(b"HTTP/1.1 200")
