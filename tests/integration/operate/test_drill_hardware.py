"""The ``gpu_lost`` and ``ib_port_down`` drills for real on loopback: node n1 is this machine (``ansible_connection:
local``), its unit a simulated vLLM on 127.0.73.21 scored by the real agent reading its GPUs through the stand-in
nvidia-ml-py; the host's device tool (the machines' stub ``clusterctl-drill-device``) takes GPU 0 off the bus, or
n1's HCA ports down, in the files the stand-ins read (named by their environment variables, as /run/clusterctl-
sim on a machine). n2 and n3 serve beside it; the dev Consul agent (127.0.73.20) holds the units and the agents'
bodies, the real edge (127.0.73.29) in front. Measured: how long until Consul shows n1's unit critical (the
agent's verdict in its body: the engine's own HTTP check still passes) and the edge stops sending to it, and that
nothing else failed; with the fabric down, that nothing failed at all (a unit serves within its node)."""

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
from sim import nvml_standin
from sim.hosts import create, stubs
from sim.hosts.hardware import resolve
from sim.vllm.node import SimulatedNode
from sim.vllm.registration import IUService, register_iu_service, register_on_catalog_node
from tests.helpers import units, wait_for
from tests.helpers.edge import free_port
from tests.integration.operate.pool import (
    TRUE_PREFILL_TPS,
    drilled_nodes,
    node_agent,
    pushed_edge,
    sim_engines,
)

pytestmark = pytest.mark.integration

NODES, PORT = 3, 8000
MIX = {"name": "gpu-lost-test-mix", "classes": {"short": {
    "share": 1, "prompt_tokens": {"mean": 200, "sigma": 0.3}, "output_tokens": 24, "slo": {"ttft_p99_ms": 3000}}}}


def host(n: int) -> str:
    return f"127.0.73.{20 + n}"


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """(edge address, Consul address, inventory, n1's GPU file, n1's host state dir)."""
    _, inventory = drilled_nodes(tmp_path, monkeypatch, host, PORT, NODES)
    hosts = yaml.safe_load(inventory.read_text())
    # n1's InfiniBand ports, as its host state below has them: ib_port_down disables the inventory's rdma_nics
    hosts["all"]["hosts"]["n1"]["rdma_nics"] = [{k: nic[k] for k in ("device", "netdev", "link_layer")}
                                                for nic in create.nics("h100-sxm", False)]
    inventory.write_text(yaml.safe_dump(hosts))
    stubs.install(tmp_path / "stubs", sys.executable)  # n1's device tool, as a machine carries it
    monkeypatch.setenv("PATH", f"{tmp_path / 'stubs'}{os.pathsep}{os.environ['PATH']}")
    with ExitStack() as stack:
        server = stack.enter_context(DevConsulServer(addr=f"{host(0)}:0", node_name="n1"))
        io = ConsulIO(server.address)
        agent_port = free_port(host(1))
        sim_engines(stack, (f"{host(n)}:{PORT}" for n in range(1, NODES + 1)))
        run_dir = tmp_path / "n1-run"
        run_dir.mkdir()
        for n in range(1, NODES + 1):
            wait_for(lambda n=n: units.answers_health(f"{host(n)}:{PORT}"), 20, f"n{n}'s engine answering /health")
            node = SimulatedNode(f"n{n}", "r1", tmp_path / f"n{n}", rates=[0.0], consul_addr=server.address,
                                 host=host(n), warmup_s=0.0, seed=n)
            node.ius[0].server.server_close()
            node.ius = [types.SimpleNamespace(address=f"{host(n)}:{PORT}")]
            service = IUService(node.iu_id(0), node.name, node.rack, host(n), PORT, (0, 1, 2, 3), 0)
            if n == 1:
                register_iu_service(io, service)  # on n1's agent, with the engine's HTTP check
                gpu_file = node.gpu_file
                monkeypatch.setenv(nvml_standin.FILE_ENV, str(gpu_file))  # the host program's NVML file
                monkeypatch.setenv("CLUSTERCTL_SIM_RUN_DIR", str(run_dir))
                hw = resolve("n1", {"gpu_count": 4, "rdma_nics": create.nics("h100-sxm", False)})
                (run_dir / "host.json").write_text(json.dumps({"hardware": hw.to_json(), "address": host(1)}))
            else:
                register_on_catalog_node(io, service, host(n))
            stack.enter_context(node_agent(node, agent_port, TRUE_PREFILL_TPS))
        edge = pushed_edge(stack, host(9), server.address, agent_port, NODES, timeout_s=30)
        yield edge.address, server.address, inventory, gpu_file, run_dir


def run_drill(tmp_path, drill: dict, inventory, edge_address: str, consul: str, target: str, capsys):
    """(drill.json, exit code) of ``clusterctl drill`` with ``drill`` against ``target``; its tables printed."""
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(MIX))
    (tmp_path / "drill.yml").write_text(yaml.safe_dump(drill, sort_keys=False))
    try:
        main(["drill", str(tmp_path / "drill.yml"), "-i", str(inventory), "--endpoint", f"http://{edge_address}",
              "--target", target, "--consul", consul, "--out", str(tmp_path / "report"), "--json"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    with capsys.disabled():
        print(f"\n{(tmp_path / 'report' / 'drill.md').read_text()}")
    return json.loads((tmp_path / "report" / "drill.json").read_text()), code


def test_a_gpu_off_the_bus_goes_critical_in_consul_and_out_of_the_edges_rotation(pool, tmp_path, capsys):
    edge_address, consul, inventory, gpu_file, run_dir = pool
    files = {path: path.read_text() for path in (gpu_file, run_dir / "host.json")}
    drill = {"name": "test-gpu-lost", "load": {"mix": "mix.yml", "rate_per_s": 6, "duration_s": 18, "seed": 3,
                                               "timeout_s": 8},
             "faults": [{"kind": "gpu_lost", "at_s": 4, "hold_s": 8}],
             "checks": {"consul_critical_s_max": 15, "route_away_s_max": 5, "blast_radius_errors_max": 0,
                        "failed_not_streaming_max": 0}}
    result, code = run_drill(tmp_path, drill, inventory, edge_address, consul, "n1-iu0", capsys)
    fault = result["faults"][0]
    assert result["error"] is None and not result["interrupted"], result["events"]
    assert fault["kind"] == "gpu_lost" and fault["target"] == "n1-iu0"
    assert any("GPU 0 of vllm-iu@0.service off the bus" in e for e in result["events"]), result["events"]
    assert result["restored"] == ["n1-iu0: GPU 0 back on the bus (NVML answers it, its XID 79 lines gone)"]
    assert {path: json.loads(path.read_text()) for path in files} == {p: json.loads(t) for p, t in files.items()}
    assert fault["consul_critical_s"] is not None and fault["consul_critical_s"] <= 15, fault
    assert fault["route_away_s"] is not None and fault["route_away_s"] <= 5, fault
    assert fault["blast_radius_errors"] == 0 and fault["failed_not_streaming"] == 0, fault
    assert result["passed"] == (code == 0) and result["passed"], result


def test_the_nodes_fabric_down_fails_no_request_and_comes_back_as_it_was(pool, tmp_path, capsys):
    edge_address, consul, inventory, _, run_dir = pool
    before = json.loads((run_dir / "host.json").read_text())
    drill = {"name": "test-ib-port-down", "load": {"mix": "mix.yml", "rate_per_s": 6, "duration_s": 14, "seed": 4,
                                                   "timeout_s": 8},
             "faults": [{"kind": "ib_port_down", "at_s": 4, "hold_s": 6}],
             "checks": {"failed_not_streaming_max": 0, "blast_radius_errors_max": 0}}
    result, code = run_drill(tmp_path, drill, inventory, edge_address, consul, "n1", capsys)
    fault = result["faults"][0]
    assert result["error"] is None and fault["kind"] == "ib_port_down" and fault["target"] == "n1", result["events"]
    ports = [f"{h['device']} port 1" for h in before["hardware"]["hcas"]]
    assert any(f"n1: {', '.join(ports)} disabled (ibportstate: PhysLinkState Disabled)" in e
               for e in result["events"]), result["events"]
    assert result["restored"] == [f"n1: {port} enabled (was Active/LinkUp)" for port in reversed(ports)]
    assert json.loads((run_dir / "host.json").read_text()) == before
    assert fault["failed_not_streaming"] == 0 and fault["failed_streaming"] == 0 and fault["blast_radius_errors"] == 0
    assert fault["served_during_fault"] > 0  # the unit kept serving: its GPUs talk over NVLink, not the fabric
    assert result["passed"] and code == 0, result
