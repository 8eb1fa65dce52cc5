"""Render a :class:`LoadModel` as vLLM's Prometheus ``/metrics`` text, V1 or V0 names.

Uses prometheus_client's own metric classes and ``generate_latest`` (what vLLM itself uses), so the text has
the exact shape vLLM prints: ``# HELP``/``# TYPE`` lines, ``_total`` and ``_created`` counter samples,
cumulative ``_bucket{le=...}``/``_sum``/``_count`` histograms. Names, label names and bucket edges follow
vLLM's ``vllm/v1/metrics/loggers.py`` (V1, labels ``model_name``, ``engine``) and ``vllm/engine/metrics.py``
(V0, label ``model_name``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from eas_agent.vllm_metrics import VllmMetrics
from sim.vllm.loadmodel import LoadModel

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
TPOT_BUCKETS = [
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
]
LATENCY_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
ITERATION_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """vLLM's ``build_1_2_5_buckets``: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    buckets, exponent = [], 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


class VllmExposition:
    def __init__(
        self,
        model: LoadModel,
        schema: str = "v1",
        model_name: str = "meta-llama/Meta-Llama-3-70B-Instruct",
        engine: str = "0",
    ):
        if schema not in ("v1", "v0"):
            raise ValueError(f"schema must be v1 or v0, got {schema!r}")
        self.model, self.schema = model, schema
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"] if schema == "v1" else ["model_name"]
        values = [model_name, engine] if schema == "v1" else [model_name]
        r = self.registry

        def gauge(name, doc):
            return Gauge(name, doc, labels, registry=r).labels(*values)

        def counter(name, doc):
            return Counter(name, doc, labels, registry=r).labels(*values)

        def histogram(name, doc, buckets):
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(*values)

        self.running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        if schema == "v1":
            self.kv = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
            self.prefix_queries = counter(
                "vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens."
            )
            self.prefix_hits = counter(
                "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
            )
            info = Gauge(
                "vllm:cache_config_info",
                "Information of the LLMEngine CacheConfig",
                [
                    "block_size",
                    "cache_dtype",
                    "enable_prefix_caching",
                    "engine",
                    "gpu_memory_utilization",
                    "num_gpu_blocks",
                    "num_cpu_blocks",
                ],
                registry=r,
            )
            info.labels(
                str(model.p.block_size), "auto", "True", engine, "0.9", str(model.num_gpu_blocks), "None"
            ).set(1)
        else:
            self.swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU.")
            self.kv = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage. 1 means 100 percent usage.")
            self.cpu_kv = gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage. 1 means 100 percent usage.")
            self.hit_rate = gauge("vllm:gpu_prefix_cache_hit_rate", "GPU prefix cache block hit rate.")
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.success_length = self.success.labels(*values, "length")
        self.success_stop = self.success.labels(*values, "stop")
        length_buckets = build_1_2_5_buckets(model.p.max_model_len)
        self.h_prompt = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", length_buckets
        )
        self.h_generation = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", length_buckets
        )
        self.h_iteration = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_BUCKETS
        )
        self.h_ttft = histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
        )
        self.h_tpot = histogram(
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            TPOT_BUCKETS,
        )
        self.h_e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LATENCY_BUCKETS,
        )
        self.h_queue = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            LATENCY_BUCKETS,
        )
        self.h_inference = histogram(
            "vllm:request_inference_time_seconds",
            "Histogram of time spent in RUNNING phase for request.",
            LATENCY_BUCKETS,
        )
        self._seen = {"preempt": 0, "prompt": 0, "gen": 0, "pq": 0, "ph": 0}

    def _inc(self, key: str, metric, total: int) -> None:
        delta = total - self._seen[key]
        if delta > 0:
            metric.inc(delta)
        self._seen[key] = total

    def render(self) -> str:
        m = self.model
        self.running.set(len(m.running))
        self.waiting.set(len(m.waiting))
        self.kv.set(round(m.kv_usage, 6))
        self._inc("preempt", self.preemptions, m.preemptions_total)
        self._inc("prompt", self.prompt_tokens, m.prompt_tokens_total)
        self._inc("gen", self.generation_tokens, m.generation_tokens_total)
        if self.schema == "v1":
            self._inc("pq", self.prefix_queries, m.prefix_queries_total)
            self._inc("ph", self.prefix_hits, m.prefix_hits_total)
        else:
            self.swapped.set(0)
            self.cpu_kv.set(0)
            self.hit_rate.set(m.prefix_hit_rate)
        events = m.drain_events()
        for ttft in events.first_tokens:
            self.h_ttft.observe(ttft)
        for tokens in events.iteration_tokens[-64:]:  # bounded work per scrape; shape matters, not every step
            self.h_iteration.observe(tokens)
        for request, end in events.finished:
            (
                self.success_length
                if request.generated >= request.output and request.output % 7 == 0
                else self.success_stop
            ).inc()
            self.h_prompt.observe(request.prompt)
            self.h_generation.observe(request.generated)
            self.h_e2e.observe(end - request.arrival)
            start = request.scheduled_at if request.scheduled_at is not None else request.arrival
            self.h_queue.observe(start - request.arrival)
            self.h_inference.observe(end - start)
            if request.first_token_at is not None and request.generated > 1:
                self.h_tpot.observe((end - request.first_token_at) / (request.generated - 1))
        return generate_latest(self.registry).decode()


def model_metrics(model: LoadModel, schema: str = "v1") -> VllmMetrics:
    """What parsing :meth:`VllmExposition.render` would return, without the text round trip (fast sims)."""
    return VllmMetrics(
        schema=schema,
        num_requests_running=float(len(model.running)),
        num_requests_waiting=float(len(model.waiting)),
        kv_cache_usage=round(model.kv_usage, 6),
        num_requests_swapped=0.0 if schema == "v0" else None,
        num_preemptions_total=float(model.preemptions_total),
        prompt_tokens_total=float(model.prompt_tokens_total),
        generation_tokens_total=float(model.generation_tokens_total),
        request_success_total=float(model.success_total),
        prefix_cache_queries_total=float(model.prefix_queries_total) if schema == "v1" else None,
        prefix_cache_hits_total=float(model.prefix_hits_total) if schema == "v1" else None,
        prefix_cache_hit_rate=None if schema == "v1" else model.prefix_hit_rate,
        prompt_tokens_sum=float(model.finished_prompt_sum),
        prompt_tokens_count=float(model.success_total),
        generation_tokens_sum=float(model.finished_generation_sum),
        generation_tokens_count=float(model.success_total),
        engines=1,
    )
