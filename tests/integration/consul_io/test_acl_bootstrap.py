"""clusterctl.infra.consul_acl bootstraps the cluster's ACLs with the vault's management token through Consul's
HTTP API (``PUT /v1/acl/bootstrap``), so no Consul server's configuration holds that token: once, by whichever
node's run comes first, and then never again; a cluster bootstrapped with another token is an error that
says so. Runs against dev servers with ACLs on and not bootstrapped; the one check a bootstrapped real Consul
allows (its management token in ``CONSUL_HTTP_TOKEN``: nothing to bootstrap) runs there when
``CONSUL_HTTP_ADDR`` is set."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from tests.helpers.devconsul import REAL_CONSUL, Api
from tests.integration.consul_io.test_acl import _filters, _module

pytestmark = pytest.mark.integration

MANAGEMENT = "0c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e6f"


@pytest.fixture
def fresh():
    """A dev server with ACLs on (default deny) and not bootstrapped, as a new cluster without
    ``initial_management`` starts."""
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.75.4:0", acl_enabled=True, node_name="n1") as server:
        yield f"http://{server.address}"


def _node_acl(node: str) -> dict:
    return _filters()["consul_node_acl"](node, "dc1", {kind: str(uuid.uuid4()) for kind in (
        "agent", "registration", "operator", "eas_agent", "edge")})


def test_the_first_run_bootstraps_with_the_vault_token_and_later_runs_change_nothing(fresh):
    ensure, acl = _module("consul_acl").ensure, _node_acl("n1")
    created, _ = ensure(fresh, MANAGEMENT, acl["policies"], acl["tokens"], check=True)
    assert "ACL bootstrap" in created
    assert Api(fresh.removeprefix("http://"), MANAGEMENT).get("/v1/acl/token/self").status_code == 403  # check mode
    created, updated = ensure(fresh, MANAGEMENT, acl["policies"], acl["tokens"], check=False)
    assert created[0] == "ACL bootstrap" and "policy clusterctl-operator" in created and updated == []
    me = Api(fresh.removeprefix("http://"), MANAGEMENT).get("/v1/acl/token/self").json()
    assert [p["Name"] for p in me["Policies"]] == ["global-management"]
    assert ensure(fresh, MANAGEMENT, acl["policies"], acl["tokens"], check=False) == ([], [])


def test_nodes_running_at_once_bootstrap_once_and_all_succeed(fresh):
    """A batch runs its nodes in parallel forks: every one may find the cluster unbootstrapped; one
    bootstraps, the others are refused and find the token working."""
    ensure, results, errors = _module("consul_acl").ensure, [], []

    def run(node: str) -> None:
        acl = _node_acl(node)
        try:
            results.append(ensure(fresh, MANAGEMENT, acl["policies"], acl["tokens"], check=False))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(f"n{k}",)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors and len(results) == 4
    assert sum("ACL bootstrap" in created for created, _ in results) == 1


def test_a_cluster_bootstrapped_with_another_token_is_an_error_naming_the_variable(fresh):
    module = _module("consul_acl")
    other = str(uuid.uuid4())
    assert Api(fresh.removeprefix("http://")).put("/v1/acl/bootstrap", json={"BootstrapSecret": other}).status_code == 200
    with pytest.raises(module.ConsulError, match=r"bootstrapped with another management token than "
                                                 r"consul_agent_acl_management_token \(Consul: Permission denied: "
                                                 r"ACL bootstrap no longer allowed"):
        module.ensure(fresh, MANAGEMENT, [], [], check=False)


@pytest.mark.skipif(not (REAL_CONSUL and os.environ.get("CONSUL_HTTP_TOKEN")),
                    reason="a real Consul with ACLs on and its management token in CONSUL_HTTP_TOKEN")
def test_a_real_consul_bootstrapped_with_the_token_needs_nothing(consul_addr):
    module = _module("consul_acl")
    url = consul_addr if "://" in consul_addr else f"http://{consul_addr}"
    assert module.bootstrap(url, os.environ["CONSUL_HTTP_TOKEN"], check=False, timeout=10) is False
