"""The drill's fault steps on provisioned virtual machines, over SSH as the deploy user through sudo (the
inventory's ansible_become), exactly as on real hosts: each fault changes the machine the way it should and its
undo puts it back. On test_site_virtual's cluster (the package's ``provisioned``: 3 nodes, 2 racks, the IUs
running the stand-in vLLM under systemd on the pinned driver), after that module: a cluster of its own cost CI
about four minutes. Every fault is on r01n01 and undone before the next.

r01n01 also runs an edge and HAProxy (127.0.1.5:8080) and the Consul server: the node hang freezes them with
its engines. The edge restart needs an edge HAProxy sends to, so that test starts every Consul agent and
releases every node first, as test_site_virtual_edges' first fixture does next."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from cluster.ansible.inventory import cluster_of, load_inventory
from cluster.edges import BALANCER_BACKEND, DEFAULT_STATS_SOCKET
from operate.drill import becomes
from operate.drill_faults import AGENT_UNIT, BALANCER_UNIT, CONSUL_UNIT, EDGE_UNIT, FaultStep, Target
from preflight.transport import RoutingTransport
from tests.helpers import wait_for
from tests.helpers.provision import VirtualCluster

pytestmark = [pytest.mark.machines(order=9), pytest.mark.timeout(600)]

HOST = "r01n01"
UNIT = "vllm-iu@0.service"
EDGE = "http://127.0.1.11:8080"  # r01n01's edge
BALANCER = "http://127.0.1.5:8080"  # HAProxy, on r01n01
CONSUL_SERVER = "http://127.0.1.11:8500"  # r01n01's agent is the server (consul_agent_server_hosts)


@pytest.fixture(scope="module")
def cluster(provisioned) -> VirtualCluster:
    return provisioned


@pytest.fixture(scope="module")
def target(cluster) -> Target:
    loaded = load_inventory(cluster.inventory)  # its vault values stay sealed: nothing here reads them
    node = cluster_of(loaded).node(HOST)
    assert becomes(loaded.selected[HOST])
    return Target(node, node.ius[0], become=True)


@pytest.fixture
def transport():
    routing = RoutingTransport()
    yield routing
    routing.close()


def main_pid(cluster, unit: str = UNIT) -> int:
    return int(cluster.on_host(HOST, "systemctl", "show", "--property", "MainPID", "--value", unit).stdout.strip() or 0)


def active(cluster, unit: str = UNIT) -> str:
    return cluster.on_host(HOST, "systemctl", "is-active", unit).stdout.strip()


def process_state(cluster, pid: int) -> str:
    return cluster.on_host(HOST, "cat", f"/proc/{pid}/stat").stdout.rsplit(")", 1)[1].split()[0]


def test_engine_stall_freezes_the_main_pid_and_the_undo_wakes_it(cluster, target, transport):
    pid = main_pid(cluster)
    step = FaultStep("engine_stall", target, transport)
    step.inject()
    try:
        assert process_state(cluster, pid) == "T"
    finally:
        assert step.undo() == [f"{HOST}-iu0: SIGCONT to PID {pid}"]
    assert process_state(cluster, pid) != "T" and main_pid(cluster) == pid


def test_engine_crash_kills_the_main_pid_and_systemd_or_the_undo_brings_a_new_one(cluster, target, transport):
    pid = main_pid(cluster)
    step = FaultStep("engine_crash", target, transport)
    step.inject()
    restored = step.undo()
    assert restored == [f"{HOST}-iu0: {UNIT} started (a no-op when systemd restarted it)"]
    new = wait_for(lambda: main_pid(cluster), 60, "the unit running again")
    assert new != pid and active(cluster) == "active"


def test_graceful_stop_is_a_clean_stop_systemd_leaves_stopped(cluster, target, transport):
    step = FaultStep("graceful_stop", target, transport)
    step.inject()
    try:
        wait_for(lambda: active(cluster) == "inactive", 60, "the unit stopped cleanly (not failed, not restarted)")
        time.sleep(12)  # past RestartSec=10: Restart=on-failure does not restart a clean stop
        assert active(cluster) == "inactive"
    finally:
        step.undo()
    wait_for(lambda: active(cluster) == "active", 60, "the unit started by the undo")


def test_weights_missing_makes_vllm_exit_with_its_error_and_the_undo_serves_again(cluster, target, transport):
    step = FaultStep("weights_missing", target, transport)
    step.inject()
    try:
        wait_for(lambda: active(cluster) != "active", 60, "vLLM exiting without its weights")
        journal = cluster.on_host(HOST, "journalctl", "-u", UNIT, "-n", "50", "--no-pager").stdout
        assert "RuntimeError: Cannot find any model weights with" in journal, journal[-2000:]
    finally:
        restored = step.undo()
    assert [line.split(": ", 1)[1].split(" to ")[0] for line in restored] == [
        "1 weight files moved back", f"{UNIT} restarted with its weights"]
    wait_for(lambda: active(cluster) == "active", 60, "the unit serving again")


def test_consul_agent_down_stops_the_agent_and_the_undo_starts_it(cluster, target, transport):
    node_target = Target(target.node, become=True)
    step = FaultStep("consul_agent_down", node_target, transport)
    step.inject()
    try:
        assert active(cluster, "consul.service") == "inactive"
    finally:
        assert step.undo() == [f"{HOST}: consul.service started"]
    wait_for(lambda: active(cluster, "consul.service") == "active", 60, "the Consul agent running again")


def answer(url: str, timeout_s: float = 3.0) -> str:
    """'answered' (any HTTP status), 'timed out' (connected or not, no answer) or why the connection failed."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s):
            return "answered"
    except urllib.error.HTTPError:
        return "answered"
    except TimeoutError:
        return "timed out"
    except urllib.error.URLError as exc:
        return "timed out" if isinstance(exc.reason, TimeoutError) else str(exc.reason)


def answers(urls: list[str]) -> dict[str, str]:
    with ThreadPoolExecutor(len(urls)) as pool:  # one timeout for all, not one each
        return dict(zip(urls, pool.map(answer, urls), strict=True))


SUSPENDED = r"""for unit in "$@"; do
  group=$(systemctl show -p ControlGroup --value "$unit")
  procs=$(cat "/sys/fs/cgroup/systemd$group/cgroup.procs" 2>/dev/null || cat "/sys/fs/cgroup$group/cgroup.procs")
  echo "$unit|$(systemctl show -p FreezerState --value "$unit")|$(for p in $procs; do ps -o stat= -p "$p"; done | cut -c1 | sort -u | tr -d '\n')"
done"""


def suspended(cluster, units: list[str]) -> dict[str, str]:
    """unit -> 'suspended' (systemd's freezer has it frozen, or every process of its cgroup is stopped: the
    SIGSTOP where the host has no freezer), 'running' (not frozen, none stopped), else what was seen."""
    seen = {}
    for line in cluster.on_host(HOST, "sh", "-c", SUSPENDED, "sh", *units).stdout.splitlines():
        unit, freezer, states = line.split("|")
        if freezer == "frozen" or states == "T":
            seen[unit] = "suspended"
        elif freezer in ("running", "") and states and "T" not in states:
            seen[unit] = "running"
        else:
            seen[unit] = f"freezer {freezer!r}, process states {states!r}"
    return seen


def test_node_hang_freezes_every_serving_process_and_the_undo_thaws_them(cluster, target, transport):
    node = target.node
    engines = [f"vllm-iu@{iu.index}.service" for iu in node.ius]
    units = [*engines, EDGE_UNIT, BALANCER_UNIT, AGENT_UNIT, CONSUL_UNIT]
    pids = {unit: main_pid(cluster, unit) for unit in units}
    assert all(pids.values()), pids  # every serving unit of r01n01 runs: each is a part of the hang
    served = [*(f"http://{node.address}:{iu.port}/health" for iu in node.ius), f"{EDGE}/healthz",
              f"{BALANCER}/healthz", f"{CONSUL_SERVER}/v1/status/leader"]
    assert set(answers(served).values()) == {"answered"}, answers(served)
    step = FaultStep("node_hang", Target(node, become=True), transport)
    step.inject()
    try:
        held = suspended(cluster, units)
        hung = answers(served)
    finally:
        restored = step.undo()
    assert held == dict.fromkeys(units, "suspended"), (held, step.done)
    assert hung == dict.fromkeys(served, "timed out"), hung  # connections hang: not refused, not answered
    assert [line.split(": ", 1)[1].split()[0] for line in restored] == list(reversed(units)), restored
    assert not [line for line in restored if "NOT restored" in line], restored
    assert suspended(cluster, units) == dict.fromkeys(units, "running")
    wait_for(lambda: set(answers(served).values()) == {"answered"}, 60, "every service of r01n01 answering again")
    assert {unit: main_pid(cluster, unit) for unit in units} == pids  # suspended, not replaced


def balancer_state(cluster) -> str:
    """HAProxy's srv_op_state of r01n01's edge (2: running, in rotation), from its stats socket."""
    ask = (f"import socket; s = socket.socket(socket.AF_UNIX); s.connect({DEFAULT_STATS_SOCKET!r}); "
           f"s.sendall(b'show servers state {BALANCER_BACKEND}\\n'); print(s.makefile().read())")
    lines = cluster.on_host(HOST, "python3", "-c", ask).stdout.splitlines()
    header = next(line.lstrip("#").split() for line in lines if line.startswith("#"))
    rows = [dict(zip(header, line.split(), strict=False)) for line in lines[1:] if line and line[0].isdigit()]
    return next(row["srv_op_state"] for row in rows if row["srv_name"] == HOST)


def test_edge_restart_restarts_the_edge_and_haproxy_takes_it_back(cluster, target, transport):
    wait_for(cluster.release_every_node, 60, "every Consul agent running and every node released")
    wait_for(lambda: balancer_state(cluster) == "2", 60, "HAProxy sending to r01n01's edge")
    pid = main_pid(cluster, EDGE_UNIT)
    step = FaultStep("edge_restart", Target(target.node, become=True), transport)
    step.inject()
    try:
        new = wait_for(lambda: main_pid(cluster, EDGE_UNIT) not in (0, pid) and main_pid(cluster, EDGE_UNIT), 60,
                       "the edge running again under a new PID")
    finally:
        restored = step.undo()
    assert restored == [f"{HOST}: {EDGE_UNIT} started (a no-op once its restart finished)"]
    wait_for(lambda: balancer_state(cluster) == "2", 60, "HAProxy sending to r01n01's edge again")
    with urllib.request.urlopen(f"{EDGE}/healthz", timeout=10) as healthz:
        assert json.load(healthz)["status"] == "ok"
    assert main_pid(cluster, EDGE_UNIT) == new and active(cluster, EDGE_UNIT) == "active"
