"""The consul_agent role's restart handlers, run by ansible-playbook on three Consul servers: one server
at a time, and the next only once the restarted one reports a leader (a consul.hcl or package change never
takes a majority of a 3-server cluster down at once); a server that finds no leader stops the run before
the next one is touched.

Why not on the machines: devconsul (the consul stand-in on the virtual cluster) is one server that is its
own leader; it has no Raft and no replication between servers, so three server machines would be three
separate clusters (and the role's ACL setup and maintenance calls on the second and third would be refused).
Here the handlers file of the role runs unchanged (``import_tasks`` of roles/consul_agent/handlers/main.yml,
the real ``clusterctl.infra.consul_restart`` module) against three local hosts; what stands in is
``systemctl`` (a script on PATH that records each restart) and each server's ``/v1/status/leader`` (an HTTP
server that answers "" -- no leader -- until ``REJOIN_S`` after that server's restart, as a restarted Consul
server does until it has rejoined Raft and heard from the leader).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[4]
HANDLERS = REPO / "roles" / "consul_agent" / "handlers" / "main.yml"
SERVERS = ("srv1", "srv2", "srv3")
REJOIN_S = 1.0
OPERATOR = "5e3c1d2a-0b7f-4c8e-9a6d-3f2e1b0c9d8a"  # the operator token (operator:read) of this test's inventory

FAKE_SYSTEMCTL = """#!{python}
import json, os, sys, time
# Stands in for systemctl on the test's local hosts: records which host restarted what, and when.
with open({log!r}, "a") as out:
    out.write(json.dumps({{"host": os.environ["FAKE_CONSUL_HOST"], "argv": sys.argv[1:], "at": time.time()}}) + "\\n")
time.sleep(0.2)
"""

# The host's identity reaches the fake systemctl through the environment of the module's Python: every
# host of a local-connection run is this machine, so its interpreter is a wrapper per host.
INTERPRETER = """#!/bin/sh
export FAKE_CONSUL_HOST={host} PATH={bin}:$PATH
exec {python} "$@"
"""


class Leaders:
    """One ``/v1/status/leader`` per server: "" from its restart until REJOIN_S after, then the leader; and each
    server's agent API for node maintenance (``PUT /v1/agent/maintenance``, ``/v1/agent/checks``,
    ``/v1/health/node/:node``), which the reboot's drain uses."""

    def __init__(self, log: Path, never_rejoins: str = "", forming_s: float = 0.0):
        self.log, self.never_rejoins = log, never_rejoins
        self.forming_s = forming_s  # from the first health read on, autopilot answers 500 "No cluster leader"
        self.formed_at = 0.0
        self.refused_forming = 0
        self.first_leader_after_restart: dict[str, float] = {}
        self.maintenance: dict[str, str] = {}  # host -> reason: node maintenance set on its agent
        self.servers = {host: self._serve(host) for host in SERVERS}

    def node_checks(self, host: str) -> list[dict]:
        """The node's checks as Consul lists them: only node maintenance's ``_node_maintenance`` (these servers
        register no services), critical, its notes the reason."""
        if host not in self.maintenance:
            return []
        return [{"Node": host, "CheckID": "_node_maintenance", "Name": "Node Maintenance Mode", "Status": "critical",
                 "Notes": self.maintenance[host], "ServiceID": "", "ServiceName": ""}]

    def restarted_at(self, host: str) -> float | None:
        times = [e["at"] for e in _events(self.log) if e["host"] == host and "restart" in e["argv"]]
        return times[-1] if times else None

    def down(self, host: str, now: float) -> bool:
        restarted = self.restarted_at(host)
        return restarted is not None and (host == self.never_rejoins or now < restarted + REJOIN_S)

    def _serve(self, host: str) -> ThreadingHTTPServer:
        leaders = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
                now = time.time()
                if self.path == "/v1/operator/autopilot/health":
                    if self.headers.get("X-Consul-Token") != OPERATOR:
                        return self._answer(403, "Permission denied: token lacks permission 'operator:read'")
                    leaders.formed_at = leaders.formed_at or now + leaders.forming_s
                    if now < leaders.formed_at:
                        leaders.refused_forming += 1
                        return self._answer(500, "No cluster leader")
                    servers = [{"Name": h, "Healthy": not leaders.down(h, now), "Voter": True,
                                "SerfStatus": "alive", "Leader": h == "srv1"} for h in SERVERS]
                    return self._answer(200, {"Healthy": all(s["Healthy"] for s in servers),
                                              "FailureTolerance": 1, "Servers": servers})
                if self.path == "/v1/agent/checks":  # the agent's own checks, keyed by check ID
                    return self._answer(200, {c["CheckID"]: c for c in leaders.node_checks(host)})
                if self.path == f"/v1/health/node/{host}":
                    return self._answer(200, leaders.node_checks(host))
                if self.path != "/v1/status/leader":
                    return self._answer(404, "404 page not found")
                if leaders.restarted_at(host) is not None and not leaders.down(host, now):
                    leaders.first_leader_after_restart.setdefault(host, now)
                return self._answer(200, "" if leaders.down(host, now) else "127.0.0.1:8300")

            def do_PUT(self) -> None:  # noqa: N802 - BaseHTTPRequestHandler's name
                url = urlsplit(self.path)  # PUT /v1/agent/maintenance?enable=true|false&reason=...
                if url.path != "/v1/agent/maintenance":
                    return self._answer(404, "404 page not found")
                query = parse_qs(url.query)
                if query.get("enable") == ["true"]:
                    leaders.maintenance[host] = query.get("reason", ["Maintenance mode is enabled for this node"])[0]
                else:
                    leaders.maintenance.pop(host, None)
                return self._answer(200, "")

            def _answer(self, status: int, payload: object) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server

    def address(self, host: str) -> str:
        return f"127.0.0.1:{self.servers[host].server_address[1]}"

    def close(self) -> None:
        for server in self.servers.values():
            server.shutdown()
            server.server_close()


def ansible_playbook(inventory: Path, playbook: Path) -> subprocess.CompletedProcess:
    """``ansible-playbook -i inventory playbook`` with the repository's ansible.cfg (16 forks: the servers'
    hosts run side by side where a play lets them)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "ANSIBLE_FORKS": "16"}
    return subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(inventory),
                           str(playbook)], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def _events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


@pytest.fixture
def servers(tmp_path):
    made: list[Leaders] = []

    def run(never_rejoins: str = "", timeout_s: int = 10, forming_s: float = 0.0) -> tuple[
            subprocess.CompletedProcess, Leaders]:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir(exist_ok=True)
        log = tmp_path / "systemctl.jsonl"
        systemctl = bin_dir / "systemctl"
        systemctl.write_text(FAKE_SYSTEMCTL.format(python=sys.executable, log=str(log)))
        systemctl.chmod(0o755)
        leaders = Leaders(log, never_rejoins, forming_s)
        made.append(leaders)
        hosts = {}
        for host in SERVERS:
            wrapper = tmp_path / f"python-{host}"
            wrapper.write_text(INTERPRETER.format(host=host, bin=bin_dir, python=sys.executable))
            wrapper.chmod(0o755)
            hosts[host] = {"ansible_connection": "local", "ansible_python_interpreter": str(wrapper),
                           # the URL the role's first task sets from the cluster model (consul_scheme)
                           "_consul_agent_url": f"http://{leaders.address(host)}"}
        inventory = tmp_path / "hosts.json"
        inventory.write_text(json.dumps({"all": {"children": {"consul_servers": {"hosts": hosts}}, "vars": {
            "clusterctl_render_only": False, "consul_agent_server": True, "consul_agent_acl_enabled": True,
            "consul_agent_acl_operator_token": OPERATOR,
            "consul_agent_restart_timeout_s": timeout_s}}}))
        playbook = tmp_path / "restart.yml"
        playbook.write_text(
            "- hosts: all\n  gather_facts: false\n  tasks:\n"
            "    - name: A change that needs a restart (consul.hcl, TLS, package)\n"
            "      ansible.builtin.command: /bin/true\n      changed_when: true\n      notify: Restart consul\n"
            f"  handlers:\n    - ansible.builtin.import_tasks: {HANDLERS}\n")
        return ansible_playbook(inventory, playbook), leaders

    yield run
    for leaders in made:
        leaders.close()


def test_servers_restart_one_at_a_time_each_after_the_last_found_a_leader(servers):
    done, leaders = servers()
    assert done.returncode == 0, done.stdout[-3000:]
    restarts = sorted((leaders.restarted_at(h), h) for h in SERVERS)
    assert [h for _, h in restarts] and len(restarts) == 3 and all(t for t, _ in restarts), restarts
    for (_, previous), (started, host) in zip(restarts, restarts[1:], strict=False):
        # the next server goes down only after the previous one answered with a leader again
        assert started > leaders.first_leader_after_restart[previous], (previous, host, restarts,
                                                                           leaders.first_leader_after_restart)
    # ... so at no moment were two servers down: a 3-server cluster keeps its quorum throughout
    assert set(leaders.first_leader_after_restart) == set(SERVERS)
    assert OPERATOR not in done.stdout


def test_a_server_without_a_leader_stops_the_run_before_the_next_is_restarted(servers):
    done, leaders = servers(never_rejoins="srv2", timeout_s=3)
    assert done.returncode != 0
    out = " ".join(done.stdout.split())
    assert "consul.service restarted but no leader known within 3s" in out, done.stdout[-3000:]
    # ... and says what a new cluster needs (the three servers of this inventory's consul_servers)
    assert ("a new cluster elects its first leader only once all 3 servers (bootstrap_expect) run: is every host "
            "of consul_servers in this run, and up?") in out
    assert ("not restarting consul.service: the other Consul servers are not all healthy, a restart now could "
            "take the quorum down (unhealthy servers: srv2") in " ".join(done.stdout.split()), done.stdout[-3000:]
    restarted = {h for h in SERVERS if leaders.restarted_at(h) is not None}
    assert restarted == {"srv1", "srv2"}, restarted  # srv3 untouched: one server down, never two
    assert OPERATOR not in done.stdout


def test_a_cluster_still_forming_is_waited_for_not_refused(servers):
    """The role's first run starts every server and then restarts them (consul.hcl changed): autopilot has
    no leader to report for the first seconds (500 "No cluster leader"); the first restart waits for it."""
    done, leaders = servers(forming_s=2.5)
    assert done.returncode == 0, done.stdout[-3000:]
    assert leaders.refused_forming > 0
    assert min(leaders.restarted_at(h) for h in SERVERS) >= leaders.formed_at
