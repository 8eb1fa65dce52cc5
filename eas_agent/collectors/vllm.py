"""vLLM collector: GET /metrics within a short deadline (eas_wire.fetch), parse, turn counters into windowed rates."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eas_agent.collectors.rates import WindowRate
from eas_agent.vllm_metrics import MetricsParseError, VllmMetrics, parse_vllm_metrics
from eas_wire.fetch import FetchError, HttpFetcher


@dataclass(frozen=True)
class VllmReading:
    metrics: VllmMetrics | None
    error: str | None = None
    prompt_tps: float | None = None  # prompt (prefill) tokens/s over the window
    generation_tps: float | None = None
    preemptions_per_s: float | None = None
    completions_per_s: float | None = None
    tokens_last_moved: float | None = None  # when prompt+generation counters last changed
    mean_prompt_tokens: float | None = None  # from vllm:request_prompt_tokens _sum/_count
    mean_generation_tokens: float | None = None


class VllmCollector:
    name = "vllm"

    def __init__(self, fetch: Callable[[], str], window_s: float = 5.0):
        self.fetch = fetch
        self.prompt = WindowRate(window_s)
        self.generation = WindowRate(window_s)
        self.preemptions = WindowRate(window_s)
        self.completions = WindowRate(window_s)
        self.tokens = WindowRate(window_s)

    @classmethod
    def over_http(cls, url: str, timeout_s: float) -> VllmCollector:
        return cls(HttpFetcher(url, timeout_s))

    def collect(self, now: float) -> VllmReading:
        try:
            metrics = parse_vllm_metrics(self.fetch())
        except (FetchError, MetricsParseError) as exc:
            return self.failed(now, str(exc))
        return self.observe(now, metrics)

    def abort(self) -> None:
        """Stop a fetch still running on another thread (see :meth:`HttpFetcher.abort`)."""
        abort = getattr(self.fetch, "abort", None)
        if abort is not None:
            abort()

    def failed(self, now: float, error: str) -> VllmReading:
        for rate in (self.prompt, self.generation, self.preemptions, self.completions):
            rate.update(now, None)
        return VllmReading(metrics=None, error=error, tokens_last_moved=self.tokens.last_change)

    def observe(self, now: float, metrics: VllmMetrics) -> VllmReading:
        """Counters -> rates for already-parsed metrics (simulations feed :class:`VllmMetrics` directly)."""
        total_tokens = None
        if metrics.prompt_tokens_total is not None and metrics.generation_tokens_total is not None:
            total_tokens = metrics.prompt_tokens_total + metrics.generation_tokens_total
        self.tokens.update(now, total_tokens)
        return VllmReading(
            metrics=metrics,
            prompt_tps=self.prompt.update(now, metrics.prompt_tokens_total),
            generation_tps=self.generation.update(now, metrics.generation_tokens_total),
            preemptions_per_s=self.preemptions.update(now, metrics.num_preemptions_total),
            completions_per_s=self.completions.update(now, metrics.request_success_total),
            tokens_last_moved=self.tokens.last_change,
            mean_prompt_tokens=_mean(metrics.prompt_tokens_sum, metrics.prompt_tokens_count),
            mean_generation_tokens=_mean(metrics.generation_tokens_sum, metrics.generation_tokens_count),
        )


def _mean(total: float | None, count: float | None) -> float | None:
    if total is None or not count:
        return None
    return total / count
