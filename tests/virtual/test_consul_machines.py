"""Consul agents on the machines: the consul stand-in package installed on every machine, the consul_agent role
run for real (live actions) over SSH, consul.service joined to the server with ACLs on (default deny), gossip
key and TLS as rendered. Package installs through apt are the next issue's; here the .deb the local
repository serves is installed with dpkg, which is the same package."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

from sim.aptrepo import catalog
from sim.aptrepo.deb import build_deb
from sim.aptrepo.repo import consul_standin_files
from tests.devconsul.contract import wait_until
from tests.virtual.conftest import needs_root, run_on

REPO = Path(__file__).resolve().parents[2]
pytestmark = needs_root


def _get(address: str, path: str, token: str):
    request = urllib.request.Request(f"http://{address}{path}", headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=10) as resp:
        return json.loads(resp.read() or b"null")


def _status(address: str, path: str, token: str, method: str = "PUT") -> int:
    request = urllib.request.Request(f"http://{address}{path}", method=method, headers={"X-Consul-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_agents_join_the_server_and_every_iu_waits_in_maintenance(up_inventory, tmp_path):
    inventory = up_inventory(3, 2, faults="none")
    group_vars = inventory / "group_vars" / "all.yml"
    # every agent listens on its machine's own address (machines share this network namespace)
    group_vars.write_text(group_vars.read_text() + "\nconsul_http_addr: \"{{ ansible_host }}:8500\"\n"
                          "clusterctl_live_actions: true\n")
    secrets = yaml.safe_load(group_vars.read_text())
    management, operator = secrets["consul_agent_acl_management_token"], secrets["consul_token"]
    deb = build_deb(catalog.hashicorp_packages(consul_standin_files())[0], tmp_path)
    hosts = ["r01n01", "r01n02", "r02n01"]
    for host in hosts:
        copy = subprocess.run([*_ssh(inventory, host, "tee", "/tmp/consul.deb")], input=deb.read_bytes(),
                              capture_output=True, timeout=60)
        assert copy.returncode == 0, copy.stderr
        installed = run_on(inventory, host, "sh", "-c", "dpkg -i /tmp/consul.deb && systemctl daemon-reload")
        assert installed.returncode == 0, installed.stdout + installed.stderr
    done = subprocess.run([sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--tags",
                           "consul_agent", "--run-dir", str(tmp_path / "run")], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:]
    assert management not in done.stdout and operator not in done.stdout
    server = "127.0.1.11:8500"

    def in_maintenance() -> dict[str, bool]:
        entries = _get(server, "/v1/health/service/vllm-iu", management)
        return {e["Service"]["ID"]: any(c["CheckID"].startswith("_service_maintenance:") for c in e["Checks"])
                for e in entries}

    wanted = {f"{h}-iu{n}" for h in hosts for n in (0, 1)}
    seen = wait_until(lambda: set(in_maintenance()) == wanted and all(in_maintenance().values()), 40)
    assert seen, in_maintenance()
    nodes = {n["Node"] for n in _get(server, "/v1/catalog/nodes", management)}
    assert nodes == set(hosts)
    # ACL denial: the node's agent token may not set maintenance; anonymous reads see nothing
    agent_token = run_on(inventory, "r01n02", "sh", "-c", "grep -o 'agent = \"[^\"]*' /etc/consul.d/consul.hcl")
    token = agent_token.stdout.strip().rsplit('"', 1)[-1]
    assert token and _status("127.0.1.12:8500", "/v1/agent/service/maintenance/r01n02-iu0?enable=false", token) == 403
    assert _get(server, "/v1/health/service/vllm-iu", "") == []
    # a second run changes nothing in Consul: still every IU held, none released
    again = subprocess.run([sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--tags",
                            "consul_agent", "--run-dir", str(tmp_path / "run2")], cwd=REPO, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(in_maintenance().values())
    # stop a node's agent: leave_on_terminate is false, so the server fails it (serfHealth critical)
    assert run_on(inventory, "r02n01", "systemctl", "stop", "consul.service").returncode == 0
    started = time.monotonic()

    def serf_of(node: str) -> str:
        for check in _get(server, f"/v1/health/node/{node}", management):
            if check["CheckID"] == "serfHealth":
                return check["Status"]
        return "missing"

    assert wait_until(lambda: serf_of("r02n01") == "critical", 15), serf_of("r02n01")
    assert time.monotonic() - started < 15
    assert serf_of("r01n02") == "passing"


def _ssh(inventory: Path, host: str, *argv: str) -> list[str]:
    from sim.hosts import simulate

    return simulate.ssh_argv(inventory, host, *argv)
