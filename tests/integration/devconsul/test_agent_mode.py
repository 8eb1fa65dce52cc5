"""Client agents joined to a server: file services, anti-entropy with tokens, maintenance, membership.

Behaviour checked (Consul docs): services from config files register with ``config_file_service_registration``
(https://developer.hashicorp.com/consul/commands/acl/set-agent-token) and under default deny never reach the
catalog without it; an agent answers /v1/agent/* itself and forwards reads to the servers; maintenance is a
critical ``_service_maintenance:<id>`` check synced to the catalog; a check runs on the node and its status
reaches /v1/health; ``leave_on_terminate`` removes the node; a node that stops answering gets serfHealth
critical; a reload keeps maintenance. These need several configured agents, so they run on the dev server only.
"""

from __future__ import annotations

import socket

import pytest

from devconsul.agent import load_file_services
from devconsul.agentconfig import AgentSettings
from devconsul.server import DevConsulServer
from tests.helpers.devconsul import Api, needs_dev_server, wait_until

pytestmark = [pytest.mark.integration, needs_dev_server]
MANAGEMENT = "0d7d8c9e-7a3b-4c59-9f0e-4a1b2c3d4e5f"
GOSSIP = "pUqJrVyVRj5jsiYEkM/tFQYfWyJIv4s3XkvDAA=="[:24]  # 16 bytes, base64


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Cluster:
    def __init__(self, acl: bool = True, gossip: str = ""):
        self.rpc_port = _free_port()
        self.acl = acl
        settings = AgentSettings("srv", server=True, server_port=self.rpc_port, acl_enabled=acl,
                                 default_policy="deny", gossip_key=gossip,
                                 tokens={"initial_management": MANAGEMENT} if acl else {})
        self.server = DevConsulServer(addr="127.0.0.1:0", agent=settings, failure_timeout=1.5,
                                      check_update_interval=0).start()
        self.api = Api(self.server.address, MANAGEMENT if acl else None)
        self.agents: list[DevConsulServer] = []

    def token(self, rules: str) -> str:
        name = f"p{len(self.agents)}-{abs(hash(rules)) % 10**8}"
        self.api.put("/v1/acl/policy", json={"Name": name, "Rules": rules})
        return self.api.put("/v1/acl/token", json={"Policies": [{"Name": name}]}).json()["SecretID"]

    def agent(self, name: str, tokens: dict | None = None, gossip: str = "", **kw) -> DevConsulServer:
        settings = AgentSettings(name, server=False, retry_join=[f"127.0.0.1:{self.rpc_port}"],
                                 acl_enabled=self.acl, default_policy="deny", tokens=tokens or {},
                                 gossip_key=gossip, leave_on_terminate=True, check_update_interval=0)
        agent = DevConsulServer(addr="127.0.0.1:0", agent=settings, ae_interval=kw.get("ae_interval", 60.0)).start()
        self.agents.append(agent)
        return agent

    def close(self) -> None:
        for agent in self.agents:
            agent.stop(leave=False)
        self.server.stop()


@pytest.fixture
def cluster():
    made: list[Cluster] = []

    def make(**kw) -> Cluster:
        made.append(Cluster(**kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def _iu(name: str, url: str) -> dict:
    return {"name": "vllm-iu", "id": f"{name}-iu0", "port": 8000, "address": "127.0.0.1",
            "checks": [{"id": f"vllm-iu:{name}-iu0:health", "name": "health", "http": url, "interval": "1s",
                        "timeout": "1s"}]}


def _health(c: Cluster, passing: bool = False) -> list:
    params = {"passing": "1"} if passing else {}
    return c.api.get("/v1/health/service/vllm-iu", params=params).json()


AGENT_RULES = 'node "n1" { policy = "write" }\nservice_prefix "" { policy = "read" }'
REG_RULES = 'service "vllm-iu" { policy = "write" }'


def test_file_service_reaches_the_catalog_only_with_a_registration_token(cluster, tiny_http):
    c = cluster()
    agent_token = c.token(AGENT_RULES)
    # Read the node before its agent exists, as a loaded test run used to by chance (the read beat the
    # first heartbeat): that null must not be served again once the node joins. It was, from the read
    # cache keyed by the services index alone, which this test's refused service sync never moves
    # (test_health_catalog.py::test_node_services_read_sees_a_node_registered_after_it has the cause).
    assert c.api.get("/v1/catalog/node/n1").json() is None
    blocked = c.agent("n1", tokens={"agent": agent_token})
    load_file_services(blocked, [_iu("n1", tiny_http.url)])
    assert wait_until(lambda: c.api.get("/v1/catalog/node/n1").json(), 20), "the node joins with its agent token"
    assert not wait_until(lambda: _health(c), 2), "default deny: no token for file services, never synced"
    assert "n1-iu0" in Api(blocked.address, MANAGEMENT).get("/v1/agent/services").json()
    blocked.agent_tokens.set("config_file_service_registration", c.token(REG_RULES))
    entries = wait_until(lambda: _health(c, passing=True), 8)
    assert [e["Service"]["ID"] for e in entries] == ["n1-iu0"]
    assert entries[0]["Node"]["Node"] == "n1"


def test_check_runs_on_the_node_and_critical_reaches_the_server(cluster, tiny_http):
    c = cluster(acl=False)
    agent = c.agent("n1")
    load_file_services(agent, [_iu("n1", tiny_http.url)])
    assert wait_until(lambda: _health(c, passing=True), 8)
    tiny_http.status = 500
    assert wait_until(lambda: not _health(c, passing=True), 5), "critical within the 1 s interval (+ sync)"
    statuses = {ch["CheckID"]: ch["Status"] for ch in _health(c)[0]["Checks"]}
    assert statuses["vllm-iu:n1-iu0:health"] == "critical" and statuses["serfHealth"] == "passing"


def test_agent_token_cannot_set_maintenance_the_operator_token_can(cluster, tiny_http):
    c = cluster()
    agent_token = c.token(AGENT_RULES)
    agent = c.agent("n1", tokens={"agent": agent_token, "config_file_service_registration": c.token(REG_RULES)})
    load_file_services(agent, [_iu("n1", tiny_http.url)])
    path = "/v1/agent/service/maintenance/n1-iu0"
    denied = Api(agent.address, agent_token).put(path, params={"enable": "true"})
    assert denied.status_code == 403 and "lacks permission 'service:write' on \"vllm-iu\"" in denied.text
    operator = c.token('service_prefix "" { policy = "write" }')
    assert Api(agent.address, operator).put(path, params={"enable": "true", "reason": "q"}).status_code == 200

    def in_maintenance():
        entries = _health(c)
        return entries and any(ch["CheckID"] == "_service_maintenance:n1-iu0" for ch in entries[0]["Checks"])

    assert wait_until(in_maintenance, 5), "the maintenance check is synced to the catalog"
    # ...and so is its end: Consul's anti-entropy deregisters a check the agent no longer has (the
    # catalog register call never removes a check it does not list). Before, the release never left the node.
    assert Api(agent.address, operator).put(path, params={"enable": "false"}).status_code == 200
    assert wait_until(lambda: not in_maintenance(), 5), "the end of maintenance is synced to the catalog"
    assert wait_until(lambda: [e["Service"]["ID"] for e in _health(c, passing=True)] == ["n1-iu0"], 5)


def test_reads_are_forwarded_to_the_server_with_the_caller_token(cluster):
    c = cluster()
    c.api.put("/v1/kv/eas/n1", data=b"score")
    agent = c.agent("n1")
    assert Api(agent.address, MANAGEMENT).get("/v1/kv/eas/n1", params={"raw": ""}).content == b"score"
    assert Api(agent.address).get("/v1/kv/eas/n1").status_code == 403


def test_leave_on_terminate_removes_the_node_and_a_silent_node_fails(cluster, tiny_http):
    c = cluster(acl=False)
    leaving, dying = c.agent("n1"), c.agent("n2")
    load_file_services(leaving, [_iu("n1", tiny_http.url)])
    load_file_services(dying, [_iu("n2", tiny_http.url)])
    assert wait_until(lambda: len(_health(c, passing=True)) == 2, 8)
    c.agents.remove(leaving)
    leaving.stop()  # leave_on_terminate: the node and its services leave the catalog at once
    assert wait_until(lambda: [e["Node"]["Node"] for e in _health(c)] == ["n2"], 3)
    c.agents.remove(dying)
    dying.stop(leave=False)  # no leave: the server notices the silence (failure_timeout 1.5 s here)
    assert wait_until(lambda: not _health(c, passing=True), 5)
    serf = {ch["CheckID"]: ch for ch in _health(c)[0]["Checks"]}["serfHealth"]
    assert serf["Status"] == "critical" and serf["Output"] == "Agent not live or unreachable"


def test_a_wrong_gossip_key_never_joins(cluster):
    c = cluster(acl=False, gossip="cGFzc3dvcmRwYXNzd29yZA==")
    agent = c.agent("n1", gossip="ZGlmZmVyZW50ZGlmZmVyZQ==")
    assert not agent.link.joined.wait(2)
    assert c.api.get("/v1/catalog/node/n1").json() is None


def test_reload_keeps_maintenance_and_drops_removed_file_services(cluster, tiny_http):
    c = cluster(acl=False)
    agent = c.agent("n1")
    extra = {**_iu("n1", tiny_http.url), "id": "n1-iu1", "checks": []}
    load_file_services(agent, [_iu("n1", tiny_http.url), extra])
    local = Api(agent.address)
    assert local.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"}).status_code == 200
    changed = {**_iu("n1", tiny_http.url), "port": 8001}
    load_file_services(agent, [changed])
    services = local.get("/v1/agent/services").json()
    assert set(services) == {"n1-iu0"} and services["n1-iu0"]["Port"] == 8001
    assert "_service_maintenance:n1-iu0" in local.get("/v1/agent/checks").json()
    assert wait_until(lambda: [e["Service"]["ID"] for e in _health(c)] == ["n1-iu0"], 5)


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/catalog/register", ["not", "an", "object"]),
    ("/v1/catalog/register", {"Node": "n9", "Address": "127.0.0.9", "Service": "web"}),
    ("/v1/catalog/register", {"Node": "n9", "Address": "127.0.0.9", "Checks": "abc"}),
    ("/v1/catalog/register", {"Node": "n9", "Address": "127.0.0.9", "Check": {"CheckID": "c", "ServiceID": "nope"}}),
    ("/v1/catalog/deregister", {"ServiceID": "x"}),
    ("/v1/internal/devconsul/member", "a string"),
    ("/v1/internal/devconsul/member", {"Node": ""}),
    ("/v1/agent/token/agent", [1, 2]),
    ("/v1/agent/token/no-such-kind", {"Token": "x"}),
    ("/v1/acl/policy", {"Name": "ok-name", "Rules": "key_prefix {"}),
    ("/v1/acl/token", {"Policies": ["not-a-dict"]}),
])
def test_hostile_bodies_get_a_4xx_never_a_500(cluster, path, body):
    c = cluster(acl=False) if path.startswith("/v1/catalog") or "internal" in path or "agent" in path else None
    if c is None:
        from devconsul.server import DevConsulServer as Server

        server = Server(addr="127.0.0.1:0", acl_token=MANAGEMENT).start()
        try:
            resp = Api(server.address, MANAGEMENT).put(path, json=body)
        finally:
            server.stop()
    else:
        resp = c.api.put(path, json=body)
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text)
    assert resp.text and "Traceback" not in resp.text
