"""One node's Consul tokens cannot register, replace, deregister or check another node's IUs, nor produce an
entry the edge routes for it (GPU nodes run third-party model code: any node's tokens may be an attacker's).

The tokens and policies are the role's (the ``consul_node_acl`` filter, ``clusterctl.infra.consul_acl``'s
``ensure``); the IU instances are the role's (``cluster.services.iu_registration``). Runs against a dev server
with ACLs on (default deny), or against the real Consul named by ``CONSUL_HTTP_ADDR`` when
``CONSUL_HTTP_TOKEN`` holds a management token there (node, policy and token names unique to the run, every
one removed afterwards)."""

from __future__ import annotations

import os
import uuid
from collections import Counter

import pytest

from cluster.services import iu_registration
from consul_io.client import ConsulIO
from edge.feed import EdgeView
from tests.helpers.devconsul import Api
from tests.integration.consul_io.test_acl import MANAGEMENT, _filters, _module

pytestmark = pytest.mark.integration

ATTACKER = "127.0.71.66"  # where the compromised node would send another node's traffic


@pytest.fixture
def consul():
    """(address, management token, node name prefix); everything the test created is removed afterwards."""
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        token = os.environ.get("CONSUL_HTTP_TOKEN")
        if not token:
            pytest.skip("a real Consul needs a management token in CONSUL_HTTP_TOKEN for this test")
        yield real.removeprefix("http://"), token, f"t{uuid.uuid4().hex[:8]}"
        return
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.71.1:0", acl_token=MANAGEMENT, node_name="devconsul-sec") as server:
        yield server.address, MANAGEMENT, "n"


@pytest.fixture
def cluster(consul):
    """Nodes A and B with their own tokens as the role makes them, registered as their agents register them,
    and A's IU registered with A's registration token. Yields (address, {node: tokens}, edge token)."""
    address, management, prefix = consul
    admin = Api(address, management)
    ensure = _module("consul_acl").ensure
    edge = str(uuid.uuid4())
    nodes = {f"{prefix}a": "127.0.71.11", f"{prefix}b": "127.0.71.12"}
    tokens, created = {}, []
    for node in nodes:
        tokens[node] = {kind: str(uuid.uuid4()) for kind in ("agent", "registration", "eas_agent")}
        acl = _filters()["consul_node_acl"](node, "dc1", {**tokens[node], "edge": edge})
        created += ensure(f"http://{address}", management, acl["policies"], acl["tokens"], check=False)[0]
    try:
        for node, node_address in nodes.items():
            answer = Api(address, tokens[node]["agent"]).put("/v1/catalog/register", json={
                "Node": node, "Address": node_address})
            assert answer.status_code == 200, answer.text
        a = next(iter(nodes))
        answer = Api(address, tokens[a]["registration"]).put("/v1/catalog/register", json=_on(a, nodes[a], _iu(a, 0)))
        assert answer.status_code == 200, answer.text  # its own job
        yield address, nodes, tokens, edge
    finally:
        for node in nodes:
            admin.put("/v1/catalog/deregister", json={"Node": node})
        secrets = [s for node_tokens in tokens.values() for s in node_tokens.values()] + [edge]
        for secret in secrets:
            accessor = Api(address, secret).get("/v1/acl/token/self")
            if accessor.status_code == 200 and f"token {accessor.json().get('Description')}" in created:
                admin.delete(f"/v1/acl/token/{accessor.json()['AccessorID']}")
        for made in created:
            if made.startswith("policy "):
                policy = admin.get(f"/v1/acl/policy/name/{made.removeprefix('policy ')}")
                if policy.status_code == 200:
                    admin.delete(f"/v1/acl/policy/{policy.json()['ID']}")


def _iu(node: str, index: int, address: str = "", service_of: str | None = None) -> dict:
    """IU ``<node>-iu<index>`` as the role registers it, at ``address``, as an instance of ``service_of``'s
    service (default: its own node's)."""
    own = iu_registration(f"{node}-iu{index}", node, "r1", address or "127.0.71.11", 8000 + index, [index], None)
    name = iu_registration("x-iu0", service_of or node, "r1", "127.0.71.11", 8000, [0], None)["name"]
    return {"Service": name, "ID": own["id"], "Address": own["address"], "Port": own["port"],
            "Tags": own["tags"], "Meta": own["meta"]}


def _on(node: str, node_address: str, service: dict) -> dict:
    """A ``catalog/register`` body placing ``service`` on catalog node ``node``, the node's entry unchanged."""
    return {"Node": node, "Address": node_address, "SkipNodeUpdate": True, "Service": service}


def test_another_nodes_tokens_cannot_register_replace_check_or_remove_this_nodes_ius(cluster):
    """The steering reproduction, inverted: node B's tokens try to take node A's IU (its ID at B's chosen
    address, on A's catalog node and on B's), add an IU to A, put a check on A's IU, or remove it."""
    address, nodes, tokens, _ = cluster
    a, b = nodes
    attacks = {
        "A's IU id at the attacker's address, on A": _on(a, nodes[a], _iu(a, 0, ATTACKER)),
        "A's IU id at the attacker's address, on B": _on(b, nodes[b], _iu(a, 0, ATTACKER)),
        "a new IU of A's, on A": _on(a, nodes[a], _iu(a, 7, ATTACKER)),
        "A's IU id, replaced by an instance of B's service": _on(a, nodes[a], _iu(a, 0, ATTACKER, service_of=b)),
        "a passing check on A's IU": {"Node": a, "Address": nodes[a], "SkipNodeUpdate": True, "Check": {
            "CheckID": f"{a}-iu0:forged", "Name": "forged", "Status": "passing", "ServiceID": f"{a}-iu0"}},
    }
    for kind, secret in tokens[b].items():
        api = Api(address, secret)
        for attack, body in attacks.items():
            answer = api.put("/v1/catalog/register", json=body)
            assert answer.status_code == 403, (kind, attack, answer.status_code, answer.text)
        removed = api.put("/v1/catalog/deregister", json={"Node": a, "ServiceID": f"{a}-iu0"})
        assert removed.status_code == 403, (kind, removed.text)
    listed = Api(address, tokens[a]["agent"]).get(f"/v1/catalog/node/{a}").json()["Services"]
    assert {(s["ID"], s["Service"], s["Address"]) for s in listed.values()} == {
        (f"{a}-iu0", _iu(a, 0)["Service"], "127.0.71.11")}


def test_what_consul_lets_another_node_write_is_never_routed(cluster):
    """Consul lets B's registration token place an instance of B's own service on A's catalog node (only the
    node's entry needs node:write): an ID of A's, A's meta and tags, the attacker's address. The edge, reading
    with its own token, routes A's IU to A's registration only, follows A's agent at A's address, and counts
    the impostor."""
    address, nodes, tokens, edge = cluster
    a, b = nodes
    impostor = _on(a, nodes[a], _iu(a, 3, ATTACKER, service_of=b))
    assert Api(address, tokens[b]["registration"]).put("/v1/catalog/register", json=impostor).status_code == 200
    _, listing = ConsulIO(address, token=edge).health_service()
    ours = [e for e in listing if e["Node"]["Node"] in nodes]
    assert sorted((e["Node"]["Node"], e["Service"]["ID"], e["Service"]["Address"]) for e in ours) == [
        (a, f"{a}-iu0", "127.0.71.11"), (a, f"{a}-iu3", ATTACKER)]
    view = EdgeView()
    view.apply_health(ours)
    assert [(e.node, e.iu_id, e.address) for e in view.snapshot().healthy] == [(a, f"{a}-iu0", "127.0.71.11")]
    assert view.node_addresses() == {a: "127.0.71.11"}
    assert view.rejected_registrations == Counter(service_not_of_node=1)
