"""The agent loop: every ``interval_s`` collect and score each IU; a separate thread publishes to Consul.

Collection never waits on Consul: the publisher thread takes the latest cycle's results (older ones are
superseded, never queued), so a slow or absent Consul cannot stall scoring or ``/scores``.
"""

from __future__ import annotations

import logging
import threading
import time

import psutil

from eas_agent.collectors.gpu import GpuBackend, open_backend
from eas_agent.collectors.network import NetworkCollector
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import AgentConfig
from eas_agent.consul_io import ConsulIO
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_agent.publisher import Backoff, Publisher, ScoreStore
from eas_agent.score import WARNING, DrainParams, IUInputs, Scorer, ScoreResult

log = logging.getLogger("eas_agent")
RATE_WINDOW_S = 5.0


class IUPipeline:
    """Collectors and scorer of one IU."""

    def __init__(self, config: AgentConfig, index: int, vllm: VllmCollector | None = None):
        iu = config.ius[index]
        self.iu = iu
        self.vllm = vllm or VllmCollector.over_http(iu.metrics_url, config.scrape_timeout_s)
        self.network = NetworkCollector(
            iu.netdevs, iu.rdma_devices, iu.rdma_port, config.sysfs_root, RATE_WINDOW_S
        )
        self.scorer = Scorer(config.profile, DrainParams(frozen_after_s=config.frozen_after_s))

    def run(self, now: float, gpu_backend: GpuBackend, pernic, metrics: AgentMetrics | None) -> ScoreResult:
        try:
            return self._run(now, gpu_backend, pernic, metrics)
        except Exception as exc:  # a collector bug must cost one IU one cycle, never the agent
            log.exception("IU %s: cycle failed", self.iu.id)
            if metrics:
                metrics.collector_errors.labels("internal", self.iu.id).inc()
            return ScoreResult(None, WARNING, f"agent error: {type(exc).__name__}: {exc}")

    def _run(self, now: float, gpu_backend: GpuBackend, pernic, metrics: AgentMetrics | None) -> ScoreResult:
        reading = self.vllm.collect(now)
        if reading.error and metrics:
            metrics.collector_errors.labels("vllm", self.iu.id).inc()
        gpus = tuple(gpu_backend.read(self.iu.gpus))
        if metrics and any(g.error for g in gpus):
            metrics.collector_errors.labels("gpu", self.iu.id).inc()
        net = self.network.collect(now, pernic) if (self.iu.netdevs or self.iu.rdma_devices) else None
        inputs = IUInputs(self.iu.id, reading, gpus, net, self.iu.kv_cache_gb, RATE_WINDOW_S)
        return self.scorer.score(inputs, now)


def open_store(config: AgentConfig, timeout_s: float) -> ConsulIO:
    c = config.consul
    return ConsulIO(
        c.address, token=c.read_token(config.source), scheme=c.scheme, ca_file=c.ca_file, timeout_s=timeout_s
    )


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        store: ScoreStore | None = None,
        stop_store: ScoreStore | None = None,
        gpu_backend: GpuBackend | None = None,
        pipelines: list[IUPipeline] | None = None,
        clock=time.time,
        pernic=None,
        serve_http: bool = True,
        clock_offset=lambda: None,
        backoff: Backoff | None = None,
    ):
        self.config, self.clock = config, clock
        self.gpu_backend = gpu_backend or open_backend(config.gpu_backend, config.fake_gpu_file)
        self.pipelines = pipelines or [IUPipeline(config, i) for i in range(len(config.ius))]
        self.pernic = pernic or (lambda: psutil.net_io_counters(pernic=True))
        self.needs_pernic = any(iu.netdevs for iu in config.ius)
        self.store = (
            store if store is not None else open_store(config, timeout_s=max(1.0, config.heartbeat_s / 2))
        )
        self.stop_store = (
            stop_store
            if stop_store is not None
            else (open_store(config, timeout_s=0.4) if store is None else store)
        )
        self.publisher = Publisher(
            self.store,
            key=config.kv_key,
            node=config.node,
            rack=config.rack,
            iu_ids=[iu.id for iu in config.ius],
            profile=config.profile,
            heartbeat_s=config.heartbeat_s,
            ttl_s=config.ttl_s,
            min_write_interval_s=config.min_write_interval_s,
            cycle_s=config.interval_s,
            backoff=backoff,
            clock_offset=clock_offset,
        )
        self.metrics = AgentMetrics()
        self.http = (
            AgentHttpServer(config.listen_host, config.listen_port, self.metrics) if serve_http else None
        )
        self.stopping = threading.Event()
        self.latest: tuple[float, dict[str, ScoreResult]] | None = None
        self.new_results = threading.Condition()
        self.publish_lock = threading.Lock()
        self.cycles = 0
        self.stop_requested_at: float | None = None

    # -- one cycle (no Consul) ------------------------------------------------------------------------
    def cycle(self, now: float) -> dict[str, ScoreResult]:
        started = time.perf_counter()
        try:
            pernic = self.pernic() if self.needs_pernic else {}
        except OSError as exc:
            log.warning("reading NIC counters failed: %s", exc)
            pernic = {}
        results = {p.iu.id: p.run(now, self.gpu_backend, pernic, self.metrics) for p in self.pipelines}
        self.metrics.cycle_seconds.observe(time.perf_counter() - started)
        self.metrics.observe_scores(self.config.profile, results)
        if self.http:
            body = self.publisher.body(now, results, self.publisher.levels_for(results))
            body["published_seq"] = self.publisher.seq
            self.http.set_scores(body)
        self.cycles += 1
        return results

    # -- publishing thread ----------------------------------------------------------------------------
    def _publish_loop(self) -> None:
        last_seen, failing = None, False
        while not self.stopping.is_set():
            with self.new_results:
                self.new_results.wait_for(
                    lambda seen=last_seen: self.latest is not seen or self.stopping.is_set(),
                    timeout=self.config.interval_s * 2,
                )
                latest = self.latest
            if self.stopping.is_set() or latest is None or latest is last_seen:
                continue
            last_seen = latest
            with self.publish_lock:
                before_writes, before_errors = self.publisher.stats.writes, self.publisher.stats.errors
                try:
                    self.publisher.step(*latest)
                except Exception:  # never let a bug end publishing: log it, the next cycle tries again
                    log.exception("publishing failed")
                stats = self.publisher.stats
            if stats.writes > before_writes:
                self.metrics.consul_writes.inc(stats.writes - before_writes)
            else:
                self.metrics.consul_skips.inc()
            if stats.errors > before_errors:
                self.metrics.consul_errors.inc(stats.errors - before_errors)
                if not failing or stats.errors % 50 == 0:
                    log.warning(
                        "consul unavailable (%d failures, backing off): %s", stats.errors, stats.last_error
                    )
                failing = True
            elif failing and stats.writes > before_writes:
                log.warning("consul reachable again; caught up with one write (seq %d)", self.publisher.seq)
                failing = False

    # -- main loop -------------------------------------------------------------------------------------
    def run(self) -> None:
        if self.http:
            self.http.start()
        publisher = threading.Thread(target=self._publish_loop, name="eas-publisher", daemon=True)
        publisher.start()
        interval = self.config.interval_s
        next_tick = time.monotonic()
        try:
            while not self.stopping.is_set():
                now = self.clock()
                results = self.cycle(now)
                with self.new_results:
                    self.latest = (now, results)
                    self.new_results.notify()
                next_tick += interval
                delay = next_tick - time.monotonic()
                if delay < 0:  # overran: skip missed ticks instead of bursting
                    next_tick = time.monotonic()
                    delay = 0
                self.stopping.wait(delay)
        finally:
            self._shutdown()

    def request_stop(self, *_signal_args) -> None:
        if self.stop_requested_at is None:
            self.stop_requested_at = time.monotonic()
        self.stopping.set()
        with self.new_results:
            self.new_results.notify_all()

    def _shutdown(self) -> None:
        """Mark IUs critical ("agent stopping") within the 2 s systemd gives us; never wait on stuck calls."""
        acquired = self.publish_lock.acquire(timeout=0.3)
        try:
            self.publisher.store = self.stop_store
            results = self.latest[1] if self.latest else None
            self.publisher.stop(self.clock(), results)
        finally:
            if acquired:
                self.publish_lock.release()
        if self.http:
            self.http.stop()
        self.gpu_backend.close()
