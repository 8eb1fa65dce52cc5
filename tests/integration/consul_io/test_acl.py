"""The cluster's Consul policies (consul_io/acl.py), created by clusterctl.infra.consul_acl, hold to least
privilege: each token may do its job and nothing next to it. Runs against a dev server with ACLs on and
default deny (the same rules Consul applies; see tests/integration/devconsul/test_acl.py for the rule semantics)."""

from __future__ import annotations

import importlib.util
import json
import uuid
from pathlib import Path

import pytest

from tests.helpers.devconsul import Api

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
MANAGEMENT = "6f1e2d3c-4b5a-4697-8a8b-9c0d1e2f3a4b"


def _module(name: str):
    path = REPO / f"collections/ansible_collections/clusterctl/infra/plugins/modules/{name}.py"
    spec = importlib.util.spec_from_file_location(f"clusterctl_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _filters():
    path = REPO / "playbooks/filter_plugins/consul_filters.py"
    spec = importlib.util.spec_from_file_location("consul_filters", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


@pytest.fixture
def server():
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0", acl_token=MANAGEMENT, node_name="n1") as srv:
        yield srv


@pytest.fixture
def tokens(server):
    """Every token of node n1, created as the role creates them."""
    made = {kind: str(uuid.uuid4()) for kind in ("agent", "registration", "operator", "eas_agent", "edge")}
    acl = _filters()["consul_node_acl"]("n1", "dc1", made)
    created, updated = _module("consul_acl").ensure(f"http://{server.address}", MANAGEMENT, acl["policies"],
                                                    acl["tokens"], check=False)
    assert len(created) == 10 and not updated
    return made


def _api(server, token: str) -> Api:
    return Api(server.address, token)


def test_creating_again_changes_nothing_and_a_changed_rule_is_updated(server, tokens):
    ensure = _module("consul_acl").ensure
    acl = _filters()["consul_node_acl"]("n1", "dc1", tokens)
    assert ensure(f"http://{server.address}", MANAGEMENT, acl["policies"], acl["tokens"], check=False) == ([], [])
    acl["policies"][0]["rules"] += 'key "extra" { policy = "read" }\n'
    assert ensure(f"http://{server.address}", MANAGEMENT, acl["policies"], acl["tokens"], check=True) == (
        [], [f"policy {acl['policies'][0]['name']}"])
    # check mode wrote nothing
    assert ensure(f"http://{server.address}", MANAGEMENT, acl["policies"], acl["tokens"], check=False)[1]


def test_the_tokens_every_node_shares_are_unchanged_by_the_next_node(server, tokens):
    """The operator and edge tokens are one secret each for the whole cluster (group variables): ensuring node
    n2's tokens after n1's must not rewrite them (a node name in a shared token's description flipped it on
    every run: a rerun of two nodes reported changed=1). The registration token is n2's own."""
    ensure = _module("consul_acl").ensure
    n2 = {**tokens, **{kind: str(uuid.uuid4()) for kind in ("agent", "registration", "eas_agent")}}
    acl = _filters()["consul_node_acl"]("n2", "dc1", n2)
    created, updated = ensure(f"http://{server.address}", MANAGEMENT, acl["policies"], acl["tokens"], check=False)
    assert sorted(created) == ["policy consul-agent-n2", "policy eas-agent-n2", "policy vllm-iu-registration-n2",
                               "token config_file_service_registration of n2", "token consul agent token of n2",
                               "token eas-agent of n2"] and not updated
    n1 = _filters()["consul_node_acl"]("n1", "dc1", tokens)
    assert ensure(f"http://{server.address}", MANAGEMENT, n1["policies"], n1["tokens"], check=False) == ([], [])


def test_agent_token_registers_its_node_but_cannot_set_maintenance(server, tokens):
    admin = _api(server, MANAGEMENT)
    assert admin.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu0"}).status_code == 200
    agent = _api(server, tokens["agent"])
    node = {"Node": "n1", "Address": "127.0.0.2", "Checks": [{"CheckID": "x", "Name": "x", "Status": "passing"}]}
    assert agent.put("/v1/catalog/register", json={**node, "Node": "n2"}).status_code == 403
    denied = agent.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"})
    assert denied.status_code == 403 and "'service:write' on \"vllm-iu-n1\"" in denied.text
    assert agent.get("/v1/health/service/vllm-iu-n1").json()  # service:read


def test_registration_token_writes_its_own_nodes_iu_and_edge_services_only(server, tokens):
    reg = _api(server, tokens["registration"])
    assert reg.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu9"}).status_code == 200
    assert reg.put("/v1/agent/service/register", json={"Name": "eas-edge-n1", "ID": "eas-edge-n1"}).status_code == 200
    for name in ("vllm-iu-n2", "vllm-iu", "vllm-iu-n1x", "eas-edge", "eas-edge-n2", "ssh"):
        assert reg.put("/v1/agent/service/register", json={"Name": name, "ID": "x"}).status_code == 403, name
    # the same ID under a name it may write replaces n1-iu9 only with write on n1-iu9's name too
    assert _api(server, MANAGEMENT).put("/v1/agent/service/register", json={
        "Name": "vllm-iu-n2", "ID": "n2-iu0"}).status_code == 200
    assert reg.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n2-iu0"}).status_code == 403
    assert reg.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"x").status_code == 403


def test_operator_token_sets_maintenance_and_markers_and_nothing_else(server, tokens):
    admin = _api(server, MANAGEMENT)
    admin.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu0"})
    op = _api(server, tokens["operator"])
    assert op.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"}).status_code == 200
    assert op.put("/v1/kv/clusterctl/preflight/dc1/n1-iu0", data=b"{}").status_code == 200
    assert op.get("/v1/kv/clusterctl/preflight/dc1/", params={"keys": ""}).json() == [
        "clusterctl/preflight/dc1/n1-iu0"]
    assert op.get("/v1/agent/self").status_code == 200  # preflight's agent check
    assert op.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"x").status_code == 403
    assert op.put("/v1/acl/policy", json={"Name": "x", "Rules": ""}).status_code == 403
    assert op.put("/v1/agent/maintenance", params={"enable": "true"}).status_code == 403  # node maintenance


def test_eas_agent_token_writes_only_its_own_score_key_and_cannot_release_an_iu(server, tokens):
    """The agent runs next to third-party model code: its token must not take an IU out of maintenance (the
    preflight gate) nor register anything; it publishes only its own score key."""
    admin = _api(server, MANAGEMENT)
    admin.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu0"})
    eas = _api(server, tokens["eas_agent"])
    assert eas.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"{}").status_code == 200
    assert eas.put("/v1/kv/clusterctl/eas/dc1/n2", data=b"{}").status_code == 403
    assert eas.get("/v1/kv/clusterctl/eas/", params={"recurse": ""}).status_code == 200
    assert eas.put("/v1/kv/clusterctl/preflight/dc1/n1-iu0", data=b"{}").status_code == 403
    check = {"Name": "a check on n1-iu0", "CheckID": "c", "ServiceID": "n1-iu0", "TTL": "30s"}
    assert eas.put("/v1/agent/check/register", data=json.dumps(check)).status_code == 403
    assert admin.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"}).status_code == 200
    assert eas.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "false"}).status_code == 403
    assert eas.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu9"}).status_code == 403
    assert eas.put("/v1/agent/check/register", data=json.dumps({"Name": "node-level", "TTL": "30s"})).status_code == 403


def test_edge_token_reads_and_writes_nothing(server, tokens):
    admin = _api(server, MANAGEMENT)
    admin.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu0"})
    admin.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"{}")
    edge = _api(server, tokens["edge"])
    assert [e["Service"]["ID"] for e in edge.get("/v1/health/service/vllm-iu-n1").json()] == ["n1-iu0"]
    assert edge.get("/v1/kv/clusterctl/eas/", params={"recurse": ""}).json()[0]["Key"] == "clusterctl/eas/dc1/n1"
    assert edge.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"x").status_code == 403
    assert edge.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"}).status_code == 403


def test_bind_ip_keeps_ips_and_templates_and_resolves_names():
    bind_ip = _filters()["consul_bind_ip"]
    assert bind_ip("127.0.1.11") == "127.0.1.11"
    assert bind_ip('{{ GetInterfaceIP "bond0" }}') == '{{ GetInterfaceIP "bond0" }}'
    assert bind_ip("localhost") == "127.0.0.1"
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="consul_agent_bind_addr: cannot resolve 'no-such-host.invalid'"):
        bind_ip("no-such-host.invalid")


def test_one_secret_for_two_jobs_is_refused():
    from ansible.errors import AnsibleFilterError

    with pytest.raises(AnsibleFilterError, match="n1: the agent and operator Consul tokens are the same secret"):
        _filters()["consul_node_acl"]("n1", "dc1", {"agent": "s", "operator": "s"})


def test_the_token_rule_vault_value_first_then_a_private_file(tmp_path):
    from ansible.errors import AnsibleFilterError

    token = _filters()["consul_token"]
    path = tmp_path / "consul.token"
    path.write_text("  4a3b2c1d-0000-4000-8000-000000000001\n")
    path.chmod(0o600)
    assert token("from-vault", str(path)) == "from-vault"
    assert token("", str(path)) == token(None, path) == "4a3b2c1d-0000-4000-8000-000000000001"
    assert token("", "") == ""
    path.chmod(0o640)
    with pytest.raises(AnsibleFilterError, match=r"consul_token_file .*consul.token: readable by group/others "
                                                 r"\(mode 0640\); chmod 600"):
        token("", str(path))
    for text, why in (("\n", "found nothing"), ("a b\n", "found whitespace")):
        path.write_text(text)
        path.chmod(0o600)
        with pytest.raises(AnsibleFilterError, match=f"must hold one Consul ACL token \\({why}"):
            token("", str(path))
    with pytest.raises(AnsibleFilterError, match="cannot read the Consul token file"):
        token("", str(tmp_path / "missing"))
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(AnsibleFilterError, match="not a text file"):
        token("", str(path))


def test_the_filter_is_the_python_readers_token_rule(tmp_path):
    """One function for the roles and clusterctl (cluster.settings.Consul.operator_token): a vault value of
    two words went out as the header before, where preflight refused it."""
    from ansible.errors import AnsibleFilterError

    from cluster.settings import node_settings
    from consul_io.client import TokenError

    with pytest.raises(AnsibleFilterError) as filtered:
        _filters()["consul_token"]("s3cr3t s3cr3t", "")
    with pytest.raises(TokenError) as read:
        node_settings({"consul_token": "s3cr3t s3cr3t"}).consul.operator_token()
    assert str(filtered.value) == str(read.value) == (
        "consul_token: the Consul ACL token holds whitespace (a vault value of one line is expected)")


def test_the_maintenance_filter_reads_which_services_consul_holds_in_maintenance():
    checks = {"_service_maintenance:n1-iu0": {"CheckID": "_service_maintenance:n1-iu0", "Notes": "clusterctl rolling restart"},
              "_service_maintenance:n1-iu1": {"CheckID": "_service_maintenance:n1-iu1"},
              "_node_maintenance": {"Notes": "node"}, "serfHealth": {"Notes": "gossip"},
              "vllm-iu:n1-iu0:health": {}}
    assert _filters()["consul_maintenance"](checks) == {"n1-iu0": "clusterctl rolling restart", "n1-iu1": None}
    assert _filters()["consul_maintenance"]({}) == {}


@pytest.mark.parametrize("raced", ["/v1/acl/policy", "/v1/acl/token"])
def test_a_shared_policy_or_token_created_by_another_node_in_between_is_adopted(server, raced, monkeypatch):
    """A batch ensures its nodes' ACLs in parallel forks, and every node ensures the shared policies and tokens:
    n1 creates them between n2's read (not there) and n2's create, which Consul refuses ("already exists",
    "SecretID is already in use"). n2's run must adopt what n1 made, not fail (r02n02's first run failed at
    this task when four nodes provisioned at once)."""
    module = _module("consul_acl")
    shared = {kind: str(uuid.uuid4()) for kind in ("operator", "edge")}
    own = ("agent", "registration", "eas_agent")
    n1 = {**shared, **{kind: str(uuid.uuid4()) for kind in own}}
    n2 = {**shared, **{kind: str(uuid.uuid4()) for kind in own}}
    acl1 = _filters()["consul_node_acl"]("n1", "dc1", n1)
    acl2 = _filters()["consul_node_acl"]("n2", "dc1", n2)
    url = f"http://{server.address}"
    real_call, interleaved, started = module.call, [], []

    shared_names = {"clusterctl-operator", "clusterctl-edge"}

    def call(url_, method, path, token, body=None, timeout=30):
        # n2 has read a shared one as missing and is about to create it: n1 creates it first
        if (method == "PUT" and path == raced and not started
                and (body.get("Name") in shared_names or body.get("SecretID") in shared.values())):
            started.append(path)  # n1's own calls come through here too
            interleaved.append(module.ensure(url, MANAGEMENT, acl1["policies"], acl1["tokens"], check=False))
        return real_call(url_, method, path, token, body, timeout)

    monkeypatch.setattr(module, "call", call)
    created, updated = module.ensure(url, MANAGEMENT, acl2["policies"], acl2["tokens"], check=False)
    monkeypatch.setattr(module, "call", real_call)
    assert interleaved and any(made.startswith(raced.rsplit("/", 1)[-1]) for made in interleaved[0][0])
    # n2 made its own three policies and three tokens; nothing of n1's was rewritten
    assert not updated and {"policy consul-agent-n2", "policy eas-agent-n2", "policy vllm-iu-registration-n2",
                            "token consul agent token of n2", "token eas-agent of n2",
                            "token config_file_service_registration of n2"} <= set(created)
    assert module.ensure(url, MANAGEMENT, acl1["policies"], acl1["tokens"], check=False) == ([], [])
    assert module.ensure(url, MANAGEMENT, acl2["policies"], acl2["tokens"], check=False) == ([], [])
    for token in ("operator", "edge"):
        assert _api(server, shared[token]).get("/v1/acl/token/self").status_code == 200


CAPABILITIES = REPO / "docs/contracts/consul-layout.md"
TOKEN_COLUMNS = {"agent": "agent", "registration": "registration", "operator": "operator", "eas-agent": "eas_agent",
                 "edge": "edge"}


def _capability_table() -> tuple[list[str], dict[str, list[bool]]]:
    """(token kinds in column order, action -> allowed per column) from the contract page's table."""
    section = CAPABILITIES.read_text().split("\n## What each token can do\n", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    kinds = [TOKEN_COLUMNS[cell] for cell in header[1:]]
    table = {}
    for row in rows[1:]:
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert all(c in ("yes", "no") for c in cells[1:]), row
        table[cells[0]] = [c == "yes" for c in cells[1:]]
    return kinds, table


def _allowed(answer) -> bool:
    assert answer.status_code in (200, 403, 404), (answer.status_code, answer.text)
    return answer.status_code == 200


def _read_some(answer) -> bool:
    return _allowed(answer) and bool(answer.json())


def _read_rollout(admin: Api, api: Api) -> bool:
    assert admin.put("/v1/kv/clusterctl/rollout/dc1/document", data=b"{}").status_code == 200
    return _read_some(api.get("/v1/kv/clusterctl/rollout/dc1/document"))


def _with_service_maintenance(admin: Api, api: Api):
    assert admin.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"}).status_code == 200
    return _allowed(api.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "false"}))


# The table's first column -> the request that performs it with the token under test (node n1's tokens; the
# server's own node is n1, n2 a node another agent registered).
ACTIONS = {
    "register an IU on its own node (`agent/service/register`, `vllm-iu-n1`)": lambda admin, api: _allowed(
        api.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu9", "Port": 8009})),
    "register an IU of another node (`vllm-iu-n2`)": lambda admin, api: _allowed(
        api.put("/v1/agent/service/register", json={"Name": "vllm-iu-n2", "ID": "n2-iu9", "Port": 8009})),
    "put an instance of `vllm-iu-n1` on catalog node `n2` (`catalog/register`, `n2` unchanged)": lambda admin, api:
        _allowed(api.put("/v1/catalog/register", json={
            "Node": "n2", "Address": "127.0.0.2", "SkipNodeUpdate": True,
            "Service": {"Service": "vllm-iu-n1", "ID": "n2-iu9", "Port": 8009}})),
    "replace another node's IU (`catalog/register` with `n2-iu0`'s ID)": lambda admin, api: _allowed(
        api.put("/v1/catalog/register", json={"Node": "n2", "Address": "127.0.0.2", "SkipNodeUpdate": True,
                                              "Service": {"Service": "vllm-iu-n1", "ID": "n2-iu0", "Port": 8009}})),
    "deregister another node's IU (`catalog/deregister`)": lambda admin, api: _allowed(
        api.put("/v1/catalog/deregister", json={"Node": "n2", "ServiceID": "n2-iu0"})),
    "register its own edge's service `eas-edge-n1` (`agent/service/register`)": lambda admin, api: _allowed(
        api.put("/v1/agent/service/register", json={"Name": "eas-edge-n1", "ID": "eas-edge-n1", "Port": 8080})),
    "register another host's edge service (`eas-edge-n2`)": lambda admin, api: _allowed(
        api.put("/v1/agent/service/register", json={"Name": "eas-edge-n2", "ID": "eas-edge-n2", "Port": 8080})),
    "register a service that is neither its IUs' nor its edge's": lambda admin, api: _allowed(
        api.put("/v1/agent/service/register", json={"Name": "ssh", "ID": "ssh"})),
    "register node `n2` or change its address": lambda admin, api: _allowed(
        api.put("/v1/catalog/register", json={"Node": "n2", "Address": "127.0.0.99"})),
    "update a TTL check on its own IU (`agent/check/pass`)": lambda admin, api: _allowed(
        api.put("/v1/agent/check/pass/ttl:n1-iu0")),
    "put its own IU into maintenance": lambda admin, api: _allowed(
        api.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "true"})),
    "take its own IU out of maintenance": _with_service_maintenance,
    "put the node into maintenance (`agent/maintenance`)": lambda admin, api: _allowed(
        api.put("/v1/agent/maintenance", params={"enable": "true"})),
    "write its own score key `clusterctl/eas/<dc>/n1`": lambda admin, api: _allowed(
        api.put("/v1/kv/clusterctl/eas/dc1/n1", data=b"{}")),
    "write another node's score key": lambda admin, api: _allowed(api.put("/v1/kv/clusterctl/eas/dc1/n2", data=b"{}")),
    "write a release marker `clusterctl/preflight/<dc>/<iu>`": lambda admin, api: _allowed(
        api.put("/v1/kv/clusterctl/preflight/dc1/n1-iu0", data=b"{}")),
    "read the IU listing (`health/service/vllm-iu-n1`)": lambda admin, api: _read_some(
        api.get("/v1/health/service/vllm-iu-n1")),
    "read the score keys": lambda admin, api: _read_some(api.get("/v1/kv/clusterctl/eas/", params={"recurse": ""})),
    "write the rollout document `clusterctl/rollout/<dc>/document`": lambda admin, api: _allowed(
        api.put("/v1/kv/clusterctl/rollout/dc1/document", data=b"{}")),
    "read the rollout document": lambda admin, api: _read_rollout(admin, api),
    "write a repair record `clusterctl/repair/<dc>/<node>`": lambda admin, api: _allowed(
        api.put("/v1/kv/clusterctl/repair/dc1/n1", data=b"{}")),
    "read the servers' health (`operator/autopilot/health`)": lambda admin, api: _allowed(
        api.get("/v1/operator/autopilot/health")),
    "create or change ACL policies and tokens": lambda admin, api: _allowed(
        api.put("/v1/acl/policy", json={"Name": "extra", "Rules": ""})),
}


@pytest.mark.parametrize("kind", list(TOKEN_COLUMNS.values()))
def test_each_token_can_do_what_the_contract_table_says_and_nothing_else(server, tokens, kind):
    """Every cell of docs/contracts/consul-layout.md's token table, performed with that token against the
    dev server's ACL enforcement; each action on a fresh state (what the one before changed is undone)."""
    kinds, table = _capability_table()
    assert set(table) == set(ACTIONS), "the table's actions and this test's must be the same list"
    admin, api = _api(server, MANAGEMENT), _api(server, tokens[kind])
    check = {"Name": "a TTL check of n1-iu0", "CheckID": "ttl:n1-iu0", "ServiceID": "n1-iu0", "TTL": "30s"}
    wrong = []
    for action, allowed in table.items():
        assert admin.put("/v1/agent/service/register", json={"Name": "vllm-iu-n1", "ID": "n1-iu0", "Port": 8000,
                                                              "Check": check}).status_code == 200
        assert admin.put("/v1/catalog/register", json={"Node": "n2", "Address": "127.0.0.2", "Service": {
            "Service": "vllm-iu-n2", "ID": "n2-iu0", "Port": 8000}}).status_code == 200
        assert admin.put("/v1/kv/clusterctl/eas/dc1/n2", data=b"{}").status_code == 200
        if ACTIONS[action](admin, api) != allowed[kinds.index(kind)]:
            wrong.append(action)
        admin.put("/v1/agent/maintenance", params={"enable": "false"})
        admin.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "false"})
    assert not wrong, f"the {kind} token's cells are wrong for: {wrong}"
