"""Health, catalog and status reads: https://developer.hashicorp.com/consul/api-docs/health,
https://developer.hashicorp.com/consul/api-docs/catalog, https://developer.hashicorp.com/consul/api-docs/status."""

from __future__ import annotations

import consul
import pytest

from tests.helpers.devconsul import Api, eventually

pytestmark = pytest.mark.integration


def _register(c, name: str, sid: str, status: str, tags: list[str] | None = None) -> None:
    c.agent.service.register(name, service_id=sid, tags=tags or [], port=8000,
                             check={"TTL": "30s", "Status": status})


def _ids(entries) -> list[str]:
    return sorted(e["Service"]["ID"] for e in entries)


def test_health_service_entry_shape(c, api, name, cleanup):
    """List Service Instances: each entry has Node, Service and Checks (node checks such as serfHealth
    included); the read carries X-Consul-Index."""
    cleanup.services.append(f"{name}-0")
    _register(c, name, f"{name}-0", "passing")
    resp = eventually(lambda: api.get(f"/v1/health/service/{name}"), lambda r: r.json() != [])
    assert resp.status_code == 200 and int(resp.headers["X-Consul-Index"]) > 0
    [entry] = resp.json()
    assert entry["Service"]["ID"] == f"{name}-0" and entry["Service"]["Port"] == 8000
    assert entry["Node"]["Node"] and entry["Node"]["Address"]
    check_ids = [ch["CheckID"] for ch in entry["Checks"]]
    assert "serfHealth" in check_ids and f"service:{name}-0" in check_ids


def test_passing_filters_warning_and_critical(c, name, cleanup):
    """?passing: "Specifies that the server should return only nodes with all checks in the passing
    state" -- so an instance with a warning check is filtered out too."""
    sids = [f"{name}-{s}" for s in ("ok", "warn", "crit")]
    cleanup.services += sids
    for sid, status in zip(sids, ("passing", "warning", "critical"), strict=True):
        _register(c, name, sid, status)
    assert eventually(lambda: _ids(c.health.service(name)[1]), lambda ids: ids == sorted(sids)) == sorted(sids)
    assert _ids(c.health.service(name, passing=True)[1]) == [f"{name}-ok"]


def test_repeated_tag_must_all_match(c, name, cleanup):
    """?tag may repeat; an instance must carry every given tag."""
    sids = [f"{name}-a", f"{name}-b"]
    cleanup.services += sids
    _register(c, name, sids[0], "passing", ["gpu", "h200"])
    _register(c, name, sids[1], "passing", ["gpu"])
    assert eventually(lambda: _ids(c.health.service(name, tag="gpu")[1]), lambda ids: len(ids) == 2) == sorted(sids)
    assert _ids(c.health.service(name, tag=["gpu", "h200"])[1]) == [f"{name}-a"]


def test_unknown_service_is_empty_list(api, name):
    """List Service Instances for a service nobody registered: 200 with [] (not 404)."""
    resp = api.get(f"/v1/health/service/{name}-none")
    assert resp.status_code == 200 and resp.json() == []


def test_health_checks_for_service(c, name, cleanup):
    """List Checks for Service returns the service's checks only."""
    cleanup.services.append(f"{name}-0")
    _register(c, name, f"{name}-0", "warning")
    _, checks = eventually(lambda: c.health.checks(name), lambda r: r[1] != [])
    assert [(ch["CheckID"], ch["Status"]) for ch in checks] == [(f"service:{name}-0", "warning")]


def test_health_state(c, api, name, cleanup):
    """List Checks in State: any|passing|warning|critical; another state is a 400."""
    cleanup.services.append(f"{name}-0")
    _register(c, name, f"{name}-0", "warning")
    _, warning = eventually(lambda: c.health.state("warning"),
                            lambda r: f"service:{name}-0" in [ch["CheckID"] for ch in r[1]])
    assert f"service:{name}-0" in [ch["CheckID"] for ch in warning]
    _, passing = c.health.state("passing")
    assert f"service:{name}-0" not in [ch["CheckID"] for ch in passing]
    assert api.get("/v1/health/state/bogus").status_code == 400


def test_catalog_services_service_nodes(c, name, cleanup):
    """List Services maps names to tags; List Nodes for Service gives ServiceID/ServicePort; List
    Nodes includes the agent's node."""
    cleanup.services.append(f"{name}-0")
    _register(c, name, f"{name}-0", "passing", ["gpu"])
    _, services = eventually(lambda: c.catalog.services(), lambda r: name in r[1])
    assert services[name] == ["gpu"]
    _, nodes = c.catalog.service(name)
    assert [(n["ServiceID"], n["ServicePort"]) for n in nodes] == [(f"{name}-0", 8000)]
    _, all_nodes = c.catalog.nodes()
    assert nodes[0]["Node"] in [n["Node"] for n in all_nodes]


def test_status_leader_and_peers(c, api):
    """Status: leader is "host:port" of the Raft leader; peers lists the Raft peers."""
    leader = c.status.leader()
    assert isinstance(leader, str) and ":" in leader
    assert leader in c.status.peers()


def test_agent_self_and_members(c, api):
    """Read Configuration (/v1/agent/self) has Config.Datacenter and NodeName; List Members includes
    this agent with Status 1 (alive)."""
    token = api.token
    me = api.get("/v1/agent/self", token=token).json()
    assert me["Config"]["Datacenter"] and me["Config"]["NodeName"]
    members = api.get("/v1/agent/members", token=token).json()
    assert me["Config"]["NodeName"] in [m["Name"] for m in members]
    assert all(m["Status"] == 1 for m in members)


def test_deregister_critical_service_after_is_accepted(c, name, cleanup):
    """DeregisterCriticalServiceAfter is part of a check definition (reaping itself is timed in
    test_server_only.py, since Consul's minimum is one minute)."""
    cleanup.services.append(name)
    assert c.agent.service.register(name, check=consul.Check.ttl("10s") | {"DeregisterCriticalServiceAfter": "1m"})
    assert name in c.agent.services()


def test_node_services_read_sees_a_node_registered_after_it(api, name):
    """List Services for Node (/v1/catalog/node/:node) reads the nodes and the services tables, so its
    index is the larger of the two (Consul's state store: NodeServices' ``maxIndexTxn(tx, "nodes",
    "services")``): a node registered with no service moves it. The dev server used the services index
    alone, so a ``null`` read before a client agent's node arrived was served again from the read cache (and
    a blocking read at that index never woke) until some service changed -- the intermittent "node missing
    20 s after its agent started" of test_agent_mode.py: under load the first read beat the first heartbeat,
    and that test's only service sync was refused (403), so nothing ever moved the services index."""
    node = f"{name}-node"
    before = api.get(f"/v1/catalog/node/{node}")
    assert before.status_code == 200 and before.json() is None
    index = int(before.headers["X-Consul-Index"])
    try:
        assert api.put("/v1/catalog/register", json={"Node": node, "Address": "127.0.0.9"}).status_code == 200
        assert api.get(f"/v1/catalog/node/{node}").json()["Node"]["Node"] == node
        woken = api.get(f"/v1/catalog/node/{node}", params={"index": index, "wait": "5s"})
        assert woken.json()["Node"]["Node"] == node and int(woken.headers["X-Consul-Index"]) > index
        assert woken.elapsed.total_seconds() < 4, "the blocking read wakes on the node's registration"
    finally:
        api.put("/v1/catalog/deregister", json={"Node": node})


def test_autopilot_health_names_the_servers_and_the_leader(api):
    """Autopilot's Read Health: overall Healthy and FailureTolerance, and per server Name, Leader, Voter and
    Healthy -- what the consul_agent role's server restart checks before and after each server."""
    resp = api.get("/v1/operator/autopilot/health")
    assert resp.status_code == 200, resp.text
    health = resp.json()
    assert health["Healthy"] is True and isinstance(health["FailureTolerance"], int)
    leaders = [s for s in health["Servers"] if s["Leader"]]
    assert len(leaders) == 1 and leaders[0]["Healthy"] and leaders[0]["Voter"] and leaders[0]["Name"]


def test_autopilot_health_needs_operator_read(dev_server):
    management = "0d7d8c9e-7a3b-4c59-9f0e-4a1b2c3d4e5f"
    server = dev_server(acl_token=management)
    denied = Api(server.address).get("/v1/operator/autopilot/health")
    assert denied.status_code == 403 and "lacks permission 'operator:read'" in denied.text
    assert Api(server.address, management).get("/v1/operator/autopilot/health").json()["Healthy"] is True


def test_catalog_register_names_the_service_in_its_service_field(api, name):
    """Register Entity (https://developer.hashicorp.com/consul/api-docs/catalog#register-entity): the service
    object names the service in ``Service``; the instance is listed on the node the request names."""
    node = f"{name}-node"
    service = {"ID": f"{name}-0", "Service": name, "Address": "127.0.0.21", "Port": 8000, "Meta": {"k": "v"}}
    try:
        answer = api.put("/v1/catalog/register", json={"Node": node, "Address": "127.0.0.21", "Service": service})
        assert answer.status_code == 200, answer.text
        [entry] = api.get(f"/v1/health/service/{name}").json()
        assert entry["Node"]["Node"] == node and entry["Service"]["Service"] == name
        assert entry["Service"]["ID"] == f"{name}-0" and entry["Service"]["Meta"] == {"k": "v"}
    finally:
        api.put("/v1/catalog/deregister", json={"Node": node})
