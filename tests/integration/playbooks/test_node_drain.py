"""The drain around a reboot (playbooks/tasks/node_drain.yml, node_release.yml) run by ansible-playbook against a
Consul stand-in server, the node's client agent (ACLs on, default deny) and the node's two IUs (HTTP /health and
/metrics on the node's address): the node goes into Consul node maintenance with its agent token, the view the
edges read (their token, the servers' catalog, passing only) drops its IUs before the "reboot", and the node
comes back into rotation only once its IUs pass again; maintenance that someone else set is left alone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from consul_io import acl, layout
from devconsul import agentlink
from devconsul.agent import load_file_services
from devconsul.agentconfig import AgentSettings
from devconsul.server import DevConsulServer
from tests.helpers import REPO
from tests.helpers.devconsul import Api, wait_until

pytestmark = pytest.mark.integration

NODE, ADDRESS, SERVER_ADDRESS = "r01n01", "127.0.64.11", "127.0.64.2"
MANAGEMENT = str(uuid.uuid4())
TOKENS = {k: str(uuid.uuid4()) for k in ("agent", "registration", "edge")}


class IU:
    """One IU's HTTP side on the node's address: /health answers ``status``; GET /down makes it 500 (the stand-in
    for an IU that does not come back after the reboot); /metrics has nothing in flight."""

    def __init__(self, port: int):
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/down":
                    outer.status = 500
                body = b"vllm:num_requests_running{model_name=\"m\"} 0.0\n" if self.path == "/metrics" else b"ok"
                self.send_response(outer.status if self.path == "/health" else 200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer((ADDRESS, port), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.setattr(agentlink, "RETRY_FAIL_S", 0.5)
    server = DevConsulServer(addr=f"{SERVER_ADDRESS}:0", agent=AgentSettings(
        "srv", server=True, bind_addr=SERVER_ADDRESS, server_port=18300, acl_enabled=True, default_policy="deny",
        tokens={"initial_management": MANAGEMENT}), check_update_interval=0).start()
    admin = Api(server.address, MANAGEMENT)
    rules = acl.node_policies(NODE, "dc1")
    for kind, secret in TOKENS.items():
        name = layout.acl_policy(kind, NODE)
        assert admin.put("/v1/acl/policy", json={"Name": name, "Rules": rules[name]}).status_code == 200
        assert admin.put("/v1/acl/token", json={"SecretID": secret, "Policies": [{"Name": name}]}).status_code == 200
    agent = DevConsulServer(addr=f"{ADDRESS}:0", agent=AgentSettings(
        NODE, server=False, bind_addr=ADDRESS, retry_join=[f"{SERVER_ADDRESS}:18300"], acl_enabled=True,
        default_policy="deny", tokens={"agent": TOKENS["agent"], "config_file_service_registration": TOKENS["registration"]},
        check_update_interval=0)).start()
    ius = [IU(8000), IU(8001)]
    agent.finish_write(load_file_services(agent, [
        {"name": f"vllm-iu-{NODE}", "id": f"{NODE}-iu{n}", "port": 8000 + n,
         "checks": [{"id": f"vllm-iu:{NODE}-iu{n}:health", "http": f"http://{ADDRESS}:{8000 + n}/health", "interval": "1s"}]}
        for n in (0, 1)]))
    assert wait_until(lambda: edge_view(server) == [f"{NODE}-iu0", f"{NODE}-iu1"], 15), edge_view(server)
    yield server, agent, ius
    for iu in ius:
        iu.close()
    agent.stop(leave=False)
    server.stop()


def edge_view(server) -> list[str]:
    """The IUs an edge routes to: the servers' catalog, the edge's token, passing checks only."""
    answer = Api(server.address, TOKENS["edge"]).get(f"/v1/health/service/vllm-iu-{NODE}", params={"passing": "1"})
    return sorted(entry["Service"]["ID"] for entry in answer.json())


def node_maintenance(agent) -> str | None:
    checks = Api(agent.address, MANAGEMENT).get("/v1/agent/checks").json()
    return checks.get("_node_maintenance", {}).get("Notes")


def _run(tmp_path: Path, server, agent, between: list[dict] | None = None, agent_token: str = TOKENS["agent"],
         record_view: bool = True, **extra) -> subprocess.CompletedProcess:
    """node_drain.yml, a record of the edges' view at the moment the reboot would start (``record_view``),
    ``between`` (what the reboot does to the IUs), node_release.yml."""
    record = [
        {"name": "What the edges see when the reboot starts", "ansible.builtin.uri": {
            "url": f"http://{server.address}/v1/health/service/vllm-iu-{NODE}?passing=1",
            "headers": {"X-Consul-Token": TOKENS["edge"]}, "return_content": True}, "register": "view"},
        {"name": "Record it", "ansible.builtin.copy": {
            "dest": str(tmp_path / "view-at-reboot.json"), "content": "{{ view.json | map(attribute='Service.ID') | list | to_json }}",
            "mode": "0644"}},
    ] if record_view else []
    play = [{"hosts": NODE, "gather_facts": False, "tasks": [
        {"name": "Drain", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/node_drain.yml")},
        *record,
        *(between or []),
        {"name": "Release", "ansible.builtin.import_tasks": str(REPO / "playbooks/tasks/node_release.yml")},
    ]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    inventory = {"all": {"hosts": {NODE: {
        "ansible_connection": "local", "ansible_python_interpreter": sys.executable, "ansible_host": ADDRESS,
        "rack": "r01", "gpu_model": "h100-sxm", "gpu_count": 8, "iu_size": 4,
        "consul_http_addr": agent.address,
        "consul_agent_acl_agent_token": agent_token}}}}
    (tmp_path / "inventory.json").write_text(json.dumps(inventory))
    (tmp_path / "extra.json").write_text(json.dumps({"clusterctl_drain_poll_s": 1, **extra}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.json"),
                           str(tmp_path / "play.yml"), "-e", f"@{tmp_path / 'extra.json'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def test_the_edges_lose_the_node_before_the_reboot_and_get_it_back_after(tmp_path, cluster):
    server, agent, _ = cluster
    done = _run(tmp_path, server, agent)
    assert done.returncode == 0, done.stdout[-4000:]
    assert json.loads((tmp_path / "view-at-reboot.json").read_text()) == []
    assert node_maintenance(agent) is None
    assert wait_until(lambda: edge_view(server) == [f"{NODE}-iu0", f"{NODE}-iu1"], 10), edge_view(server)
    assert TOKENS["agent"] not in done.stdout + done.stderr


def test_an_iu_that_does_not_come_back_keeps_the_node_out_of_rotation(tmp_path, cluster):
    server, agent, _ = cluster
    check = f"vllm-iu:{NODE}-iu1:health"
    down = [{"name": "The reboot leaves iu1 failing", "ansible.builtin.uri": {"url": f"http://{ADDRESS}:8001/down"}},
            # as after a real reboot, where the agent starts the node's checks critical: the release must not
            # read the check's last passing result from before the fault (its interval is 1 s)
            {"name": "Wait until the agent holds iu1 critical", "register": "iu1",
             "ansible.builtin.uri": {"url": f"http://{agent.address}/v1/agent/checks",
                                     "headers": {"X-Consul-Token": MANAGEMENT}},
             "until": f"iu1.json['{check}'].Status == 'critical'", "retries": 50, "delay": 0.2}]
    done = _run(tmp_path, server, agent, down, clusterctl_release_timeout_s=4)
    assert done.returncode == 2, done.stdout[-4000:]
    assert (f"{NODE}: stays in Consul maintenance: {NODE}-iu1 did not pass their checks within 4 s of the reboot"
            in " ".join(done.stdout.split()))
    assert node_maintenance(agent) == "clusterctl reboot"
    assert edge_view(server) == []


def test_an_operators_node_maintenance_is_neither_taken_over_nor_cleared(tmp_path, cluster):
    server, agent, _ = cluster
    operator = Api(agent.address, MANAGEMENT)
    assert operator.put("/v1/agent/maintenance", params={"enable": "true", "reason": "quarantine: XID 79"}).status_code == 200
    done = _run(tmp_path, server, agent)
    assert done.returncode == 0, done.stdout[-4000:]
    assert node_maintenance(agent) == "quarantine: XID 79"


def test_a_token_that_may_not_set_maintenance_stops_the_host_before_the_reboot(tmp_path, cluster):
    server, agent, _ = cluster
    done = _run(tmp_path, server, agent, agent_token=TOKENS["edge"])
    assert done.returncode == 2, done.stdout[-4000:]
    assert "Put the node into Consul maintenance" in done.stdout
    assert not (tmp_path / "view-at-reboot.json").exists()
    assert node_maintenance(agent) is None and edge_view(server) == [f"{NODE}-iu0", f"{NODE}-iu1"]


def test_a_node_whose_agent_does_not_answer_has_nothing_to_drain(tmp_path):
    """A fresh host (no Consul yet) or an agent that is down, which the servers already see: nothing in rotation."""

    class Nowhere:
        address = f"{ADDRESS}:1"  # nothing listens there

    done = _run(tmp_path, Nowhere, Nowhere, record_view=False)
    assert done.returncode == 0, done.stdout[-4000:]
    for task in ("Put the node into Consul maintenance", "Take the node out of Consul maintenance"):
        assert "skipping" in done.stdout.split(f"TASK [{task}]", 1)[1].split("TASK [", 1)[0], task
