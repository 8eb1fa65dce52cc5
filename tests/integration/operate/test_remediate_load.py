"""``clusterctl remediate`` under load through the real edge: n1's unit is serving when the ladder restarts it
(an XID the catalog answers with a restart of the application), so what clients see is the drain's doing.
Three nodes' simulated vLLM processes on 127.0.73.N, each scored by the real agent, the dev Consul on
127.0.73.1 as n1's agent (n1's unit is registered on it, so maintenance goes through the agent API), the edge
on 127.0.73.10; n1 is this machine (``ansible_connection: local``) with the ``systemctl`` stand-in. The measured
line is printed."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import types
from contextlib import ExitStack

import pytest
import yaml

from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from operate.loadgen import Generator, plan
from operate.scenario import load_scenario
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
from tests.integration.operate.test_remediate import PORT, UNIT, host, main_code

pytestmark = pytest.mark.integration

MIX = {"name": "remediate-test-mix", "classes": {"short": {
    "share": 1, "prompt_tokens": {"mean": 200, "sigma": 0.3}, "output_tokens": 24, "slo": {"ttft_p99_ms": 3000}}}}
RATE, LOAD_S, REMEDIATE_AT_S = 6.0, 14.0, 3.0


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(edge address, Consul address, units dir, inventory): n1's unit serving, every unit scored."""
    units_dir, inventory = drilled_nodes(tmp_path, monkeypatch, host, PORT, 3)
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(MIX))
    with ExitStack() as stack:
        server = stack.enter_context(DevConsulServer(addr=f"{host(0)}:0", node_name="n1"))
        io = ConsulIO(server.address)
        stack.callback(units.stop_all, units_dir)
        units.declare(units_dir, UNIT, units.sim_vllm_argv(f"{host(1)}:{PORT}"), tmp_path / "n1-iu0.log")
        units.start(units_dir, UNIT)
        sim_engines(stack, (f"{host(n)}:{PORT}" for n in (2, 3)))
        agent_port = free_port(host(1))
        for n in (1, 2, 3):
            wait_for(lambda n=n: units.answers_health(f"{host(n)}:{PORT}"), 20, f"n{n}'s simulated vLLM answering /health")
            service = IUService(f"n{n}-iu0", f"n{n}", f"r{n}", host(n), PORT, (0, 1, 2, 3), 0)
            if n == 1:
                register_iu_service(io, service, http_check=False)  # on n1's agent: the ladder's maintenance
            else:
                register_on_catalog_node(io, service, host(n))
            node = SimulatedNode(f"n{n}", f"r{n}", tmp_path, rates=[0.0], consul_addr=server.address, host=host(n),
                                 warmup_s=0.0, seed=n)
            node.ius[0].server.server_close()  # the in-process IU is replaced by the process on PORT
            node.ius = [types.SimpleNamespace(address=f"{host(n)}:{PORT}")]
            stack.enter_context(node_agent(node, agent_port, TRUE_PREFILL_TPS))
        edge = pushed_edge(stack, host(9), server.address, agent_port, 3)
        yield edge.address, server.address, units_dir, inventory


def test_restarting_a_serving_unit_costs_clients_nothing(served, tmp_path, capsys):
    edge_address, consul, units_dir, inventory = served
    pid = units.main_pid(units_dir, UNIT)
    generator = Generator(f"http://{edge_address}", None, 8.0, 3)
    planned = plan(load_scenario(tmp_path / "mix.yml"), RATE, LOAD_S, 3)
    load = threading.Thread(target=lambda: asyncio.run(generator.run(planned)), name="load")
    load.start()
    wait_for(lambda: generator.started is not None, 10, "the load started")
    threading.Event().wait(REMEDIATE_AT_S)
    began = time.monotonic() - generator.started  # the load's clock (asyncio's loop time is monotonic)
    code = main_code(["remediate", "-i", str(inventory), "--target", "n1-iu0", "--apply", "--json",
                      "--consul", consul, "--reason", "XID 94 contained ECC error", "--verify-s", "30",
                      "--max-nodes-per-rack", "1", "--max-unit-share", "0.34"])
    ended = time.monotonic() - generator.started
    load.join(LOAD_S + 30)
    outcome = json.loads(capsys.readouterr().out)
    after = units.main_pid(units_dir, UNIT)
    failed = [o for o in generator.outcomes if not o.ok]
    n1 = sorted(o.at for o in generator.outcomes if o.iu == "n1-iu0")
    back = next((t for t in n1 if t > ended), None)
    with capsys.disabled():
        print(f"\nremediate under load ({RATE:g} req/s, {len(generator.outcomes)} requests): {len(failed)} failed; "
              f"remediate ran {began:.1f}-{ended:.1f} s of the load ({outcome['took_s']:.2f} s in the ladder: "
              + ", ".join(f"{s['rung']} {s['took_s']:.2f} s" for s in outcome["steps"])
              + f"); n1-iu0 answered {sum(t < began for t in n1)} requests before, "
              f"{sum(t > ended for t in n1)} after; first one sent {back - ended if back else float('nan'):.2f} s "
              f"after the command returned")
    assert code == 0 and outcome["state"] == "released", outcome
    assert after not in (0, pid)  # really restarted
    assert len(generator.outcomes) == len(planned) and failed == [], [(o.at, o.iu, o.error) for o in failed]
    assert any(t < began for t in n1) and back is not None, n1  # served before, and back in rotation after


def test_a_drill_recovers_a_crashed_unit_through_the_ladder(served, tmp_path, capsys):
    edge_address, consul, units_dir, inventory = served
    drill = {"name": "crash-remediated", "recovery": "remediate",
             "load": {"mix": "mix.yml", "rate_per_s": RATE, "duration_s": 12, "seed": 3, "timeout_s": 8},
             "faults": [{"kind": "engine_crash", "at_s": 3, "hold_s": 2}],
             "checks": {"failed_not_streaming_max": 0, "blast_radius_errors_max": 0, "recover_s_max": 10}}
    (tmp_path / "drill.yml").write_text(yaml.safe_dump(drill, sort_keys=False))
    code = main_code(["drill", str(tmp_path / "drill.yml"), "-i", str(inventory), "--endpoint",
                      f"http://{edge_address}", "--target", "n1-iu0", "--consul", consul, "--json"])
    result = json.loads(capsys.readouterr().out)
    fault, [ladder] = result["faults"][0], result["remediations"]
    with capsys.disabled():
        print(f"\ndrill engine_crash, recovery by the ladder: {ladder['state']} in {ladder['took_s']:.2f} s ("
              + ", ".join(f"{s['rung']} {s['took_s']:.2f} s" for s in ladder["steps"])
              + f"); failed not streaming {fault['failed_not_streaming']}, streaming {fault['failed_streaming']}; "
              f"serving again {fault['serving_again_s']} s after the crash")
    assert ladder["state"] == "released" and [s["rung"] for s in ladder["steps"]][1:3] == ["restart", "verify restart"]
    assert result["error"] is None and any("remediate n1-iu0: released" in e for e in result["events"])
    # the fault's own undo ran after the ladder and found the unit running
    assert result["restored"] == [f"n1-iu0: {UNIT} started (a no-op when systemd restarted it)"]
    assert fault["serving_again_s"] is not None and code == (0 if result["passed"] else 1), result["checks"]
