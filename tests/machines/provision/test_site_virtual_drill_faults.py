"""The drill's fault steps on provisioned virtual machines, over SSH as the deploy user through sudo (the
inventory's ansible_become), exactly as on real hosts: each fault changes the machine the way it should and its
undo puts it back. On test_site_virtual's cluster (the package's ``provisioned``: 3 nodes, 2 racks, the IUs
running the stand-in vLLM under systemd on the pinned driver), after that module: a cluster of its own cost CI
about four minutes. Every fault is on r01n01 and undone before the next."""

from __future__ import annotations

import time

import pytest

from cluster.ansible.inventory import cluster_of, load_inventory
from operate.drill import becomes
from operate.drill_faults import FaultStep, Target
from preflight.transport import RoutingTransport
from tests.helpers import wait_for
from tests.helpers.provision import VirtualCluster

pytestmark = [pytest.mark.machines(order=9), pytest.mark.timeout(600)]

HOST = "r01n01"
UNIT = "vllm-iu@0.service"


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
