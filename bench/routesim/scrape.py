"""A simulated IU's vLLM V1 `/metrics` text, so the real agent collector parses what vLLM would print.

Names, types and labels follow vllm/v1/metrics/loggers.py (labels model_name and engine); only the families
the agent reads are printed (a real scrape has dozens more, which the agent's parser skips unparsed).
Semantics as in vLLM V1: prompt_tokens_total grows when a request's prefill completes (its first token),
generation_tokens_total per generated token, the prompt-length histogram and request_success_total at
completion, num_preemptions_total per preemption; kv_cache_usage_perc is used / total KV blocks;
prefix_cache_queries_total grows by a request's token count each time the scheduler admits it from the
waiting queue (the prefix-cache lookup) and prefix_cache_hits_total by the tokens found cached then
(sim/vllm/prefixcache.py). vLLM also counts
a lookup whose KV allocation then fails and is retried next step; the sim counts admissions only.
"""

from __future__ import annotations

from eas_agent.vllm_metrics import VllmMetrics
from sim.vllm.engine import InferenceUnit

MODEL_NAME = "meta-llama/Meta-Llama-3-70B-Instruct"
_LABELS = f'{{engine="0",model_name="{MODEL_NAME}"}}'
_SUCCESS_LABELS = f'{{engine="0",finished_reason="stop",model_name="{MODEL_NAME}"}}'
_INF_BUCKET = f'{{engine="0",le="+Inf",model_name="{MODEL_NAME}"}}'


def _family(name: str, kind: str, doc: str, samples: list[str]) -> str:
    return f"# HELP {name} {doc}\n# TYPE {name} {kind}\n" + "".join(s + "\n" for s in samples)


def _values(unit: InferenceUnit, now: float) -> dict[str, float]:
    progress = unit.decode_progress(now)
    c = unit.counters
    return {
        "running": float(len(unit.running)),
        "waiting": float(len(unit.waiting)),
        "kv": round((unit.kv_used + progress) / unit.capacity, 6),
        "preemptions": float(c.preemptions),
        "prompt_tokens": float(c.prompt_tokens),
        "generation_tokens": float(c.generation_tokens + progress),
        "success": float(c.requests_finished),
        "prompt_sum": float(c.finished_prompt_tokens),
        "queries": float(c.prefix_cache_queries),
        "hits": float(c.prefix_cache_hits),
    }


def direct_metrics(unit: InferenceUnit, now: float) -> VllmMetrics:
    """What eas_agent.vllm_metrics.parse_vllm_metrics returns for render_metrics(unit, now), built directly
    (the text parse costs ~0.4 ms per scrape; tests/bench check the two agree)."""
    v = _values(unit, now)
    return VllmMetrics(
        schema="v1", num_requests_running=v["running"], num_requests_waiting=v["waiting"], kv_cache_usage=v["kv"],
        num_preemptions_total=v["preemptions"], prompt_tokens_total=v["prompt_tokens"],
        generation_tokens_total=v["generation_tokens"], request_success_total=v["success"],
        prefix_cache_queries_total=v["queries"], prefix_cache_hits_total=v["hits"],
        prompt_tokens_sum=v["prompt_sum"], prompt_tokens_count=v["success"], engines=1)


def render_metrics(unit: InferenceUnit, now: float) -> str:
    v = _values(unit, now)
    return "".join((
        _family("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
                [f"vllm:num_requests_running{_LABELS} {v['running']}"]),
        _family("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
                [f"vllm:num_requests_waiting{_LABELS} {v['waiting']}"]),
        _family("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
                [f"vllm:kv_cache_usage_perc{_LABELS} {v['kv']}"]),
        _family("vllm:num_preemptions", "counter", "Cumulative number of preemption from the engine.",
                [f"vllm:num_preemptions_total{_LABELS} {v['preemptions']}"]),
        _family("vllm:prompt_tokens", "counter", "Number of prefill tokens processed.",
                [f"vllm:prompt_tokens_total{_LABELS} {v['prompt_tokens']}"]),
        _family("vllm:generation_tokens", "counter", "Number of generation tokens processed.",
                [f"vllm:generation_tokens_total{_LABELS} {v['generation_tokens']}"]),
        _family("vllm:request_success", "counter", "Count of successfully processed requests.",
                [f"vllm:request_success_total{_SUCCESS_LABELS} {v['success']}"]),
        _family("vllm:request_prompt_tokens", "histogram", "Number of prefill tokens processed.", [
            f"vllm:request_prompt_tokens_bucket{_INF_BUCKET} {v['success']}",
            f"vllm:request_prompt_tokens_count{_LABELS} {v['success']}",
            f"vllm:request_prompt_tokens_sum{_LABELS} {v['prompt_sum']}",
        ]),
        _family("vllm:prefix_cache_queries", "counter", "Prefix cache queries, in terms of number of queried tokens.",
                [f"vllm:prefix_cache_queries_total{_LABELS} {v['queries']}"]),
        _family("vllm:prefix_cache_hits", "counter", "Prefix cache hits, in terms of number of cached tokens.",
                [f"vllm:prefix_cache_hits_total{_LABELS} {v['hits']}"]),
    ))
