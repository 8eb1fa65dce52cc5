"""ACL policies, tokens and enforcement: https://developer.hashicorp.com/consul/api-docs/acl/policies,
.../acl/tokens, https://developer.hashicorp.com/consul/docs/secure/acl/rule (rule reference) and each API
page's "ACL Required" column.

Runs against a dev server with ACLs on (default_policy = deny), or against a real Consul when
``CONSUL_HTTP_ADDR`` and a management ``CONSUL_HTTP_TOKEN`` are set (its ACLs must be on with deny).
"""

from __future__ import annotations

import os
import uuid

import pytest

from tests.helpers.devconsul import Api, eventually

pytestmark = pytest.mark.integration

MANAGEMENT = "5b0c7f0e-3a55-4f7e-8d41-0c6f3a1e9b2d"


@pytest.fixture
def acl_api(dev_server_or_real):
    return dev_server_or_real


@pytest.fixture
def dev_server_or_real(tmp_path):
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        token = os.environ.get("CONSUL_HTTP_TOKEN")
        api = Api(real.removeprefix("http://"), token)
        if not token or api.get("/v1/acl/token/self").status_code != 200:
            pytest.skip("the real Consul needs ACLs on and a management CONSUL_HTTP_TOKEN")
        yield api
        return
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0", acl_token=MANAGEMENT) as server:
        yield Api(server.address, MANAGEMENT)


def _token(api: Api, rules: str) -> tuple[str, str]:
    """A new policy with ``rules`` and a token linked to it: (AccessorID, SecretID)."""
    name = f"contract-{uuid.uuid4().hex[:10]}"
    resp = api.put("/v1/acl/policy", json={"Name": name, "Rules": rules})
    assert resp.status_code == 200, resp.text
    policy = resp.json()
    assert policy["Name"] == name and policy["Rules"] == rules and policy["ID"]
    resp = api.put("/v1/acl/token", json={"Description": name, "Policies": [{"Name": name}]})
    assert resp.status_code == 200, resp.text
    token = resp.json()
    assert token["Policies"] == [{"ID": policy["ID"], "Name": name}]
    return token["AccessorID"], token["SecretID"]


def test_token_self_reads_its_own_token(acl_api):
    """Read Self Token: no acl rule is needed to read the token a request carries."""
    accessor, secret = _token(acl_api, 'key_prefix "x/" { policy = "read" }')
    resp = acl_api.get("/v1/acl/token/self", token=secret)
    assert resp.status_code == 200 and resp.json()["AccessorID"] == accessor


def test_unknown_token_is_acl_not_found(acl_api):
    resp = acl_api.get("/v1/kv/anything", token=str(uuid.uuid4()))
    assert resp.status_code == 403 and "ACL not found" in resp.text


def test_denial_names_accessor_permission_and_resource(acl_api, name):
    """The 403 text: Permission denied: token with AccessorID '<id>' lacks permission 'key:write' on "<key>"."""
    accessor, secret = _token(acl_api, f'key_prefix "{name}/" {{ policy = "read" }}')
    resp = acl_api.put(f"/v1/kv/{name}/a", data=b"v", token=secret)
    assert resp.status_code == 403
    assert resp.text == (f"Permission denied: token with AccessorID '{accessor}' lacks permission 'key:write' "
                         f"on \"{name}/a\"")


def test_longest_prefix_wins_and_exact_beats_prefix(acl_api, name):
    """Rule reference: "the most specific prefix match determines the action"; exact rules apply to one key."""
    rules = (f'key_prefix "{name}/" {{ policy = "write" }}\n'
             f'key_prefix "{name}/ro/" {{ policy = "read" }}\n'
             f'key "{name}/ro/open" {{ policy = "write" }}\n'
             f'key_prefix "{name}/ro/secret" {{ policy = "deny" }}\n')
    _, secret = _token(acl_api, rules)
    assert acl_api.put(f"/v1/kv/{name}/w", data=b"1", token=secret).status_code == 200
    assert acl_api.put(f"/v1/kv/{name}/ro/x", data=b"1", token=secret).status_code == 403
    assert acl_api.put(f"/v1/kv/{name}/ro/open", data=b"1", token=secret).status_code == 200
    assert acl_api.put(f"/v1/kv/{name}/ro/x", data=b"1").status_code == 200  # management
    assert acl_api.put(f"/v1/kv/{name}/ro/secret1", data=b"1").status_code == 200
    assert acl_api.get(f"/v1/kv/{name}/ro/x", token=secret).status_code == 200
    assert acl_api.get(f"/v1/kv/{name}/ro/secret1", token=secret).status_code == 403
    acl_api.delete(f"/v1/kv/{name}", params={"recurse": ""})


def test_deny_wins_over_write_across_policies(acl_api, name):
    """Rules of several policies on one segment: "DENY has priority over WRITE or READ"."""
    a = f"contract-{uuid.uuid4().hex[:10]}"
    b = f"contract-{uuid.uuid4().hex[:10]}"
    acl_api.put("/v1/acl/policy", json={"Name": a, "Rules": f'key_prefix "{name}/" {{ policy = "write" }}'})
    acl_api.put("/v1/acl/policy", json={"Name": b, "Rules": f'key_prefix "{name}/" {{ policy = "deny" }}'})
    secret = acl_api.put("/v1/acl/token", json={"Policies": [{"Name": a}, {"Name": b}]}).json()["SecretID"]
    assert acl_api.put(f"/v1/kv/{name}/k", data=b"1", token=secret).status_code == 403


def test_recurse_is_filtered_per_key(acl_api, name):
    """KV list with ?recurse drops the keys the token may not read (X-Consul-Results-Filtered-By-ACLs)."""
    for key in ("pub/a", "priv/b"):
        assert acl_api.put(f"/v1/kv/{name}/{key}", data=b"1").status_code == 200
    _, secret = _token(acl_api, f'key_prefix "{name}/pub/" {{ policy = "read" }}')
    resp = acl_api.get(f"/v1/kv/{name}/", params={"recurse": ""}, token=secret)
    assert resp.status_code == 200 and [e["Key"] for e in resp.json()] == [f"{name}/pub/a"]
    assert resp.headers.get("X-Consul-Results-Filtered-By-ACLs") == "true"
    acl_api.delete(f"/v1/kv/{name}", params={"recurse": ""})


def test_maintenance_needs_service_write_not_node_write(acl_api, name):
    """Enable Maintenance Mode (agent/service): ACL Required service:write. A node-agent token
    (node:write, service:read) is refused; a token with service:write on the service's name may."""
    assert acl_api.put("/v1/agent/service/register", json={"Name": name, "ID": f"{name}-1"}).status_code == 200
    try:
        _, agent = _token(acl_api, 'node_prefix "" { policy = "write" }\nservice_prefix "" { policy = "read" }')
        _, operator = _token(acl_api, f'service "{name}" {{ policy = "write" }}')
        path = f"/v1/agent/service/maintenance/{name}-1"
        denied = acl_api.put(path, params={"enable": "true"}, token=agent)
        assert denied.status_code == 403 and f"lacks permission 'service:write' on \"{name}\"" in denied.text
        assert acl_api.put(path, params={"enable": "true"}, token=operator).status_code == 200
        checks = acl_api.get("/v1/agent/checks").json()
        assert f"_service_maintenance:{name}-1" in checks
    finally:
        acl_api.put(f"/v1/agent/service/deregister/{name}-1")


def test_health_reads_are_filtered_by_service_read(acl_api, name):
    """health/service: ACL Required node:read,service:read; without service:read the instance is hidden."""
    body = {"Name": name, "ID": f"{name}-1", "Check": {"TTL": "30s", "Status": "passing"}}
    assert acl_api.put("/v1/agent/service/register", json=body).status_code == 200
    try:
        _, reader = _token(acl_api, 'node_prefix "" { policy = "read" }\nservice_prefix "" { policy = "read" }')
        _, blind = _token(acl_api, 'node_prefix "" { policy = "read" }')
        seen = eventually(lambda: acl_api.get(f"/v1/health/service/{name}", token=reader).json(), bool)
        assert [e["Service"]["ID"] for e in seen] == [f"{name}-1"]
        resp = acl_api.get(f"/v1/health/service/{name}", token=blind)
        assert resp.json() == [] and resp.headers.get("X-Consul-Results-Filtered-By-ACLs") == "true"
    finally:
        acl_api.put(f"/v1/agent/service/deregister/{name}-1")


def test_policy_rules_that_do_not_parse_are_400(acl_api):
    resp = acl_api.put("/v1/acl/policy", json={"Name": f"contract-{uuid.uuid4().hex[:8]}",
                                                "Rules": 'key_prefix "" { policy = "sometimes" }'})
    assert resp.status_code == 400 and "Failed to parse ACL rules" in resp.text


def test_duplicate_policy_name_is_400(acl_api):
    name = f"contract-{uuid.uuid4().hex[:10]}"
    assert acl_api.put("/v1/acl/policy", json={"Name": name, "Rules": ""}).status_code == 200
    resp = acl_api.put("/v1/acl/policy", json={"Name": name, "Rules": ""})
    assert resp.status_code == 400 and "already exists" in resp.text


def test_acl_endpoints_need_acl_write(acl_api):
    _, secret = _token(acl_api, 'key_prefix "" { policy = "write" }')
    resp = acl_api.put("/v1/acl/policy", json={"Name": f"contract-{uuid.uuid4().hex[:8]}"}, token=secret)
    assert resp.status_code == 403 and "lacks permission 'acl:write'" in resp.text
