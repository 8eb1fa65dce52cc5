"""The ``node_hang`` drill for real on loopback: node n1 is this machine (``ansible_connection: local``), and
every serving process of it runs under the ``systemctl`` stand-in (tests/helpers/units.py), so the drill's
``systemctl freeze`` suspends them: its engine (a simulated vLLM on 127.0.72.11) and its agent (``eas-agent
run``, as the role's unit runs it, scoring the engine and pushing to the edge). n1's unit is registered on the
dev Consul agent (127.0.72.10) with its 1 s HTTP check, which the agent runs as a node's Consul agent would, so
Consul's view of the hang is the check timing out. n2 and n3 serve beside it, scored by in-process agents; the
real edge (127.0.72.19) in front. Measured: how long until Consul shows n1's unit critical and the edge stops
sending to it (the library drill's bounds: 15 s and 5 s), and that nothing else failed."""

from __future__ import annotations

import json
import os
import sys
import types
from contextlib import ExitStack

import pytest
import yaml

from cli.main import main
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from sim.nvml_standin import FILE_ENV, STANDIN_DIR
from sim.vllm.node import SimulatedNode
from sim.vllm.registration import IUService, register_iu_service, register_on_catalog_node
from tests.helpers import units, wait_for
from tests.helpers.edge import free_port
from tests.integration.operate.pool import (
    FAST,
    TRUE_PREFILL_TPS,
    drilled_nodes,
    node_agent,
    pushed_edge,
    sim_engines,
)

pytestmark = pytest.mark.integration

NODES, PORT = 3, 8000
ENGINE, AGENT = "vllm-iu@0.service", "eas-agent.service"
MIX = {"name": "hang-test-mix", "classes": {"short": {
    "share": 1, "prompt_tokens": {"mean": 200, "sigma": 0.3}, "output_tokens": 24, "slo": {"ttft_p99_ms": 3000}}}}


def host(n: int) -> str:
    return f"127.0.72.{10 + n}"


def simulated(tmp_path, n: int, consul: str) -> SimulatedNode:
    """Node n's simulation (its GPU file and agent config), its IU the process on PORT."""
    node = SimulatedNode(f"n{n}", "r1", tmp_path, rates=[0.0], consul_addr=consul, host=host(n), warmup_s=0.0, seed=n)
    node.ius[0].server.server_close()
    node.ius = [types.SimpleNamespace(address=f"{host(n)}:{PORT}")]
    return node


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """(edge address, Consul address, units dir, inventory): every unit scored at the edge."""
    units_dir, inventory = drilled_nodes(tmp_path, monkeypatch, host, PORT, NODES)
    with ExitStack() as stack:
        server = stack.enter_context(DevConsulServer(addr=f"{host(0)}:0", node_name="n1"))
        io = ConsulIO(server.address)
        stack.callback(units.stop_all, units_dir)
        agent_port = free_port(host(1))
        units.declare(units_dir, ENGINE, units.sim_vllm_argv(f"{host(1)}:{PORT}"), tmp_path / "n1-iu0.log")
        units.start(units_dir, ENGINE)
        sim_engines(stack, (f"{host(n)}:{PORT}" for n in range(2, NODES + 1)))
        for n in range(1, NODES + 1):
            wait_for(lambda n=n: units.answers_health(f"{host(n)}:{PORT}"), 20, f"n{n}'s engine answering /health")
            node = simulated(tmp_path / f"n{n}", n, server.address)
            service = IUService(node.iu_id(0), node.name, node.rack, host(n), PORT, (0, 1, 2, 3), 0)
            if n == 1:
                register_iu_service(io, service)  # on n1's agent, with the HTTP check it runs
                node.write_config(listen=f"{host(1)}:{agent_port}", **FAST)
                units.declare(units_dir, AGENT, ["env", f"PYTHONPATH={STANDIN_DIR}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
                                                 f"{FILE_ENV}={node.gpu_file}", sys.executable, "-m", "eas_agent.main",
                                                 "run", "--config", str(node.config_path)], tmp_path / "n1-agent.log")
                units.start(units_dir, AGENT)
            else:
                register_on_catalog_node(io, service, host(n))
                stack.enter_context(node_agent(node, agent_port, TRUE_PREFILL_TPS))
        edge = pushed_edge(stack, host(9), server.address, agent_port, NODES, timeout_s=30)
        yield edge.address, server.address, units_dir, inventory


def state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0]


def test_a_hung_node_goes_critical_in_consul_and_out_of_the_edges_rotation(pool, tmp_path, capsys):
    edge_address, consul, units_dir, inventory = pool
    pids = {unit: units.main_pid(units_dir, unit) for unit in (ENGINE, AGENT)}
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(MIX))
    drill = {"name": "test-node-hang", "load": {"mix": "mix.yml", "rate_per_s": 6, "duration_s": 18, "seed": 3,
                                                "timeout_s": 8},
             "faults": [{"kind": "node_hang", "at_s": 4, "hold_s": 8}],
             "checks": {"consul_critical_s_max": 15, "route_away_s_max": 5, "blast_radius_errors_max": 0}}
    (tmp_path / "drill.yml").write_text(yaml.safe_dump(drill, sort_keys=False))
    try:
        main(["drill", str(tmp_path / "drill.yml"), "-i", str(inventory), "--endpoint", f"http://{edge_address}",
              "--target", "n1", "--consul", consul, "--out", str(tmp_path / "report"), "--json"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    result = json.loads((tmp_path / "report" / "drill.json").read_text())
    fault = result["faults"][0]
    with capsys.disabled():
        print(f"\n{(tmp_path / 'report' / 'drill.md').read_text()}")
    assert result["error"] is None and not result["interrupted"], result["events"]
    assert fault["kind"] == "node_hang" and fault["target"] == "n1"
    frozen = next(e for e in result["events"] if "node_hang on n1" in e)
    assert f"{ENGINE} frozen" in frozen and f"{AGENT} frozen" in frozen, frozen
    assert result["restored"] == [f"n1: {AGENT} thawed", f"n1: {ENGINE} thawed"]
    # both processes were suspended, not replaced, and run again after the undo
    assert {unit: units.main_pid(units_dir, unit) for unit in pids} == pids
    assert all(state(pid) != "T" for pid in pids.values())
    assert fault["consul_critical_s"] is not None and fault["consul_critical_s"] <= 15, fault
    assert fault["route_away_s"] is not None and fault["route_away_s"] <= 5, fault
    assert fault["blast_radius_errors"] == 0, fault
    assert result["passed"] == (code == 0)
