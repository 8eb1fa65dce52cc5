"""Consul agents on the machines: the consul_agent, eas_agent and inference_unit roles run for real over SSH
(consul from the stand-in HashiCorp repository through the role's apt path, the agent's and vLLM's venvs
from the local package index, their units started), consul.service joined to the server with ACLs on
(default deny), gossip key and TLS as rendered.

One cluster, the issue's machine tests in order (a bring-up costs minutes): every IU in the catalog and in
maintenance; ACL denials; a second run releases nothing; an agent restart and a reload keep maintenance;
rolling-restart.yml takes a released IU out of rotation and back while an operator's quarantine and another
node's preflight hold stay untouched;
preflight's release (preflight/release.py) makes a node's IUs routable in the edge's reader
(eas_agent.scheduler's ConsulWatcher + PoolView, with the read-only edge token); stopping the IUs' vLLM
units makes their checks critical within the check interval and the reader drops them; stopping the node's
consul.service makes the server fail the node (serfHealth) and its IUs leave the pool."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

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


# One bring-up for the whole sequence: provisioning three roles with their packages (~3-4 min on 2 cores) and a
# rolling restart (~2 min) alone passed the suite's 300 s default on a loaded machine.
@pytest.mark.timeout(1500)
def test_agents_join_the_server_and_every_iu_waits_in_maintenance(up_inventory, tmp_path):
    inventory = up_inventory(3, 2, faults="none")
    group_vars = inventory / "group_vars" / "all.yml"
    secrets = yaml.safe_load(group_vars.read_text())
    management, operator = secrets["consul_agent_acl_management_token"], secrets["consul_token"]
    token_file = tmp_path / "consul.token"  # the token rule's file half, for preflight's release below
    token_file.write_text(operator + "\n")
    token_file.chmod(0o600)
    group_vars.write_text(group_vars.read_text().replace(f"consul_token: {operator}\n", "")
                          + f"\nconsul_token_file: {token_file}\n")
    hosts = ["r01n01", "r01n02", "r02n01"]
    # The roles this test needs, not all of site.yml (each role costs its package installs).
    done = subprocess.run([sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--tags",
                           "consul_agent,eas_agent,inference_unit", "--run-dir", str(tmp_path / "run")], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
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
    # a token nobody created is refused outright, on the node's agent as on the server
    assert _status("127.0.1.12:8500", "/v1/agent/services", "00000000-dead-4bad-8bad-000000000000", "GET") == 403
    # restart and reload of an agent keep its IUs in maintenance (no reaping, maintenance persisted)
    for action in ("restart", "reload"):
        assert run_on(inventory, "r01n02", "systemctl", action, "consul.service").returncode == 0
        time.sleep(2)
        assert wait_until(lambda: set(in_maintenance()) == wanted, 30), in_maintenance()
        assert all(in_maintenance().values()), (action, in_maintenance())
    # a second run changes nothing in Consul: still every IU held, none released
    again = subprocess.run([sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--tags",
                            "consul_agent", "--run-dir", str(tmp_path / "run2")], cwd=REPO, capture_output=True,
                           text=True, timeout=900)
    assert again.returncode == 0, again.stdout[-4000:]
    assert all(in_maintenance().values())
    _rolling_restart_keeps_an_operator_quarantine(inventory, tmp_path, server, operator, management)
    _released_iu_routes_then_dies(inventory, server, secrets["consul_edge_token"], in_maintenance)
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
    assert serf_of("r01n01") == "passing"


def _maintenance_notes(server: str, token: str, index: int = 0, wait: str = "") -> tuple[int, dict[str, str]]:
    """(X-Consul-Index, IU -> its maintenance reason, "" when not in maintenance) from the server's health."""
    query = f"?index={index}&wait={wait}" if index else ""
    request = urllib.request.Request(f"http://{server}/v1/health/service/vllm-iu{query}",
                                     headers={"X-Consul-Token": token})
    with urllib.request.urlopen(request, timeout=30) as resp:
        entries, got = json.loads(resp.read()), int(resp.headers["X-Consul-Index"])
    return got, {e["Service"]["ID"]: next((c["Notes"] for c in e["Checks"]
                                           if c["CheckID"].startswith("_service_maintenance:")), "")
                 for e in entries}


def _rolling_restart_keeps_an_operator_quarantine(inventory: Path, tmp_path: Path, server: str, operator: str,
                                                  management: str) -> None:
    """rolling-restart.yml over r01n01 and r01n02 with their agents live (review finding #13 on the
    machines): r01n01 released by preflight, then one of its IUs quarantined by an operator (maintenance
    with the operator's reason, through the node's agent); r01n02 still held for preflight. The run takes
    r01n01's other IU out of rotation and puts it back, and leaves the quarantine and r01n02's preflight hold
    exactly as they were. Every maintenance state the server saw during the run is recorded (blocking
    queries), so "put into maintenance and released" is observed, not inferred from the end state; the
    playbook restarts the IUs' vllm-iu units and waits for their /health in between."""
    import threading

    from cluster import load_cluster
    from preflight.release import release_passed
    from preflight.result import CheckResult, Verdict
    from preflight.runner import RunOutcome

    node = load_cluster(inventory).node("r01n01")
    free, quarantined = (iu.id for iu in node.ius)
    held = {f"r01n02-iu{n}" for n in (0, 1)}
    passed = CheckResult(node.rack, node.name, None, "consul", Verdict.PASS, "stand-in for a passed run", {})
    assert sorted(release_passed([node], RunOutcome([passed], 0.0, 0.0, None, ["consul"]))["r01n01"]) == [
        free, quarantined]
    reason = "operator quarantine: flaky HCA"
    path = f"/v1/agent/service/maintenance/{quarantined}?enable=true&reason=operator%20quarantine%3A%20flaky%20HCA"
    assert _status(f"{node.address}:8500", path, operator) == 200
    assert wait_until(lambda: [_maintenance_notes(server, management)[1].get(i) for i in (free, quarantined)]
                      == ["", reason], 10), _maintenance_notes(server, management)
    index, before = _maintenance_notes(server, management)
    assert all(before[i] for i in held), before
    seen: set[tuple[str, str]] = set()
    stop = threading.Event()

    def watch() -> None:
        at = index
        while not stop.is_set():
            at, notes = _maintenance_notes(server, management, at, "2s")
            seen.update(notes.items())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # The stand-in vLLM's own arrivals never drain (no edge stops sending here): bound the wait per IU
    # (120 s by default), as an inventory can.
    group_vars = inventory / "group_vars" / "all.yml"
    group_vars.write_text(group_vars.read_text() + "\nrolling_restart_drain_timeout_s: 10\n")
    try:
        done = subprocess.run([sys.executable, "-m", "cli.main", "provision", "-i", str(inventory), "--playbook",
                               "rolling-restart.yml", "--limit", "r01n01,r01n02", "--run-dir",
                               str(tmp_path / "rolling")], cwd=REPO, capture_output=True, text=True, timeout=600)
        time.sleep(1)  # the last release's sync reaches the server and the watch
    finally:
        stop.set()
        watcher.join(5)
    assert done.returncode == 0, done.stdout[-4000:]
    assert operator not in done.stdout and management not in done.stdout
    assert (free, "clusterctl rolling restart") in seen, sorted(seen)
    after = _maintenance_notes(server, management)[1]
    assert after[free] == "" and after[quarantined] == reason, after
    assert {i: after[i] for i in held} == {i: before[i] for i in held}, "the preflight hold stays"
    assert {n for i, n in seen if i == quarantined} == {reason}, "the quarantine never touched"
    assert {n for i, n in seen if i in held} == {before[i] for i in held}, "r01n02 never taken by the run"


def _released_iu_routes_then_dies(inventory: Path, server: str, edge_token: str, in_maintenance) -> None:
    from cluster import load_cluster
    from consul_io.client import ConsulIO
    from eas_agent.scheduler import ConsulWatcher, PoolView
    from preflight.release import release_passed
    from preflight.result import CheckResult, Verdict
    from preflight.runner import RunOutcome

    node = load_cluster(inventory).node("r01n02")
    ius = sorted(iu.id for iu in node.ius)
    units = [f"vllm-iu@{iu.index}.service" for iu in node.ius]  # started by provisioning, as eas-agent.service
    view = PoolView()
    watcher = ConsulWatcher(view, ConsulIO(server, token=edge_token), wait_s=1.0).start()
    try:
        passed = CheckResult(node.rack, node.name, None, "consul", Verdict.PASS, "stand-in for a passed run", {})
        released = release_passed([node], RunOutcome([passed], 0.0, 0.0, None, ["consul"]))
        assert sorted(released["r01n02"]) == ius
        assert wait_until(lambda: not any(v for k, v in in_maintenance().items() if k in ius), 10), in_maintenance()

        def healthy() -> list[str]:  # this node's routable IUs (r01n01's free IU is routable since its release)
            return sorted(e.iu_id for e in view.snapshot().healthy if e.iu_id in ius)

        assert wait_until(lambda: healthy() == ius, 40), (healthy(), view.health)
        assert run_on(inventory, node.name, "systemctl", "stop", *units).returncode == 0  # the IUs' vLLM stops
        died = time.monotonic()
        assert wait_until(lambda: healthy() == [], 20), healthy()
        # the check interval is 10 s, its timeout 2 s; the server sees the change at once (anti-entropy
        # pushes every change) and the watch returns on it
        assert time.monotonic() - died < 14, time.monotonic() - died
        assert {view.health[i][0] for i in ius} == {"critical"}, view.health
        assert run_on(inventory, node.name, "systemctl", "start", *units).returncode == 0
        assert wait_until(lambda: healthy() == ius, 40), healthy()
        # the node's agent stops: leave_on_terminate is false, the server fails the node (serfHealth
        # critical, Consul's failure detection) and every IU of it leaves the pool with it
        assert run_on(inventory, "r01n02", "systemctl", "stop", "consul.service").returncode == 0
        stopped = time.monotonic()
        assert wait_until(lambda: healthy() == [], 20), healthy()
        assert time.monotonic() - stopped < 20
    finally:
        watcher.stop()
