"""The consul_agent role's live tasks (tasks/acl.yml and tasks/maintenance.yml) run by ansible-playbook against a
Consul stand-in server and a client agent holding the file-defined IU services: the server's configuration has
no management token (as the role renders it), the first run bootstraps the ACLs with the vault's, the policies
and tokens are created, the file services reach the catalog only through the registration token, and the preflight gate holds
over runs: released IUs stay released, a re-registered IU (reaped, reloaded) goes back into maintenance, and a
refused maintenance call fails the host."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from devconsul import agentlink
from devconsul.agent import load_file_services
from devconsul.agentconfig import AgentSettings
from devconsul.server import DevConsulServer
from tests.helpers.devconsul import Api, TinyHTTP, wait_until

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]
MANAGEMENT = str(uuid.uuid4())
TOKENS = {k: str(uuid.uuid4()) for k in ("agent", "registration", "operator")}
PLAYBOOK = """
- hosts: n1
  gather_facts: false
  vars:
    # what the role's first task sets from the cluster model
    _consul_agent_node: {ius: [{id: n1-iu0}, {id: n1-iu1}], dedicated_consul_server: false}
    _consul_agent_url: "{{ (inventory_hostname | cluster_consul(hostvars[inventory_hostname])).url }}"
  tasks:
    - name: ACL policies and tokens
      ansible.builtin.include_role: {name: consul_agent, tasks_from: acl.yml}
      when: gate_acl | default(true) | bool
    - name: The preflight gate
      ansible.builtin.include_role: {name: consul_agent, tasks_from: maintenance.yml}
      when: gate_maintenance | default(true) | bool
      vars:
        _consul_agent_headers: {X-Consul-Token: "{{ consul_agent_acl_operator_token }}"}
        _consul_agent_secret: true
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def tiny_http():
    server = TinyHTTP()
    yield server
    server.close()


@pytest.fixture
def cluster(monkeypatch, tiny_http):
    monkeypatch.setattr(agentlink, "RETRY_FAIL_S", 0.5)  # Consul retries in 15 s; the test need not wait
    rpc = _free_port()
    server = DevConsulServer(addr="127.0.0.1:0", agent=AgentSettings(
        "srv", server=True, server_port=rpc, acl_enabled=True, default_policy="deny"),
        check_update_interval=0).start()
    agent = DevConsulServer(addr="127.0.0.1:0", agent=AgentSettings(
        "n1", server=False, retry_join=[f"127.0.0.1:{rpc}"], acl_enabled=True, default_policy="deny",
        tokens={"agent": TOKENS["agent"], "config_file_service_registration": TOKENS["registration"]},
        check_update_interval=0)).start()
    services = [{"name": "vllm-iu-n1", "id": f"n1-iu{n}", "port": 8000 + n,
                 "checks": [{"id": f"vllm-iu:n1-iu{n}:health", "http": tiny_http.url, "interval": "1s"}]}
                for n in (0, 1)]
    agent.finish_write(load_file_services(agent, services))
    yield server, agent, services
    agent.stop(leave=False)
    server.stop()


def _run(tmp_path: Path, server, agent, operator: str = TOKENS["operator"], *extra: str) -> subprocess.CompletedProcess:
    python = sys.executable
    inventory = {"all": {
        "hosts": {"n1": {"ansible_connection": "local", "ansible_python_interpreter": python,
                         "consul_http_addr": agent.address}},
        "children": {"consul_servers": {"hosts": {"srv": {"ansible_connection": "local",
                                                           "ansible_python_interpreter": python,
                                                           "consul_http_addr": server.address}}}},
        "vars": {"consul_agent_acl_management_token": MANAGEMENT, "consul_agent_acl_agent_token": TOKENS["agent"],
                 "consul_agent_acl_registration_token": TOKENS["registration"], "consul_token": operator},
    }}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "gate.yml").write_text(PLAYBOOK)
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1",
               ANSIBLE_ROLES_PATH=str(REPO / "roles"))
    return subprocess.run([str(Path(python).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.json"),
                           str(tmp_path / "gate.yml"), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def _maintenance(agent) -> set[str]:
    checks = Api(agent.address, MANAGEMENT).get("/v1/agent/checks").json()
    return {c.removeprefix("_service_maintenance:") for c in checks if c.startswith("_service_maintenance:")}


def _catalog(server) -> dict[str, set[str]]:
    entries = Api(server.address, MANAGEMENT).get("/v1/health/service/vllm-iu-n1").json()
    return {e["Service"]["ID"]: {c["CheckID"] for c in e["Checks"]} for e in entries}


def test_the_gate_holds_over_runs(tmp_path, cluster):
    server, agent, services = cluster
    first = _run(tmp_path, server, agent)
    assert first.returncode == 0, first.stdout[-3000:]
    assert MANAGEMENT not in first.stdout and TOKENS["operator"] not in first.stdout
    assert _maintenance(agent) == {"n1-iu0", "n1-iu1"}
    # file services reach the catalog once the role made the registration token, in maintenance
    assert wait_until(lambda: all("_service_maintenance:" + i in _catalog(server).get(i, set())
                                  for i in ("n1-iu0", "n1-iu1")), 10), _catalog(server)

    # preflight --release for n1-iu0: the marker, then maintenance off (preflight/consul.release)
    operator = Api(agent.address, TOKENS["operator"])
    assert operator.put("/v1/kv/clusterctl/preflight/dc1/n1-iu0", data=b"{}").status_code == 200
    assert operator.put("/v1/agent/service/maintenance/n1-iu0", params={"enable": "false"}).status_code == 200
    second = _run(tmp_path, server, agent)
    assert second.returncode == 0, second.stdout[-3000:]
    assert _maintenance(agent) == {"n1-iu1"}, "a released IU stays released; the other stays held"

    # n1-iu1 reaped and registered again from its file (reload/restart): no maintenance check any more
    admin = Api(agent.address, MANAGEMENT)
    assert admin.put("/v1/agent/service/deregister/n1-iu1").status_code == 200
    agent.finish_write(load_file_services(agent, services))
    assert _maintenance(agent) == set()
    third = _run(tmp_path, server, agent)
    assert third.returncode == 0, third.stdout[-3000:]
    assert _maintenance(agent) == {"n1-iu1"}, "the gate is decided from state, not from a new file"


def test_a_refused_maintenance_call_fails_the_host(tmp_path, cluster):
    server, agent, _ = cluster
    assert _run(tmp_path, server, agent, TOKENS["operator"], "-e", "gate_maintenance=false").returncode == 0
    # the agent token as operator: node:write, service:read; maintenance needs service:write
    result = _run(tmp_path, server, agent, TOKENS["agent"], "-e", "gate_acl=false")
    assert result.returncode == 2, result.stdout[-3000:]
    assert "failed=1" in result.stdout.replace(" ", "")
    assert _maintenance(agent) == set()
    # and the next run with the right token holds both
    assert _run(tmp_path, server, agent).returncode == 0
    assert _maintenance(agent) == {"n1-iu0", "n1-iu1"}
