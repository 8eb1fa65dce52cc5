"""The ``edge_restart`` drill for real on loopback: the edge is a process (``python -m edge``, as its unit runs
it) under the ``systemctl`` stand-in as ``eas-edge.service`` on node n1, this machine (``ansible_connection:
local``), listening on 127.0.72.29; three simulated vLLM engines (127.0.72.21-23) scored by their in-process
agents behind it, the dev Consul on 127.0.72.20. The drill restarts the edge mid-load: systemd's SIGTERM, the
edge's drain (listener closed, ``drain_timeout_s`` for what is in flight), its start. Measured: requests in
flight at the restart all answered (the drain's promise), and how many were refused while it was down."""

from __future__ import annotations

import json
import sys
import types
import urllib.request
from contextlib import ExitStack

import pytest
import yaml

from cli.main import main
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from sim.vllm.node import SimulatedNode
from sim.vllm.registration import IUService, register_on_catalog_node
from tests.helpers import units, wait_for
from tests.helpers.edge import free_port
from tests.integration.operate.pool import TRUE_PREFILL_TPS, drilled_nodes, node_agent, sim_engines

pytestmark = pytest.mark.integration

NODES, PORT, EDGE_PORT = 3, 8000, 8080
EDGE = "eas-edge.service"
DRAIN_S = 5.0
MIX = {"name": "edge-test-mix", "classes": {"short": {
    "share": 1, "prompt_tokens": {"mean": 200, "sigma": 0.3}, "output_tokens": 48, "slo": {"ttft_p99_ms": 3000}}}}


def host(n: int) -> str:
    return f"127.0.72.{20 + n}"


def serves(address: str) -> bool:
    """The edge answers ``GET /v1/models`` (it listens and has its view of the units)."""
    try:
        with urllib.request.urlopen(f"http://{address}/v1/models", timeout=1) as answer:
            return answer.status == 200
    except OSError:
        return False


@pytest.fixture
def pool(tmp_path, monkeypatch):
    """(edge address, Consul address, units dir, inventory): the edge serving, every unit scored."""
    units_dir, inventory = drilled_nodes(tmp_path, monkeypatch, host, PORT, NODES)
    with ExitStack() as stack:
        server = stack.enter_context(DevConsulServer(addr=f"{host(0)}:0"))
        io = ConsulIO(server.address)
        stack.callback(units.stop_all, units_dir)
        agent_port = free_port(host(1))
        sim_engines(stack, (f"{host(n)}:{PORT}" for n in range(1, NODES + 1)))
        for n in range(1, NODES + 1):
            wait_for(lambda n=n: units.answers_health(f"{host(n)}:{PORT}"), 20, f"n{n}'s engine answering /health")
            node = SimulatedNode(f"n{n}", f"r{n}", tmp_path / f"n{n}", rates=[0.0], consul_addr=server.address,
                                 host=host(n), warmup_s=0.0, seed=n)
            node.ius[0].server.server_close()  # the in-process IU is replaced by the process on PORT
            node.ius = [types.SimpleNamespace(address=f"{host(n)}:{PORT}")]
            register_on_catalog_node(io, IUService(node.iu_id(0), node.name, node.rack, host(n), PORT, (0, 1, 2, 3),
                                                   0), host(n))
            stack.enter_context(node_agent(node, agent_port, TRUE_PREFILL_TPS))
        edge_address = f"{host(9)}:{EDGE_PORT}"
        config = tmp_path / "edge.yml"
        config.write_text(yaml.safe_dump({
            "listen": edge_address, "consul": {"address": server.address}, "admin_listen": f"{host(9)}:9180",
            "push": {"agent_port": agent_port, "wait_s": 2.0, "apply_interval_s": 0.02}, "queue_timeout_s": 5,
            "seed": 1, "debug_headers": True, "drain_timeout_s": DRAIN_S}))
        units.declare(units_dir, EDGE, [sys.executable, "-m", "edge", "--config", str(config)], tmp_path / "edge.log")
        units.start(units_dir, EDGE)
        wait_for(lambda: serves(edge_address), 30, "the edge answering /v1/models")
        yield edge_address, server.address, units_dir, inventory


def test_an_edge_restarted_mid_load_answers_every_request_it_had_in_flight(pool, tmp_path, capsys):
    edge_address, consul, units_dir, inventory = pool
    before = units.main_pid(units_dir, EDGE)
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(MIX))
    drill = {"name": "test-edge-restart", "load": {"mix": "mix.yml", "rate_per_s": 8, "duration_s": 16, "seed": 3,
                                                   "timeout_s": 10},
             "faults": [{"kind": "edge_restart", "at_s": 4, "hold_s": 8}],
             "checks": {"failed_in_flight_max": 0, "blast_radius_errors_max": 0}}
    (tmp_path / "drill.yml").write_text(yaml.safe_dump(drill, sort_keys=False))
    try:
        main(["drill", str(tmp_path / "drill.yml"), "-i", str(inventory), "--endpoint", f"http://{edge_address}",
              "--target", "n1", "--consul", consul, "--out", str(tmp_path / "report"), "--json"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    result = json.loads((tmp_path / "report" / "drill.json").read_text())
    fault = result["faults"][0]
    timeline = result["timeline"]
    refused = [t for t, n in zip(timeline["t"], timeline["failed"], strict=True) if n]
    with capsys.disabled():
        print(f"\n{(tmp_path / 'report' / 'drill.md').read_text()}\nrefused while the edge restarted: "
              f"{fault['failed_not_streaming']} requests sent in {refused[0] if refused else '-'}-"
              f"{refused[-1] + 1 if refused else '-'} s (restart at {fault['at_s']:.1f} s, drain_timeout_s {DRAIN_S:g})")
    after = units.main_pid(units_dir, EDGE)
    assert result["error"] is None and not result["interrupted"], result["events"]
    assert fault["kind"] == "edge_restart" and result["faulted_ius"] == []
    assert after and after != before  # really restarted: a new process answers
    assert serves(edge_address)
    # the drain's promise: every request in flight when the SIGTERM came was answered
    assert fault["failed_in_flight"] == 0 and fault["blast_radius_errors"] == 0, fault
    assert result["restored"] == [f"n1: {EDGE} started (a no-op once its restart finished)"]
    assert code == 0 and result["passed"], result["checks"]
