"""Score profiles: readings of one IU -> a load score, its components and a check status.

``drain`` (default): the estimated seconds until the IU can start new work. Seconds compare across IUs and
GPU types (an H200 IU that drains twice as fast scores half as much with the same queue)::

    backlog_tokens = waiting x mean_prompt_tokens
    prefill_eff    = max(0.1 x prefill_tps, prefill_tps - preemptions/s x mean_prompt_tokens)
    queue_s        = backlog_tokens / prefill_eff
    kv_s           = max(0, kv_usage - kv_high) x residency_s / kv_usage
    step_s         = running / decode_tps
    prefill_s      = admitted_prefill_tokens / prefill_tps
    drain          = queue_s + kv_s + step_s + prefill_s

- vLLM exposes no waiting-token gauge: the backlog uses the mean prompt of the vllm:request_prompt_tokens
  histogram (_sum/_count);
- a preempted request is recomputed (its prompt prefilled again), so preemptions eat prefill capacity;
- queue_s is the prefill of everything queued ahead;
- kv_s is the time until running requests free the KV above the level where vLLM starts preempting
  (``kv_high``), with residency_s = running / completions per s (Little's law);
- step_s is one decode step of the current batch: the wait for the next scheduling point;
- prefill_s is the prefill of prompts the IU has admitted but not finished prefilling (below).

Admitted prefill backlog: vLLM V1 counts a request whose prompt is being prefilled in chunks as *running*
(not waiting) and adds its prompt to ``prompt_tokens_total`` only at its first token, so without this term
an IU chewing through a 12,842-token prompt (~1 s) looks nearly idle. V1 adds a request's tokens to
``prefix_cache_queries_total`` when the scheduler admits it (the prefix-cache lookup), so
``queries - prompt_tokens`` grows by each prompt at admission and shrinks by it at its first token: the
prompt tokens admitted but not yet prefilled. The difference also drifts upwards, never down: a lookup
whose request then cannot get KV blocks, and the recompute of a preempted request, are counted in queries
but never again in prompt_tokens. So the difference is measured from an offset (:class:`AdmittedBacklog`)
that is re-zeroed whenever the IU is idle (nothing running or waiting: the true backlog is 0, the whole
difference is drift), at the first reading and after a counter reset (a vLLM restart: counters drop), and
lowered whenever the difference falls below it, so the backlog is never negative. Between idle moments the
drift is not removed: an IU that never idles while preempting can look busier than it is. Older vLLM (V0,
V1 before the prefix-cache counters) has no ``prefix_cache_queries_total``: the term is 0 there. Tokens the
prefix cache holds are not prefilled: V1 adds a lookup's hits to ``prefix_cache_hits_total`` with its queries
at admission, so the backlog counts only the share of the tokens looked up since the previous reading that
missed (a conversation's turn of 10,000 tokens with 9,000 cached is 1,000 tokens of prefill, not 10,000).

``prefill_tps``/``decode_tps`` are the IU's measured capacities: a decaying peak of the windowed token rates
(an IU is only measured at capacity while it is saturated; the peak halves every ``capacity_half_life_s``
so a slower IU is noticed) starting from priors until measured.

``seed``: the original design's formula, kept for comparison: ``0.3 x KV-cache GB + 0.5 x KV-cache age s +
0.2 x network MB/s``. vLLM exposes no KV-cache age; it is approximated with Little's law: the mean time a
request holds KV is ``running / completions per s``, and the mean age of the requests resident now is half
of that (uniform ages). With no completion in the rate window the age is at least the window.
KV-cache GB = kv_usage x the KV pool size (``kv_cache_gb`` of the IU, else 42% of the NVML memory used on the
IU's GPUs: Llama-3-70B BF16 on 4 x H100 at gpu_memory_utilization 0.9 holds ~110 GB of KV out of ~260 GB).

Missing or failed inputs never count as zero load: the score is None and the status ``warning``. A lost
GPU or volatile uncorrectable ECC errors make the IU ``critical``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.kernel_log import KernelLogReading
from eas_agent.collectors.network import NetReading
from eas_agent.collectors.vllm import VllmReading
from eas_agent.kernel_verdict import sxid_verdict
from eas_agent.vllm_metrics import VllmMetrics
from eas_agent.xid_verdict import XID_HOLD_S, xid_verdict
from eas_wire.scorebody import CollectorRun, no_collectors

PASSING, WARNING, CRITICAL = "passing", "warning", "critical"
# Each profile's score is the sum of weight x term over these components (the body carries the terms
# unweighted; `clusterctl scores` shows what each adds). drain's terms are seconds and add as they are;
# seed's follow the original design's weighting of KV occupancy, KV age and network rate.
SCORE_TERMS: dict[str, dict[str, float]] = {
    "drain": {"queue_s": 1.0, "kv_s": 1.0, "step_s": 1.0, "prefill_s": 1.0},
    "seed": {"kv_cache_gb": 0.3, "kv_cache_age_s": 0.5, "net_mb_per_s": 0.2},
}
KV_SHARE_OF_USED_MEMORY = 0.42
# vLLM leaves (1 - gpu_memory_utilization) of each GPU free (10% by default); much less than that free means
# another process is using the IU's GPUs and vLLM may hit CUDA OOM.
MIN_FREE_MEMORY_SHARE = 0.02


@dataclass(frozen=True)
class IUInputs:
    iu_id: str
    vllm: VllmReading
    gpus: tuple[GpuReading, ...] = ()
    net: NetReading | None = None
    kv_cache_gb: float | None = None  # configured KV pool size (seed profile)
    window_s: float = 5.0  # the collectors' rate window
    xid_hold_s: float = XID_HOLD_S  # how long a catalogued XID keeps the IU critical (eas_agent/xid_verdict.py)
    kernel: KernelLogReading | None = None  # the node's kernel log this cycle (None: not read)


@dataclass(frozen=True)
class ScoreResult:
    score: float | None
    status: str
    reason: str
    components: dict[str, float | None] = field(default_factory=dict)
    collectors: Mapping[str, CollectorRun] = field(default_factory=no_collectors)  # how each collector's run went

    def with_collectors(self, collectors: Mapping[str, CollectorRun]) -> ScoreResult:
        return ScoreResult(self.score, self.status, self.reason, self.components, collectors)


@dataclass(frozen=True)
class DrainParams:
    prefill_tps_prior: float = 8000.0  # prompt tokens/s of one IU before any measurement
    decode_tps_prior: float = 2000.0  # generated tokens/s (all sequences) before any measurement
    mean_prompt_tokens_prior: float = 1000.0
    residency_prior_s: float = 10.0
    kv_high: float = 0.9  # above this, new requests wait for KV to be freed
    frozen_after_s: float = 10.0  # token counters still while requests run: the engine is hung
    capacity_half_life_s: float = 300.0
    min_prefill_share: float = 0.1


class Capacity:
    """Decaying peak of a measured throughput; starts at the prior, never below a quarter of it."""

    def __init__(self, prior: float, half_life_s: float):
        self.prior, self.half_life_s = prior, half_life_s
        self.value = prior
        self.updated: float | None = None

    def update(self, now: float, measured: float | None) -> float:
        if self.updated is not None and now > self.updated:
            self.value *= 0.5 ** ((now - self.updated) / self.half_life_s)
        self.updated = now
        if measured is not None:
            self.value = max(self.value, measured)
        self.value = max(self.value, self.prior / 4)
        return self.value


class AdmittedBacklog:
    """Prompt tokens admitted but not yet prefilled: queries - prompt_tokens above an offset (module docstring)."""

    def __init__(self):
        self.offset: float | None = None
        self.last: tuple[float, float] | None = None  # (queries, prompt_tokens) of the previous reading
        self.last_hits: float | None = None  # prefix_cache_hits_total of the previous reading
        self.hit_share = 0.0  # of the prompt tokens looked up since the previous reading, the share found cached

    def update(self, m: VllmMetrics) -> float:
        """Prompt tokens admitted and still to be computed: the admitted tokens less the share of them the
        prefix cache held (vLLM V1 counts a lookup's hits with its queries at admission, and a hit is not
        prefilled). The share is that of the lookups since the previous reading (the backlog is the most
        recently admitted prompts); without new lookups the previous share stands."""
        queries, prompt = m.prefix_cache_queries_total, m.prompt_tokens_total
        if queries is None or prompt is None:  # V0 or V1 before the prefix-cache counters: no term
            return 0.0
        difference = queries - prompt
        reset = self.last is not None and (queries < self.last[0] or prompt < self.last[1])
        idle = not m.num_requests_running and not m.num_requests_waiting
        if self.offset is None or reset or idle or difference < self.offset:
            self.offset = difference
        hits = m.prefix_cache_hits_total
        if hits is None or reset or self.last is None or self.last_hits is None or hits < self.last_hits:
            self.hit_share = 0.0
        elif queries > self.last[0]:
            self.hit_share = min(1.0, max(0.0, (hits - self.last_hits) / (queries - self.last[0])))
        self.last, self.last_hits = (queries, prompt), hits
        return (difference - self.offset) * (1.0 - self.hit_share)


def gpu_problem(gpus: tuple[GpuReading, ...]) -> tuple[str, str] | None:
    """(status, reason) when a GPU of the IU is unusable or unreadable, else None."""
    for gpu in gpus:
        if gpu.lost:
            return CRITICAL, f"GPU {gpu.index} lost ({gpu.error or 'NVML'})"
        if gpu.ecc_volatile_uncorrectable:
            return (
                CRITICAL,
                f"GPU {gpu.index}: {gpu.ecc_volatile_uncorrectable} volatile uncorrectable ECC errors",
            )
    for gpu in gpus:
        if gpu.error:
            return WARNING, f"GPU {gpu.index}: {gpu.error}"
        if gpu.memory_total_mib and gpu.memory_used_mib is not None:
            free = gpu.memory_total_mib - gpu.memory_used_mib
            if free < MIN_FREE_MEMORY_SHARE * gpu.memory_total_mib:
                return (
                    WARNING,
                    f"GPU {gpu.index}: only {free:.0f} MiB free (another process on the IU's GPUs?)",
                )
    return None


def gpu_components(gpus: tuple[GpuReading, ...]) -> dict[str, float | None]:
    """Shown with the score for on-call (not part of it): mean utilization, least free memory, the IU's GPUs'
    XID events since the agent started and the latest one's XID."""
    utils = [g.utilization_pct for g in gpus if g.utilization_pct is not None]
    free = [
        g.memory_total_mib - g.memory_used_mib
        for g in gpus
        if g.memory_total_mib is not None and g.memory_used_mib is not None
    ]
    sources = [g for g in gpus if g.xid_events is not None]
    # the latest by its time (NVML's drain or the kernel log's record), the backend's order within one drain
    latest = max((g for g in gpus if g.xid_last is not None), key=lambda g: (g.xid_last_at or 0.0, g.xid_order),
                 default=None)
    return {
        "gpu_util_pct": round(sum(utils) / len(utils), 1) if utils else None,
        "gpu_min_free_mib": round(min(free)) if free else None,
        # read by the rollout's XID gate (operate/rollout_gates.py): a counter, None without an event source
        "xid_events": sum(g.xid_events for g in sources) if sources else None,
        "xid_last": latest.xid_last if latest else None,
        "xid_last_at": latest.xid_last_at if latest else None,
    }


def _unknown(reason: str, components: dict | None = None, status: str = WARNING) -> ScoreResult:
    return ScoreResult(score=None, status=status, reason=reason, components=components or {})


def _health_gate(inputs: IUInputs, now: float) -> ScoreResult | None:
    # an unscored IU still shows its GPUs: the XIDs that come with a lost GPU or a dead engine among them
    gpu = gpu_components(inputs.gpus) if inputs.gpus else None
    problem = gpu_problem(inputs.gpus)
    if problem and problem[0] == CRITICAL:
        return _unknown(problem[1], gpu, status=CRITICAL)
    xid = xid_verdict(inputs.gpus, now, inputs.xid_hold_s) or sxid_verdict(inputs.kernel, now, inputs.xid_hold_s)
    if xid:
        return _unknown(xid, gpu, status=CRITICAL)
    if inputs.vllm.metrics is None:
        return _unknown(f"vLLM metrics unavailable: {inputs.vllm.error}", gpu)
    bad = _bad_numbers(inputs.vllm)
    if bad:
        return _unknown("non-finite or negative input: " + ", ".join(bad), gpu)
    return None


def _bad_numbers(reading: VllmReading) -> list[str]:
    """Inputs no real engine can report (the parser rejects them; simulations and rates can still carry
    them): scoring them would give a NaN, infinite or negative score."""
    # vars(), not asdict(): this runs every cycle per IU and the record is flat
    values = {f"metrics.{k}": v for k, v in vars(reading.metrics).items() if isinstance(v, float)}
    values.update(
        prompt_tps=reading.prompt_tps,
        generation_tps=reading.generation_tps,
        preemptions_per_s=reading.preemptions_per_s,
        completions_per_s=reading.completions_per_s,
        mean_prompt_tokens=reading.mean_prompt_tokens,
    )
    return sorted(k for k, v in values.items() if v is not None and (not math.isfinite(v) or v < 0))


def _out_of_range(score: float) -> ScoreResult | None:
    if math.isfinite(score) and score >= 0:
        return None
    return _unknown(f"score out of range ({score!r}): inputs too large")


def _missing(values: dict[str, float | None]) -> list[str]:
    return [name for name, value in values.items() if value is None]


def drain_score(
    inputs: IUInputs,
    prefill: Capacity,
    decode: Capacity,
    now: float,
    params: DrainParams = DrainParams(),
    admitted: AdmittedBacklog | None = None,
) -> ScoreResult:
    gated = _health_gate(inputs, now)
    if gated:
        return gated
    reading, m = inputs.vllm, inputs.vllm.metrics
    required = {
        "vllm:num_requests_waiting": m.num_requests_waiting,
        "vllm:num_requests_running": m.num_requests_running,
        "vllm:kv_cache_usage_perc": m.kv_cache_usage,
        "vllm:prompt_tokens_total": m.prompt_tokens_total,
        "vllm:generation_tokens_total": m.generation_tokens_total,
    }
    missing = _missing(required)
    if missing:
        return _unknown("missing " + ", ".join(missing))
    waiting, running, kv = m.num_requests_waiting, m.num_requests_running, m.kv_cache_usage
    preempt = reading.preemptions_per_s or 0.0
    prefill_tps = prefill.update(now, reading.prompt_tps)
    decode_tps = decode.update(now, reading.generation_tps)
    mean_prompt = reading.mean_prompt_tokens or params.mean_prompt_tokens_prior
    prefill_eff = effective_prefill_tps(params, prefill_tps, preempt, mean_prompt)
    backlog = waiting * mean_prompt
    queue_s = backlog / prefill_eff
    if reading.completions_per_s:
        residency_s = running / reading.completions_per_s
    else:
        residency_s = params.residency_prior_s
    kv_s = max(0.0, kv - params.kv_high) * residency_s / kv if kv > 0 else 0.0
    step_s = running / decode_tps
    admitted_tokens = admitted.update(m) if admitted is not None else 0.0
    prefill_s = admitted_tokens / prefill_tps
    score = _weighted("drain", {"queue_s": queue_s, "kv_s": kv_s, "step_s": step_s, "prefill_s": prefill_s})
    if _out_of_range(score):
        return _out_of_range(score)
    components = {
        "waiting": waiting,
        "running": running,
        "kv_usage": round(kv, 4),
        "preemptions_per_s": round(preempt, 3),
        "mean_prompt_tokens": round(mean_prompt, 1),
        "backlog_tokens": round(backlog),
        "prefill_tps": round(prefill_tps, 1),
        "decode_tps": round(decode_tps, 1),
        "queue_s": round(queue_s, 4),
        "kv_s": round(kv_s, 4),
        "step_s": round(step_s, 4),
        "admitted_prefill_tokens": round(admitted_tokens),
        "prefill_s": round(prefill_s, 4),
        "request_cost_s": round(mean_prompt / prefill_eff, 4),
        "tokens_total": m.prompt_tokens_total + m.generation_tokens_total,
    }
    hit_rate = prefix_hit_rate(m)
    if hit_rate is not None:
        components["prefix_hit_rate"] = hit_rate
    return _finish(inputs, score, components, now, params.frozen_after_s)


def prefix_hit_rate(m) -> float | None:
    """The IU's prefix-cache hit rate for the edge's prefix index: V1's hits / queries since the engine
    started (token counters), else V0's gauge as exported (-1: prefix caching off); None: neither exported."""
    if m.prefix_cache_queries_total and m.prefix_cache_hits_total is not None:
        return round(min(1.0, m.prefix_cache_hits_total / m.prefix_cache_queries_total), 4)
    if m.prefix_cache_hit_rate is not None:
        return round(max(-1.0, min(1.0, m.prefix_cache_hit_rate)), 4)
    return None


def effective_prefill_tps(params: DrainParams, prefill_tps: float, preemptions_per_s: float,
                          mean_prompt: float) -> float:
    """The prefill rate left for queued work: preempted requests are prefilled again (at the mean prompt each),
    never below ``min_prefill_share`` of the measured rate."""
    return max(params.min_prefill_share * prefill_tps, prefill_tps - preemptions_per_s * mean_prompt)


def kv_age_s(running: float, completions_per_s: float | None, window_s: float) -> float:
    """Little's law: mean KV residency = running / completion rate; resident requests are half-way through."""
    if running <= 0:
        return 0.0
    if completions_per_s:
        return running / completions_per_s / 2
    return window_s


def kv_pool_gb(inputs: IUInputs) -> float | None:
    if inputs.kv_cache_gb is not None:
        return inputs.kv_cache_gb
    used = [g.memory_used_mib for g in inputs.gpus]
    if not used or any(u is None for u in used):
        return None
    return sum(used) * 2**20 / 1e9 * KV_SHARE_OF_USED_MEMORY


def _weighted(profile: str, terms: dict[str, float]) -> float:
    return sum(weight * terms[name] for name, weight in SCORE_TERMS[profile].items())


def seed_score(
    inputs: IUInputs, now: float, frozen_after_s: float = DrainParams.frozen_after_s
) -> ScoreResult:
    gated = _health_gate(inputs, now)
    if gated:
        return gated
    m = inputs.vllm.metrics
    pool = kv_pool_gb(inputs)
    # no NIC configured for the IU: no network term (0); a configured NIC that cannot be read: unknown
    net = inputs.net.mb_per_s if inputs.net is not None else 0.0
    required = {
        "vllm:kv_cache_usage_perc": m.kv_cache_usage,
        "vllm:num_requests_running": m.num_requests_running,
        "KV pool size (kv_cache_gb or NVML memory)": pool,
        "network counters": net,
    }
    missing = _missing(required)
    if missing:
        extra = f" ({', '.join(inputs.net.missing)})" if inputs.net is not None and inputs.net.missing else ""
        return _unknown("missing " + ", ".join(missing) + extra)
    kv_gb = m.kv_cache_usage * pool
    age = kv_age_s(m.num_requests_running, inputs.vllm.completions_per_s, inputs.window_s)
    score = _weighted("seed", {"kv_cache_gb": kv_gb, "kv_cache_age_s": age, "net_mb_per_s": net})
    if _out_of_range(score):
        return _out_of_range(score)
    components = {
        "kv_cache_gb": round(kv_gb, 3),
        "kv_cache_age_s": round(age, 3),
        "net_mb_per_s": round(net, 3),
        "kv_usage": round(m.kv_cache_usage, 4),
        "running": m.num_requests_running,
        "waiting": m.num_requests_waiting,
        "tokens_total": (m.prompt_tokens_total or 0) + (m.generation_tokens_total or 0),
    }
    return _finish(inputs, score, components, now, frozen_after_s)


def frozen_reason(inputs: IUInputs, now: float, frozen_after_s: float) -> str | None:
    """A live engine produces tokens every step while requests run; still counters mean a hung engine."""
    m, moved = inputs.vllm.metrics, inputs.vllm.tokens_last_moved
    if m is None or moved is None or not m.num_requests_running:
        return None
    still = now - moved
    if still < frozen_after_s:
        return None
    return f"token counters frozen for {still:.0f} s with {m.num_requests_running:g} requests running"


def _finish(
    inputs: IUInputs, score: float, components: dict, now: float, frozen_after_s: float
) -> ScoreResult:
    if inputs.gpus:
        components.update(gpu_components(inputs.gpus))
    problem = gpu_problem(inputs.gpus)
    if problem:  # a GPU we cannot read: keep the score (vLLM still answers) but warn
        return ScoreResult(round(score, 4), problem[0], problem[1], components)
    frozen = frozen_reason(inputs, now, frozen_after_s)
    if frozen:
        return ScoreResult(round(score, 4), WARNING, frozen, components)
    return ScoreResult(round(score, 4), PASSING, "", components)


class Scorer:
    """Per-IU scoring state (measured capacities, admitted-backlog offset) around the profile functions."""

    def __init__(self, profile: str = "drain", params: DrainParams = DrainParams()):
        if profile not in ("drain", "seed"):
            raise ValueError(f"unknown profile {profile!r}")
        self.profile, self.params = profile, params
        self.prefill = Capacity(params.prefill_tps_prior, params.capacity_half_life_s)
        self.decode = Capacity(params.decode_tps_prior, params.capacity_half_life_s)
        self.admitted = AdmittedBacklog()

    def score(self, inputs: IUInputs, now: float) -> ScoreResult:
        if self.profile == "seed":
            return seed_score(inputs, now, self.params.frozen_after_s)
        return drain_score(inputs, self.prefill, self.decode, now, self.params, self.admitted)
