"""The agent loop: every ``interval_s`` collect and score each IU; a separate thread publishes to Consul.

Collection never waits on Consul: the publisher thread takes the latest cycle's results (older ones are
superseded, never queued), so a slow or absent Consul cannot stall scoring or ``/scores``.

The IUs' vLLM endpoints are scraped concurrently, each within ``scrape_timeout_s`` (a deadline: the first IU's
scrape, on the cycle's own thread, ends by it; another's still running then is aborted), so one slow or dripping
endpoint costs its own IU a cycle, never the node's other scores or the heartbeats. Whatever one IU's inputs do (NaN, negative gauges, a collector bug), that IU ends
up ``warning`` with no score, a counted error and a log line at most once a minute; the others are scored
and published as usual.

Every collector (vLLM, GPU, network, and the node's kernel log, read once for all IUs) is run the same way
(:func:`eas_agent.collectors.base.timed`); each IU's result carries how each run went (ok, duration, error
excerpt), which the score body publishes as ``ius.*.collectors`` and which counts
``eas_agent_collector_errors{collector, iu}``. A GPU that cannot be read (the backend raised included) keeps
the IU's score with status ``warning``, as a GPU NVML cannot read does; a kernel log that cannot be read
changes no status.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import replace

import psutil

from consul_io.client import ConsulIO, ConsulUnavailable
from eas_agent.announce import NodeAnnouncements
from eas_agent.collectors.base import timed
from eas_agent.collectors.gpu import GpuBackend, GpuCollector, open_backend
from eas_agent.collectors.kernel_log import KernelLog, KernelLogReading
from eas_agent.collectors.network import NetworkCollector, NodeNicCounters
from eas_agent.collectors.vllm import VllmCollector, VllmReading
from eas_agent.config import AgentConfig, ConfigError
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_agent.kernel_verdict import kernel_components, with_kernel_xids
from eas_agent.publisher import Backoff, Publisher, ScoreStore
from eas_agent.score import WARNING, DrainParams, IUInputs, Scorer, ScoreResult
from eas_wire.scorebody import CollectorRun, ScoreBody

log = logging.getLogger("eas_agent")
RATE_WINDOW_S = 5.0
LOG_EVERY_S = 60.0
ABORT_GRACE_S = 0.05  # after aborting a late scrape, how long to wait for its thread to notice
Scraped = tuple[VllmReading, CollectorRun]  # an IU's vLLM reading and how its collector ran
KernelRead = tuple[KernelLogReading, CollectorRun]  # the node's kernel log this cycle and how its read ran


def _not_scraped(error: str, waited_s: float) -> Scraped:
    return VllmReading(metrics=None, error=error), CollectorRun(False, waited_s, error)


class RateLimitedLog:
    """At most one line per ``every_s`` per key; the next line says how many were suppressed meanwhile."""

    def __init__(self, logger: logging.Logger, every_s: float = LOG_EVERY_S, clock=time.monotonic):
        self.logger, self.every_s, self.clock = logger, every_s, clock
        self.last: dict[str, float] = {}
        self.suppressed: dict[str, int] = {}
        self.lock = threading.Lock()

    def __call__(self, key: str, level: int, msg: str, *args, exc_info: bool | BaseException = False) -> bool:
        now = self.clock()
        with self.lock:
            last = self.last.get(key)
            if last is not None and now - last < self.every_s:
                self.suppressed[key] = self.suppressed.get(key, 0) + 1
                return False
            self.last[key] = now
            skipped = self.suppressed.pop(key, 0)
        if skipped:
            msg += f" ({skipped} more like this suppressed)"
        self.logger.log(level, msg, *args, exc_info=exc_info)
        return True


class IUPipeline:
    """Collectors and scorer of one IU. The collectors that read node-wide sources (the GPU backend, the
    node's NIC counters) are built by :meth:`attach`, which the agent calls with its own sources."""

    def __init__(self, config: AgentConfig, index: int, vllm: VllmCollector | None = None):
        iu = config.ius[index]
        self.iu, self.config = iu, config
        self.vllm = vllm or VllmCollector.over_http(iu.metrics_url, config.scrape_timeout_s)
        self.gpu: GpuCollector | None = None
        self.network: NetworkCollector | None = None
        self.scorer = Scorer(config.profile, DrainParams(prefill_tps_prior=iu.prefill_tps_prior,
                                                         decode_tps_prior=iu.decode_tps_prior,
                                                         frozen_after_s=config.frozen_after_s))
        self.log = RateLimitedLog(log)

    def attach(self, gpu_backend: GpuBackend, nics: NodeNicCounters) -> None:
        iu = self.iu
        self.gpu = GpuCollector(gpu_backend, iu.gpus)
        if iu.netdevs or iu.rdma_devices:
            self.network = NetworkCollector(
                iu.netdevs, iu.rdma_devices, nics, iu.rdma_port, self.config.sysfs_root, RATE_WINDOW_S
            )

    def _crashed(self, name: str, exc: Exception) -> None:
        self.log(f"{self.iu.id}:{name}", logging.ERROR, "IU %s: %s collector failed", self.iu.id, name, exc_info=exc)

    def scrape(self, now: float) -> Scraped:
        """The vLLM part of a cycle (the agent runs it on a worker thread, concurrently with other IUs')."""
        return timed(self.vllm, now, self._crashed)

    def run(self, now: float, metrics: AgentMetrics | None, scraped: Scraped | None = None,
            kernel: KernelRead | None = None) -> ScoreResult:
        try:
            return self._run(now, metrics, scraped, kernel)
        except Exception as exc:  # a bug must cost one IU one cycle, never the agent
            self.log(f"{self.iu.id}:cycle", logging.ERROR, "IU %s: cycle failed", self.iu.id, exc_info=True)
            if metrics:
                metrics.collector_errors.labels("internal", self.iu.id).inc()
            return ScoreResult(None, WARNING, f"agent error: {type(exc).__name__}: {exc}")

    def _run(self, now: float, metrics: AgentMetrics | None, scraped: Scraped | None,
             kernel_read: KernelRead | None) -> ScoreResult:
        reading, vllm_run = scraped if scraped is not None else self.scrape(now)
        gpus, gpu_run = timed(self.gpu, now, self._crashed)
        runs = {"vllm": vllm_run, "gpu": gpu_run}
        kernel = None
        if kernel_read is not None:
            kernel, runs["kernel_log"] = kernel_read
            gpus = with_kernel_xids(gpus, kernel)
        net = None
        if self.network is not None:
            net, runs["network"] = timed(self.network, now, self._crashed)
        if reading.error:
            self.log(f"{self.iu.id}:vllm", logging.WARNING, "IU %s: %s", self.iu.id, reading.error)
        elif reading.metrics is not None and reading.metrics.warnings:  # scored, but a sample was left out
            self.log(f"{self.iu.id}:vllm-warnings", logging.WARNING, "IU %s: vLLM scrape read with warnings: %s",
                     self.iu.id, "; ".join(reading.metrics.warnings))
        if metrics:
            for name, run in runs.items():
                if not run.ok:
                    metrics.collector_errors.labels(name, self.iu.id).inc()
        inputs = IUInputs(self.iu.id, reading, gpus, net, self.iu.kv_cache_gb, RATE_WINDOW_S, self.config.xid_hold_s,
                          kernel)
        result = self.scorer.score(inputs, now)
        shown = kernel_components(kernel)
        if shown:
            result = replace(result, components={**result.components, **shown})
        return result.with_collectors(runs)


def open_store(config: AgentConfig, timeout_s: float) -> ConsulIO:
    c = config.consul
    token = c.read_token(config.source)
    try:
        return ConsulIO(c.address, token=token, scheme=c.scheme, ca_file=c.ca_file, timeout_s=timeout_s)
    except ConsulUnavailable as exc:  # nothing is contacted here: the address contradicts the scheme
        raise ConfigError(config.source, "consul.address", str(exc)) from None


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        *,
        store: ScoreStore | None = None,
        stop_store: ScoreStore | None = None,
        gpu_backend: GpuBackend | None = None,
        kernel_log: KernelLog | None = None,
        pipelines: list[IUPipeline] | None = None,
        clock=time.time,
        pernic=None,
        serve_http: bool = True,
        clock_offset=lambda: None,
        backoff: Backoff | None = None,
    ):
        self.config, self.clock = config, clock
        self.gpu_backend = gpu_backend or open_backend(config.gpu_backend)
        self.kernel_log = kernel_log if kernel_log is not None else (KernelLog() if config.kernel_log else None)
        self.pipelines = pipelines or [IUPipeline(config, i) for i in range(len(config.ius))]
        self.nics = NodeNicCounters(pernic or (lambda: psutil.net_io_counters(pernic=True)))
        self.needs_pernic = any(iu.netdevs for iu in config.ius)
        # the announce channel's per-IU state (eas_agent/announce.py); the scorers give waiting requests the
        # sizes edges announced (none announced: each scorer's own score, unchanged). The edges' public keys
        # are read here, at start-up (None: POST /announce answers 404).
        edge_keys = config.read_edge_keys()
        rate = config.announce_rate_per_s
        self.announcements = NodeAnnouncements(
            [iu.id for iu in config.ius], max_prompt_tokens=config.announce_max_prompt_tokens,
            rate_per_s=rate, burst=2 * rate,  # the bucket holds 2 s of the rate (announce.DEFAULT_BURST's ratio)
            node_rate_per_s=config.announce_node_rate_per_s,
        )
        self.scores_base: ScoreBody | None = None  # the last cycle's /scores body, before announcements
        # Held by the cycle from its first reconcile (scoring) to its new body, and by announce() around
        # "read scores_base, serve a body from it": a batch's body is never built from a base older than
        # the announced prompts' state, nor served after a newer cycle's body.
        self.scores_lock = threading.Lock()
        for pipeline in self.pipelines:
            pipeline.attach(self.gpu_backend, self.nics)
            pipeline.scorer = self.announcements.scorer(pipeline.iu.id, pipeline.scorer)
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
            min_write_interval_s=config.min_write_interval_s,
            write_rate_per_s=config.write_rate_per_s,
            write_burst=config.write_burst,
            urgent_rise_s="profile" if config.urgent_rise_s is None else config.urgent_rise_s,
            cycle_s=config.interval_s,
            backoff=backoff,
            clock_offset=clock_offset,
            streamed=lambda: self.http is not None and self.http.edge_streams > 0,
        )
        self.metrics = AgentMetrics()
        self.http = (
            AgentHttpServer(config.listen_host, config.listen_port, self.metrics,
                            announce=lambda obj, key: self.announce(obj, key, self.clock()),
                            edge_keys=edge_keys, clock=self.clock)
            if serve_http
            else None
        )
        self.stopping = threading.Event()
        self.latest: tuple[float, dict[str, ScoreResult]] | None = None
        self.new_results = threading.Condition()
        self.publish_lock = threading.Lock()
        self.cycles = 0
        self.stop_requested_at: float | None = None
        self.scrape_timeout_s = config.scrape_timeout_s
        self.scrapes: dict[str, Future] = {}  # a scrape still running after its deadline and abort
        self.executor: ThreadPoolExecutor | None = None
        self.log = RateLimitedLog(log)

    def _scrape_all(self, now: float) -> dict[str, Scraped]:
        """Every IU's vLLM reading, concurrently, within the scrape deadline. The first IU is scraped on this
        thread (its fetcher ends every read of the GET by the deadline itself), the others on worker threads:
        a hand-off costs two thread wake-ups, a good part of a cycle's CPU."""
        own, *others = self.pipelines
        if not others:
            return {own.iu.id: own.scrape(now)}
        if self.executor is None:
            # +1 worker: an IU whose scrape is stuck past its abort holds a thread until it returns
            self.executor = ThreadPoolExecutor(len(others) + 1, thread_name_prefix="eas-scrape")
        scraped: dict[str, Scraped] = {}
        started: dict[str, Future] = {}
        waited = self.scrape_timeout_s + ABORT_GRACE_S
        wait_until = time.monotonic() + waited
        for p in others:
            previous = self.scrapes.get(p.iu.id)
            if previous is not None and not previous.done():
                scraped[p.iu.id] = _not_scraped("previous scrape still running", 0.0)
                continue
            started[p.iu.id] = self.scrapes[p.iu.id] = self.executor.submit(p.scrape, now)
        scraped[own.iu.id] = own.scrape(now)
        _, late = wait_futures(started.values(), timeout=max(0.0, wait_until - time.monotonic()))
        if late:
            by_id = {p.iu.id: p for p in self.pipelines}
            for iu_id, future in started.items():
                if future in late:
                    by_id[iu_id].vllm.abort()
            wait_futures(late, timeout=ABORT_GRACE_S)
        for iu_id, future in started.items():
            if future.done():
                scraped[iu_id] = future.result()  # scrape() never raises
            else:
                scraped[iu_id] = _not_scraped(
                    f"scrape not finished within {self.scrape_timeout_s:g} s", waited + ABORT_GRACE_S
                )
        return scraped

    # -- one cycle (no Consul) ------------------------------------------------------------------------
    def cycle(self, now: float) -> dict[str, ScoreResult]:
        started = time.perf_counter()
        if self.needs_pernic:
            self.nics.refresh()
            if self.nics.error:
                self.log("nics", logging.WARNING, "%s", self.nics.error)
        kernel = self._read_kernel_log(now)
        scraped = self._scrape_all(now)
        # Scoring ends what announcements added to the previous scrape's scores (AnnouncedPrompts.reconcile):
        # from there until this cycle's body is served, a body built on the previous base would lack it.
        with self.scores_lock:
            results = {p.iu.id: p.run(now, self.metrics, scraped.get(p.iu.id), kernel) for p in self.pipelines}
            scored = time.perf_counter()
            if self.http:
                try:
                    body = self.publisher.body(now, results, self.publisher.levels_for(results))
                    self.scores_base = replace(body, published_seq=self.publisher.seq)
                    self.http.set_scores(self.announcements.body(self.scores_base))
                except Exception:  # /scores keeps its last body; collection and publishing go on
                    self.log("scores", logging.ERROR, "building the /scores body failed", exc_info=True)
        self.metrics.cycle_seconds.observe(scored - started)
        self.metrics.observe_scores(self.config.profile, results)
        self.cycles += 1
        return results

    def _read_kernel_log(self, now: float) -> KernelRead | None:
        """The node's kernel log, read once for every IU; a log that cannot be read is said in each IU's
        ``collectors.kernel_log`` and logged, and changes no verdict."""
        if self.kernel_log is None:
            return None
        read = timed(self.kernel_log, now, lambda name, exc: self.log(
            name, logging.ERROR, "%s collector failed", name, exc_info=exc))
        if read[0].error:
            self.log("kernel_log", logging.WARNING, "kernel log: %s", read[0].error)
        return read

    def announce(self, obj, key: str, now: float) -> tuple[int, Counter, list[int]]:
        """One ``POST /announce`` batch signed by ``key`` (an HTTP handler thread; ``now`` is the agent's
        clock): counted
        (:meth:`NodeAnnouncements.receive_batch`, which raises AnnounceError for a malformed batch), then, when
        it added something and a cycle has served a body, a new ``/scores`` body at once, which goes out on
        the edges' streams. (accepted, ignored by reason, the ignored ones' sequence numbers)."""
        accepted, ignored, ignored_seqs = self.announcements.receive_batch(obj, now, key)
        if accepted and self.http:
            with self.scores_lock:
                if self.scores_base is not None:
                    try:
                        self.http.set_scores(self.announcements.body(self.scores_base))
                    except Exception:  # counted already; /scores keeps its body until the next cycle's
                        self.log("announce", logging.ERROR, "building the /scores body failed", exc_info=True)
        return accepted, ignored, ignored_seqs

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
                    self.log("publish", logging.ERROR, "publishing failed", exc_info=True)
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
        if self.executor is not None:
            self.executor.shutdown(wait=False, cancel_futures=True)
        self.gpu_backend.close()
        if self.kernel_log is not None:
            self.kernel_log.close()
