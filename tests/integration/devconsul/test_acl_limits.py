"""Where the ACL system (policies, tokens, per-entry filtering) meets the hardening limits: the decision is
made from the headers before the body is read, whatever the token; ``?filter`` applies after the ACL
filter; the read cache is keyed by the token. Dev server only (it opens raw sockets and reads the cache)."""

from __future__ import annotations

import uuid

import pytest
import requests

from devconsul.httpapi import ReadCache, Request
from devconsul.server import DevConsulServer
from tests.helpers.devconsul import Api, eventually, raw

pytestmark = pytest.mark.integration

MANAGEMENT = "5b0c7f0e-3a55-4f7e-8d41-0c6f3a1e9b2e"


@pytest.fixture
def api():
    with DevConsulServer(addr="127.0.0.1:0", node_name="n1", acl_token=MANAGEMENT) as server:
        yield Api(server.address, MANAGEMENT)


def _token(api: Api, rules: str) -> tuple[str, str]:
    name = f"t-{uuid.uuid4().hex[:10]}"
    assert api.put("/v1/acl/policy", json={"Name": name, "Rules": rules}).status_code == 200
    token = api.put("/v1/acl/token", json={"Policies": [{"Name": name}]}).json()
    return token["AccessorID"], token["SecretID"]


def test_a_token_without_write_is_refused_before_the_body(api):
    _, reader = _token(api, 'key_prefix "" { policy = "read" }')
    head = (f"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nX-Consul-Token: {reader}\r\n"
            "Content-Length: 12582912\r\n\r\n").encode()
    status, data, took = raw(api.base.removeprefix("http://"), head, timeout=3)
    assert status == 403 and took < 1.0 and b"Connection: close" in data


def test_anonymous_service_registration_is_refused_before_the_body(api):
    head = b"PUT /v1/agent/service/register HTTP/1.1\r\nHost: x\r\nContent-Length: 12582912\r\n\r\n"
    status, data, took = raw(api.base.removeprefix("http://"), head, timeout=3)
    assert status == 403 and took < 1.0 and b"Connection: close" in data


def test_registration_is_still_decided_on_the_service_named_in_the_body(api):
    _, web = _token(api, 'service "web" { policy = "write" }')
    ok = api.put("/v1/agent/service/register", json={"Name": "web", "ID": "web1"}, token=web)
    assert ok.status_code == 200, ok.text
    refused = api.put("/v1/agent/service/register", json={"Name": "db", "ID": "db1"}, token=web)
    assert refused.status_code == 403 and "'service:write' on \"db\"" in refused.text


def test_filter_applies_after_the_acl_filter_on_health_and_catalog(api):
    for i in (1, 2):
        body = {"Name": "web", "ID": f"web{i}", "Tags": [f"t{i}"], "Check": {"TTL": "30s", "Status": "passing"}}
        assert api.put("/v1/agent/service/register", json=body).status_code == 200
    _, reader = _token(api, 'node_prefix "" { policy = "read" }\nservice "web" { policy = "read" }')
    _, blind = _token(api, 'node_prefix "" { policy = "read" }')
    for path, selector in (("/v1/health/service/web", "Service.ID"), ("/v1/catalog/service/web", "ServiceID")):
        def ids(resp):
            return [e["Service"]["ID"] if "Service" in e else e["ServiceID"] for e in resp.json()]

        assert eventually(lambda p=path: ids(api.get(p, token=reader)), lambda v: len(v) == 2) == ["web1", "web2"]
        resp = api.get(path, params={"filter": f'{selector} == "web2"'}, token=reader)
        assert ids(resp) == ["web2"] and "X-Consul-Results-Filtered-By-ACLs" not in resp.headers
        resp = api.get(path, params={"filter": f'{selector} == "web2"'}, token=blind)
        assert resp.json() == [] and resp.headers.get("X-Consul-Results-Filtered-By-ACLs") == "true"
        assert api.get(path, params={"filter": "Nope == 1"}, token=reader).status_code == 400


def test_default_acl_policy_header_is_the_configured_policy(api):
    assert requests.get(f"{api.base}/v1/status/leader", timeout=5).headers[
        "X-Consul-Default-Acl-Policy"] == "deny"
    with DevConsulServer(addr="127.0.0.1:0") as open_server:
        assert requests.get(f"http://{open_server.address}/v1/status/leader", timeout=5).headers[
            "X-Consul-Default-Acl-Policy"] == "allow"


def test_read_cache_key_is_the_token_and_the_keyed_parameters_only():
    class Authz:
        def __init__(self, accessor):
            self.accessor = accessor

    def key(target, accessor):
        req = Request.parse("GET", target, {}, b"")
        req.authz = Authz(accessor)
        return ReadCache().key(req)

    assert key("/v1/kv/a?recurse&junk=1&index=5", "a1") == key("/v1/kv/a?recurse&junk=2", "a1")
    assert key("/v1/kv/a?recurse", "a1") != key("/v1/kv/a?recurse", "a2")
    assert key("/v1/kv/a?recurse", "a1") != key("/v1/kv/a?keys", "a1")
    assert dict(key("/v1/health/service/web?filter=x&token=s&wait=1s", "a1")[1]) == {"filter": ("x",)}


def test_acl_is_decided_before_the_body_is_read(dev_acl):
    """No token and a 12 MiB Content-Length, body never sent: answered 403 at once (not: after the body)."""
    head = b"PUT /v1/kv/k HTTP/1.1\r\nHost: x\r\nContent-Length: 12582912\r\n\r\n"
    status, data, took = raw(dev_acl.address, head, timeout=3)
    assert status == 403 and took < 1.0 and b"Connection: close" in data
