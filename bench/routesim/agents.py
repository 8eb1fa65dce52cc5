"""The real EAS agent, scoring and publishing for simulated IUs in simulated time.

Per node (two IUs of an 8-GPU H100 host) one `eas_agent.agent.Agent` is built with the real config
dataclasses, the real `IUPipeline` (VllmCollector parsing vLLM /metrics text, NetworkCollector, Scorer with
the `drain` or `seed` profile) and the real `Publisher` (quantized levels, hysteresis, min write interval,
heartbeat, CAS) writing into the in-memory Consul stand-in (`sim.memstore.MemoryStore`). What is
simulated is only what the agent reads from the machine:

- vLLM `/metrics`: scrape.render_metrics(unit, now) — the text the agent's parser reads;
- NVML: SimGpuBackend — memory as vLLM preallocates it (gpu_memory_utilization 0.9 of 81,559 MiB) and
  utilization = the share of the last interval the IU was executing steps (what NVML's "GPU busy" means);
- NIC byte counters: ingress 4 B per prompt token (UTF-8 text, ~4 characters per token) and egress 250 B
  per generated token (one OpenAI-style SSE `chat.completion.chunk` event per token).

Agent.cycle(now) runs every `interval_s` of simulated time (each node at its own phase), then
Publisher.step(now, results) — in production the publishing thread picks up the same cycle's results.

Scrapes: with `--scrape text` the agent's own parser (prometheus_client's text parser, ~0.4 ms a scrape)
reads render_metrics' text; by default (`direct_scrapes`) the fetch hands the collector the VllmMetrics that
parse would return for that text (tests/bench checks they are equal), because VllmCollector cannot take
parsed metrics: a `parse=` argument on VllmCollector (default parse_vllm_metrics) would remove this adapter.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import eas_agent.collectors.vllm as vllm_collector
from consul_io import layout
from eas_agent.agent import Agent, IUPipeline
from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import AgentConfig, IUConfig
from eas_agent.score import DrainParams, Scorer
from eas_agent.vllm_metrics import VllmMetrics
from eas_wire.scorebody import ScoreBody
from sim.memstore import MemoryStore
from sim.vllm.engine import InferenceUnit
from sim.vllm.eventloop import EventLoop

from .scrape import direct_metrics, render_metrics

PROMPT_BYTES_PER_TOKEN = 4
STREAM_BYTES_PER_TOKEN = 250
H100_MEMORY_MIB = 81559.0
GPU_MEMORY_UTILIZATION = 0.9
KV_PREFIX = layout.EAS_PREFIX
SIM_SCRAPE_TIMEOUT_S = 3600.0  # wall-clock seconds: never reached (see SimNodeAgent)
DATACENTER = layout.DEFAULT_DATACENTER


@dataclass(frozen=True)
class NicCounters:
    """The two fields of psutil's snetio the network collector reads."""

    bytes_recv: int
    bytes_sent: int


@contextmanager
def direct_scrapes(enabled: bool) -> Iterator[None]:
    """While active, a fetch may return VllmMetrics instead of text and the collector passes it through."""
    if not enabled:
        yield
        return
    real = vllm_collector.parse_vllm_metrics

    def parse(scraped):
        return scraped if isinstance(scraped, VllmMetrics) else real(scraped)

    vllm_collector.parse_vllm_metrics = parse
    try:
        yield
    finally:
        vllm_collector.parse_vllm_metrics = real


class SimGpuBackend:
    """GpuBackend over the node's simulated IUs: GPU index -> the IU that owns it."""

    def __init__(self, units: list[InferenceUnit], gpus_per_iu: int, clock):
        self.owner = {k * gpus_per_iu + g: unit for k, unit in enumerate(units) for g in range(gpus_per_iu)}
        self.clock = clock
        self.last: dict[int, tuple[float, float]] = {}

    def _utilization(self, unit: InferenceUnit, now: float) -> float:
        busy = unit.busy_seconds(now)
        then, busy_then = self.last.get(unit.index, (0.0, 0.0))
        self.last[unit.index] = (now, busy)
        return 100.0 * (busy - busy_then) / (now - then) if now > then else 0.0

    def read(self, indices: tuple[int, ...]) -> list[GpuReading]:
        now = self.clock()
        unit = self.owner[indices[0]]
        util = min(100.0, self._utilization(unit, now))
        used = H100_MEMORY_MIB * GPU_MEMORY_UTILIZATION
        return [GpuReading(index=i, memory_used_mib=used, memory_total_mib=H100_MEMORY_MIB,
                           utilization_pct=round(util), ecc_volatile_uncorrectable=0) for i in indices]

    def close(self) -> None:
        pass


class BeforeScorer(Scorer):
    """The drain score before its admitted-prefill term (prefill_s): no admitted-backlog tracker, so
    eas_agent.score.drain_score counts 0 admitted tokens. A benchmark's knob, kept out of the agent."""

    def __init__(self, profile: str, params: DrainParams):
        super().__init__(profile, params)
        self.admitted = None


class ScoresSink:
    """Stands where AgentHttpServer would: Agent.cycle hands it the `/scores` body of every cycle."""

    def __init__(self):
        self.body: ScoreBody | None = None
        self.version = 0
        self.edge_streams = 0  # edges reading the node's bodies on signed streams (routesim.announce.AnnouncePush)

    def set_scores(self, body: ScoreBody) -> None:
        self.body = body
        self.version += 1


class SimNodeAgent:
    def __init__(self, node: str, rack: str, units: list[InferenceUnit], *, profile: str, interval_s: float,
                 heartbeat_s: float, store: MemoryStore, loop: EventLoop, direct: bool, before: bool = False,
                 gpus_per_iu: int = 4):
        self.units, self.loop, self.store = units, loop, store
        kv_gb = units[0].capacity * units[0].model.model.kv_bytes_per_token / 1e9
        ius = tuple(
            IUConfig(id=unit.iu_id, gpus=tuple(range(k * gpus_per_iu, (k + 1) * gpus_per_iu)), numa_node=k,
                     metrics_url=f"http://127.0.0.1:{8000 + k}/metrics", netdevs=(f"sim{k}",), kv_cache_gb=kv_gb)
            for k, unit in enumerate(units))
        # scrape_timeout_s: a simulated scrape takes no simulated time, but the agent waits for its scrape
        # threads on the wall clock; with the shipped 0.15 s a loaded machine made scrapes "not finished"
        # (score unknown for that cycle), so results depended on the machine's load, not only on the seed
        self.config = AgentConfig(node=node, rack=rack, datacenter=DATACENTER, ius=ius, interval_s=interval_s,
                                  heartbeat_s=heartbeat_s, profile=profile,
                                  scrape_timeout_s=SIM_SCRAPE_TIMEOUT_S)
        scrape = direct_metrics if direct else render_metrics
        pipelines = [IUPipeline(self.config, k, vllm=VllmCollector(lambda unit=unit: scrape(unit, loop.now)))
                     for k, unit in enumerate(units)]
        if before:  # the drain score as shipped before its admitted-prefill term, for the before/after rows
            for pipeline in pipelines:
                pipeline.scorer = BeforeScorer(profile, DrainParams(frozen_after_s=self.config.frozen_after_s))
        self.agent = Agent(self.config, store=store, stop_store=store,
                           gpu_backend=SimGpuBackend(units, gpus_per_iu, lambda: loop.now), pipelines=pipelines,
                           clock=lambda: loop.now, pernic=self._pernic, serve_http=False)
        self.sink = ScoresSink()
        self.agent.http = self.sink  # the /scores body, exactly as Agent.cycle hands it to its HTTP server

    def _pernic(self) -> dict[str, NicCounters]:
        now = self.loop.now
        return {
            f"sim{k}": NicCounters(unit.counters.received_prompt_tokens * PROMPT_BYTES_PER_TOKEN,
                                   (unit.counters.generation_tokens + unit.decode_progress(now))
                                   * STREAM_BYTES_PER_TOKEN)
            for k, unit in enumerate(self.units)
        }

    def cycle(self, now: float) -> bool:
        """One collection cycle and the publishing decision on its results; True when the KV key was written."""
        results = self.agent.cycle(now)
        return self.agent.publisher.step(now, results)

    @property
    def writes(self) -> int:
        return self.agent.publisher.stats.writes


class AgentFleet:
    """Every node's agent, cycling on the event loop; tells `on_write` / `on_cycle` listeners."""

    def __init__(self, units: list[InferenceUnit], ius_per_node: int, nodes_per_rack: int, *, profile: str,
                 interval_s: float, heartbeat_s: float, loop: EventLoop, rng: random.Random, direct: bool,
                 before: bool = False):
        self.store = MemoryStore()
        self.loop = loop
        self.interval_s = interval_s
        self.agents: list[SimNodeAgent] = []
        for n in range(0, len(units), ius_per_node):
            node_units = units[n:n + ius_per_node]
            node = layout.node_of_iu(node_units[0].iu_id)
            rack = f"r{n // ius_per_node // nodes_per_rack:02d}"
            self.agents.append(SimNodeAgent(node, rack, node_units, profile=profile, interval_s=interval_s,
                                            heartbeat_s=heartbeat_s, store=self.store, loop=loop, direct=direct,
                                            before=before))
        self.write_listeners: list = []
        self.cycle_listeners: list = []
        self.health_listeners: list = []
        self._health_delivered = False
        for agent in self.agents:  # agents are not synchronised: each starts at its own phase
            loop.schedule(rng.uniform(0.0, interval_s), self._cycle, agent)

    def _cycle(self, agent: SimNodeAgent, now: float) -> None:
        written = agent.cycle(now)
        self.loop.schedule(now + self.interval_s, self._cycle, agent)
        if written:
            for listener in self.write_listeners:
                listener(now)
        for listener in self.cycle_listeners:
            listener(agent, now)
        if not self._health_delivered:  # the listing is static: registrations and their health checks
            self._health_delivered = True
            for listener in self.health_listeners:
                listener(now)

    @property
    def writes(self) -> int:
        return self.store.writes

    def kv_entries(self) -> list[dict]:
        """What GET /v1/kv/<prefix>/<dc>/?recurse answers (decoded), from the store."""
        return [{"Key": key, "Value": value, "ModifyIndex": index}
                for key, (index, value) in sorted(self.store.kv.items())]

    def health_entries(self) -> list[dict]:
        """What the IU listing (``GET /v1/health/service/vllm-iu-<node>`` per node) answers: each IU's service and its checks (the agents keep no
        checks of their own: their verdicts are in their score keys)."""
        entries = []
        for agent in self.agents:
            for iu in agent.config.ius:
                entries.append({
                    "Node": {"Node": agent.config.node},
                    "Service": {"ID": iu.id, "Service": layout.iu_service(agent.config.node), "Address": "127.0.0.1",
                                "Port": 8000 + iu.numa_node,
                                "Meta": {"node": agent.config.node, "rack": agent.config.rack}},
                    "Checks": [{"CheckID": layout.SERF_HEALTH_CHECK, "Status": "passing"},
                               {"CheckID": layout.health_check_id(iu.id), "Status": "passing"}],
                })
        return entries
