"""A real pool on loopback for the operations tests: simulated vLLM IUs (one per node, no background load),
the real agent of each node scoring them (in a thread, pushing its body to the edge and writing it to the
dev Consul), and the real edge in front.

Each node has its own loopback address (127.0.202.N: away from the virtual cluster's 127.0.R.N and the edge
tests' 127.0.200.N; a bench names its own 127.0.R) so the edge finds each agent at ``<IU address>:<agent
port>`` as in production.
"""

from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

import yaml

from consul_io.client import ConsulIO
from eas_agent.agent import Agent, IUPipeline
from eas_agent.publisher import Backoff
from eas_agent.score import DrainParams, Scorer
from edge.access_config import AccessConfig
from edge.config import EdgeConfig, PushConfig
from sim.vllm.node import SimulatedNode
from sim.vllm.registration import IUService, register_iu_service, register_on_catalog_node
from tests.helpers import units, wait_for
from tests.helpers.edge import RunningEdge, free_port

FAST = {"interval_s": 0.1, "heartbeat_s": 0.5, "min_write_interval_s": 0.2,
        "write_rate_per_s": 5.0, "scrape_timeout_s": 0.4, "frozen_after_s": 1.0}
POOL_NET = "127.0.202"  # live_pool's nodes are POOL_NET.1, .2, ...; its edge POOL_NET.9
TRUE_PREFILL_TPS = 12_600.0  # the simulated engine's (sim/vllm/loadmodel.py: roofline of 70B on 4 x H100)


def stand_in_units(tmp_path: Path, monkeypatch) -> Path:
    """The units dir of the ``systemctl`` stand-in (tests/helpers/units.py), put first on PATH."""
    units_dir = tmp_path / "units"
    units.install(tmp_path / "bin", units_dir)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return units_dir


def drilled_nodes(tmp_path: Path, monkeypatch, address_of, port: int, nodes: int = 3) -> tuple[Path, Path]:
    """(units dir, hosts.yml) of a drill on loopback: the ``systemctl`` stand-in first on PATH, and an
    inventory of ``nodes`` nodes allowed to be drilled, n1 being this machine (``ansible_connection: local``)."""
    units_dir = stand_in_units(tmp_path, monkeypatch)
    hosts = {f"n{n}": {"ansible_host": address_of(n), "rack": f"r{n}", "gpu_model": "h100-sxm", "gpu_count": 4,
                       "iu_size": 4, "iu_ports": [port], "drills_allowed": True} for n in range(1, nodes + 1)}
    hosts["n1"]["ansible_connection"] = "local"
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    return units_dir, inventory


@contextmanager
def n1_serving(io: ConsulIO, units_dir: Path, log_dir: Path, address_of, port: int, unit: str) -> Iterator[None]:
    """The remediation tests' fleet on the dev Consul ``io`` talks to: n1's IU registered on that agent (node n1,
    no HTTP check: maintenance goes through the agent API as on a node), n2's and n3's on catalog nodes of their
    own (counted by the breaker, never touched), and n1's simulated vLLM declared as ``unit`` under the
    stand-in and started. Yields once it answers /health; stops every unit after."""
    gpus = (0, 1, 2, 3)
    register_iu_service(io, IUService("n1-iu0", "n1", "r1", address_of(1), port, gpus, 0), http_check=False)
    for n in (2, 3):
        register_on_catalog_node(io, IUService(f"n{n}-iu0", f"n{n}", "r1", address_of(n), port, gpus, 0),
                                 address_of(n))
    units.declare(units_dir, unit, units.sim_vllm_argv(f"{address_of(1)}:{port}"), log_dir / "n1-iu0.log")
    units.start(units_dir, unit)
    try:
        wait_for(lambda: units.answers_health(f"{address_of(1)}:{port}"), 20, "n1's simulated vLLM answering /health")
        yield
    finally:
        units.stop_all(units_dir)


@contextmanager
def node_agent(node: SimulatedNode, agent_port: int, prefill_tps_prior: float,
               decode_tps_prior: float = DrainParams.decode_tps_prior):
    address = node.ius[0].address.rsplit(":", 1)[0]
    config = node.write_config(listen=f"{address}:{agent_port}", **FAST)
    pipeline = IUPipeline(config, 0)
    # the prior prefill rate, kept (no decay): the lying unit's agent believes in a rate its IU does not have
    pipeline.scorer = Scorer(config.profile, DrainParams(prefill_tps_prior=prefill_tps_prior,
                                                         decode_tps_prior=decode_tps_prior,
                                                         capacity_half_life_s=1e9,
                                                         frozen_after_s=config.frozen_after_s))
    agent = Agent(config, gpu_backend=node.gpu_backend(), backoff=Backoff(base_s=0.1, cap_s=0.5),
                  pipelines=[pipeline])
    thread = threading.Thread(target=agent.run, name=f"agent-{config.node}", daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.request_stop()
        thread.join(6)


@contextmanager
def live_pool(tmp_path, consul_addr: str, nodes: int = 3, liar: int | None = None, liar_prior: float = 0.0,
              net: str = POOL_NET, liar_decode_prior: float = DrainParams.decode_tps_prior):
    """(edge, {iu id: SimulatedIU}): ``nodes`` nodes on ``net``.N, node ``liar``'s agent scoring with
    ``liar_prior`` as its prefill rate; every other agent with the true rate as its prior."""
    io = ConsulIO(consul_addr)
    agent_port = free_port(f"{net}.1")
    with ExitStack() as stack:
        ius, agents = {}, []
        for n in range(nodes):
            node = stack.enter_context(SimulatedNode(f"n{n + 1}", "r1", tmp_path, rates=[0.0],
                                                     consul_addr=consul_addr, host=f"{net}.{n + 1}",
                                                     warmup_s=0.0, seed=n))
            host, port = node.ius[0].address.rsplit(":", 1)
            # one dev Consul stands in for every node's agent: each IU on its own catalog node, as the edge
            # takes an IU's owner from its catalog node only
            register_on_catalog_node(io, IUService(node.iu_id(0), node.name, node.rack, host, int(port),
                                                   (0, 1, 2, 3), 0), host)
            ius[node.iu_id(0)] = node.ius[0]
            prior = liar_prior if n == liar else TRUE_PREFILL_TPS
            decode = liar_decode_prior if n == liar else DrainParams.decode_tps_prior
            agents.append(stack.enter_context(node_agent(node, agent_port, prior, decode)))
        edge = pushed_edge(stack, f"{net}.9", consul_addr, agent_port, nodes, admin=False)
        yield edge, ius


def pushed_edge(stack: ExitStack, address: str, consul_addr: str, agent_port: int, scored: int,
                timeout_s: float = 20.0, admin: bool = True) -> RunningEdge:
    """An edge listening on ``address`` that follows the agents' pushed scores (``agent_port``, applied every
    20 ms) and names the IU that answered, closed with ``stack``, once ``scored`` IUs are scored at it; its
    /metrics on ``address`` too when ``admin``."""
    access = {"access": AccessConfig(admin_listen=f"{address}:0")} if admin else {}
    config = EdgeConfig(listen=f"{address}:0", consul=replace(EdgeConfig().consul, address=consul_addr),
                        push=PushConfig(agent_port=agent_port, wait_s=2.0, apply_interval_s=0.02),
                        queue_timeout_s=5.0, seed=1, debug_headers=True, **access)
    edge = RunningEdge(config)
    stack.callback(edge.close)
    wait_for(lambda: len(edge.state.view.snapshot().scored) == scored, timeout_s, f"{scored} scored IUs at the edge")
    return edge


def sim_engines(stack: ExitStack, addresses: Iterable[str]) -> None:
    """A simulated vLLM process listening on each of ``addresses`` (HOST:PORT), stopped with ``stack``."""
    for address in addresses:
        proc = subprocess.Popen(units.sim_vllm_argv(address), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        stack.callback(proc.wait, 10)
        stack.callback(proc.terminate)
