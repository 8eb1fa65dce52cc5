"""Score profiles: drain in seconds, seed's formula, unknown inputs never count as zero load."""

from __future__ import annotations

from dataclasses import replace

import pytest

from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.network import NetReading
from eas_agent.collectors.vllm import VllmReading
from eas_agent.score import Capacity, DrainParams, IUInputs, Scorer, drain_score, kv_age_s, seed_score
from eas_agent.vllm_metrics import VllmMetrics

pytestmark = pytest.mark.unit


def reading(running=10.0, waiting=0.0, kv=0.3, **rates) -> VllmReading:
    metrics = VllmMetrics(
        schema="v1",
        num_requests_running=running,
        num_requests_waiting=waiting,
        kv_cache_usage=kv,
        prompt_tokens_total=1e6,
        generation_tokens_total=2e5,
        num_preemptions_total=0.0,
        request_success_total=900.0,
    )
    defaults = {
        "prompt_tps": 4000.0,
        "generation_tps": 1500.0,
        "preemptions_per_s": 0.0,
        "completions_per_s": 5.0,
        "mean_prompt_tokens": 1000.0,
    }
    return VllmReading(metrics=metrics, **{**defaults, **rates})


def gpus(**kw):
    return tuple(
        GpuReading(
            index=i,
            memory_used_mib=73400,
            memory_total_mib=81559,
            utilization_pct=90,
            ecc_volatile_uncorrectable=0,
            **kw,
        )
        for i in range(4)
    )


PARAMS = DrainParams(prefill_tps_prior=8000, decode_tps_prior=2000)


def drain(vllm, params=PARAMS, gpu=None):
    return drain_score(
        IUInputs("n-iu0", vllm, gpu if gpu is not None else gpus()),
        Capacity(params.prefill_tps_prior, 300),
        Capacity(params.decode_tps_prior, 300),
        0.0,
        params,
    )


def test_drain_is_seconds_of_queue_kv_and_step():
    result = drain(reading(running=20, waiting=16, kv=0.95))
    c = result.components
    assert c["queue_s"] == pytest.approx(16 * 1000 / 8000)  # backlog / prefill capacity (prior > measured)
    assert c["kv_s"] == pytest.approx((0.95 - 0.9) * (20 / 5.0) / 0.95, rel=1e-3)  # Little's law residency
    assert c["step_s"] == pytest.approx(20 / 2000)
    assert result.score == pytest.approx(c["queue_s"] + c["kv_s"] + c["step_s"], abs=1e-3)
    assert result.status == "passing" and c["request_cost_s"] == pytest.approx(0.125)


def test_drain_orders_loads_and_idle_is_near_zero():
    idle = drain(reading(running=0, waiting=0, kv=0.0, prompt_tps=0.0, generation_tps=0.0)).score
    busy = drain(reading(running=120, waiting=0, kv=0.6)).score
    queued = drain(reading(running=250, waiting=40, kv=0.97)).score
    assert idle == 0.0 and 0 < busy < queued


def test_measured_capacity_beats_prior_so_faster_iu_scores_lower():
    slow = drain(reading(waiting=10, prompt_tps=6000.0))
    fast = drain(reading(waiting=10, prompt_tps=16000.0))
    assert fast.components["prefill_tps"] == 16000.0 and fast.score < slow.score


def test_preemptions_eat_prefill_capacity():
    calm = drain(reading(waiting=10))
    thrashing = drain(reading(waiting=10, preemptions_per_s=4.0))
    assert thrashing.components["preemptions_per_s"] == 4.0 and thrashing.score > calm.score


def test_capacity_decays_towards_measurements_but_not_below_a_quarter_of_prior():
    cap = Capacity(8000, half_life_s=10)
    assert cap.update(0, 12000) == 12000
    assert cap.update(10, None) == pytest.approx(6000)
    assert cap.update(100, None) == 2000


@pytest.mark.parametrize(
    "vllm, words",
    [
        (VllmReading(metrics=None, error="GET 127.0.0.1:8000/metrics: timed out"), "unavailable"),
        (
            VllmReading(
                metrics=VllmMetrics(
                    schema=None,
                    num_requests_running=3.0,
                    num_requests_waiting=None,
                    kv_cache_usage=None,
                    prompt_tokens_total=1.0,
                    generation_tokens_total=1.0,
                )
            ),
            "vllm:kv_cache_usage_perc",
        ),
    ],
)
def test_missing_inputs_give_unknown_score_and_warning(vllm, words):
    for result in (drain(vllm), seed_score(IUInputs("n-iu0", vllm, gpus(), NetReading(1e6, 2e6)), 0.0)):
        assert result.score is None and result.status == "warning" and words in result.reason


def test_lost_gpu_or_ecc_is_critical():
    lost = drain(reading(), gpu=(GpuReading(index=2, lost=True, error="GPU is lost"),))
    ecc = drain(reading(), gpu=(GpuReading(index=1, memory_used_mib=1, ecc_volatile_uncorrectable=3),))
    assert (lost.status, lost.score) == ("critical", None) and "GPU 2 lost" in lost.reason
    assert ecc.status == "critical" and "3 volatile uncorrectable ECC" in ecc.reason


def test_an_iu_without_a_score_still_publishes_its_xid_events():
    """XIDs come with the failures that leave an IU unscored (a GPU off the bus, an engine that died on a GPU
    fault): the rollout's XID gate must still see them."""
    xids = (GpuReading(index=0, lost=True, error="GPU is lost", xid_events=2, xid_last=79, xid_order=5),
            *gpus(xid_events=1, xid_last=13, xid_order=3)[1:])
    lost = drain(reading(), gpu=xids)
    down = drain(VllmReading(metrics=None, error="connection refused"), gpu=gpus(xid_events=1, xid_last=13))
    assert (lost.status, lost.components["xid_events"], lost.components["xid_last"]) == ("critical", 5, 79)
    assert (down.score, down.components["xid_events"]) == (None, 4)


def test_a_recent_catalogued_xid_gates_the_score_critical_until_its_hold_ends():
    recent = drain(reading(), gpu=gpus(xid_events=1, xid_last=95, xid_order=1, xid_last_at=-10.0))
    assert (recent.status, recent.score) == ("critical", None)
    assert recent.reason.startswith("GPU 0: XID 95 ROBUST_CHANNEL_UNCONTAINED_ERROR 10 s ago")
    assert recent.components["xid_last"] == 95 and recent.components["xid_last_at"] == -10.0
    held = drain_score(IUInputs("n-iu0", reading(), gpus(xid_last=95, xid_order=1, xid_last_at=-10.0),
                                xid_hold_s=5.0), Capacity(PARAMS.prefill_tps_prior, 300),
                       Capacity(PARAMS.decode_tps_prior, 300), 0.0, PARAMS)
    assert held.status == "passing" and held.score is not None


def test_seed_formula_with_littles_law_age():
    inputs = IUInputs(
        "n-iu0",
        reading(running=40, kv=0.5, completions_per_s=4.0),
        gpus(),
        NetReading(netdev_bytes_per_s=3e6, rdma_bytes_per_s=5e6),
        kv_cache_gb=110.0,
    )
    result = seed_score(inputs, 0.0)
    c = result.components
    assert c["kv_cache_gb"] == 55.0 and c["kv_cache_age_s"] == 5.0 and c["net_mb_per_s"] == 5.0
    assert result.score == pytest.approx(0.3 * 55 + 0.5 * 5 + 0.2 * 5)


def test_seed_kv_pool_from_nvml_when_not_configured_and_missing_net_is_unknown():
    with_nvml = seed_score(IUInputs("n-iu0", reading(kv=0.5), gpus(), NetReading(0.0, 0.0)), 0.0)
    assert with_nvml.components["kv_cache_gb"] == pytest.approx(
        0.5 * 4 * 73400 * 2**20 / 1e9 * 0.42, rel=1e-3
    )
    no_net = seed_score(IUInputs("n-iu0", reading(), gpus(), NetReading(None, None, ("ibp24s0",))), 0.0)
    assert no_net.score is None and "network counters" in no_net.reason and "ibp24s0" in no_net.reason


def test_kv_age_without_completions_is_at_least_the_window():
    assert kv_age_s(0, None, 5.0) == 0.0 and kv_age_s(10, None, 5.0) == 5.0 and kv_age_s(10, 2.0, 5.0) == 2.5


def test_scorer_keeps_capacity_state_between_cycles():
    scorer = Scorer("drain")
    scorer.score(IUInputs("n-iu0", reading(prompt_tps=20000.0), gpus()), 0.0)
    later = scorer.score(IUInputs("n-iu0", reading(waiting=5, prompt_tps=100.0), gpus()), 1.0)
    assert later.components["prefill_tps"] > 19000


def test_frozen_token_counters_with_running_requests_warn():
    hung = drain_score(
        IUInputs("n-iu0", reading(running=8, tokens_last_moved=100.0), gpus()),
        Capacity(8000, 300),
        Capacity(2000, 300),
        112.0,
        PARAMS,
    )
    assert hung.status == "warning" and "frozen for 12 s with 8 requests running" in hung.reason
    assert hung.score is not None  # the score is kept (the reader's anomaly check decides what to do)
    idle = drain_score(
        IUInputs("n-iu0", reading(running=0, tokens_last_moved=100.0), gpus()),
        Capacity(8000, 300),
        Capacity(2000, 300),
        112.0,
        PARAMS,
    )
    assert idle.status == "passing"  # idle engines legitimately have still counters


def test_gpu_memory_is_health_not_load():
    full = tuple(
        GpuReading(
            index=i,
            memory_used_mib=81000,
            memory_total_mib=81559,
            utilization_pct=90,
            ecc_volatile_uncorrectable=0,
        )
        for i in range(4)
    )
    crowded = drain(reading(), gpu=full)
    normal = drain(reading())
    assert crowded.score == normal.score  # memory never enters the score
    assert crowded.status == "warning" and "only 559 MiB free" in crowded.reason
    assert normal.components["gpu_util_pct"] == 90 and normal.components["gpu_min_free_mib"] == 8159


def test_seed_without_configured_nics_has_no_network_term():
    result = seed_score(
        IUInputs(
            "n-iu0", reading(running=10, kv=0.2, completions_per_s=2.0), gpus(), None, kv_cache_gb=100.0
        ),
        0.0,
    )
    assert result.score == pytest.approx(0.3 * 20 + 0.5 * 2.5) and result.components["net_mb_per_s"] == 0.0


def backlog_reading(queries, prompt, running=4.0, waiting=0.0) -> VllmReading:
    """Parser-independent: only the counters the admitted-backlog term reads, on the drain defaults."""
    base = reading(running=running, waiting=waiting, prompt_tps=0.0)
    metrics = replace(base.metrics, prefix_cache_queries_total=queries, prompt_tokens_total=prompt)
    return replace(base, metrics=metrics)


def scored(scorer, queries, prompt, now, **kw):
    return scorer.score(IUInputs("n-iu0", backlog_reading(queries, prompt, **kw), gpus()), now)


def test_admitted_prefill_backlog_appears_and_clears():
    scorer = Scorer("drain", PARAMS)
    idle = scored(scorer, 5_000.0, 4_000.0, 0.0, running=0.0)  # idle: the 1,000 of drift is the offset
    assert idle.components["admitted_prefill_tokens"] == 0 and idle.components["prefill_s"] == 0.0
    # a 12,000-token prompt admitted (queries grow at admission), prefilling in chunks: counted as running
    busy = scored(scorer, 17_000.0, 4_000.0, 0.2)
    c = busy.components
    assert c["admitted_prefill_tokens"] == 12_000
    assert c["prefill_s"] == pytest.approx(12_000 / c["prefill_tps"], rel=1e-3)  # over the prefill capacity
    assert busy.score == pytest.approx(c["queue_s"] + c["kv_s"] + c["step_s"] + c["prefill_s"], abs=1e-3)
    half = scored(scorer, 17_000.0, 4_000.0, 0.4)
    assert half.components["admitted_prefill_tokens"] == 12_000  # not yet at its first token
    done = scored(scorer, 17_000.0, 16_000.0, 0.6)  # first token: prompt_tokens catch up
    assert done.components["admitted_prefill_tokens"] == 0 and done.score < busy.score


def test_admitted_backlog_rezeroes_when_idle():
    scorer = Scorer("drain", PARAMS)
    scored(scorer, 0.0, 0.0, 0.0, running=0.0)
    # a preempted 3,000-token request was recomputed: queries count it twice, prompt_tokens once
    drifted = scored(scorer, 6_000.0, 3_000.0, 1.0)
    assert drifted.components["admitted_prefill_tokens"] == 3_000  # drift, while busy it cannot be told apart
    idle = scored(scorer, 6_000.0, 3_000.0, 2.0, running=0.0, waiting=0.0)
    assert idle.components["admitted_prefill_tokens"] == 0
    later = scored(scorer, 6_500.0, 3_000.0, 3.0)  # measured from the new offset
    assert later.components["admitted_prefill_tokens"] == 500


def test_admitted_backlog_after_counter_reset_is_never_negative():
    scorer = Scorer("drain", PARAMS)
    scored(scorer, 900_000.0, 800_000.0, 0.0, running=0.0)  # offset 100,000 of drift
    restarted = scored(scorer, 2_000.0, 1_500.0, 1.0)  # vLLM restarted: counters dropped, difference 500
    assert restarted.components["admitted_prefill_tokens"] == 0  # re-zeroed, not 500 - 100,000
    grown = scored(scorer, 5_000.0, 1_500.0, 2.0)
    assert grown.components["admitted_prefill_tokens"] == 3_000
    caught_up = scored(scorer, 5_000.0, 5_000.0, 3.0)  # difference below the offset: lowered, not negative
    assert caught_up.components["admitted_prefill_tokens"] == 0 and caught_up.components["prefill_s"] == 0.0


def test_admitted_backlog_without_prefix_cache_counter_is_zero():
    scorer = Scorer("drain", PARAMS)
    for now, prompt in ((0.0, 1e6), (1.0, 1e6 + 5000)):  # V0 / older V1: no prefix_cache_queries_total
        result = scored(scorer, None, prompt, now)
        assert result.score is not None and result.status == "passing"
        assert result.components["admitted_prefill_tokens"] == 0 and result.components["prefill_s"] == 0.0



def cached_reading(queries, prompt, hits, running=4.0) -> VllmReading:
    base = backlog_reading(queries, prompt, running=running)
    return replace(base, metrics=replace(base.metrics, prefix_cache_hits_total=hits))


def test_admitted_backlog_leaves_out_what_the_prefix_cache_held():
    """A conversation's turn of 10,000 tokens whose first 9,000 were cached costs 1,000 tokens of prefill:
    vLLM V1 counts the lookup's 9,000 hits with its 10,000 queries at admission."""
    scorer = Scorer("drain", PARAMS)
    scorer.score(IUInputs("n-iu0", cached_reading(5_000.0, 4_000.0, 0.0, running=0.0), gpus()), 0.0)
    admitted = scorer.score(IUInputs("n-iu0", cached_reading(15_000.0, 4_000.0, 9_000.0), gpus()), 0.2)
    assert admitted.components["admitted_prefill_tokens"] == 1_000
    assert admitted.components["prefill_s"] == pytest.approx(1_000 / admitted.components["prefill_tps"], rel=1e-3)
    waiting = scorer.score(IUInputs("n-iu0", cached_reading(15_000.0, 4_000.0, 9_000.0), gpus()), 0.4)
    assert waiting.components["admitted_prefill_tokens"] == 1_000  # no new lookup: the share stands
    uncached = scorer.score(IUInputs("n-iu0", cached_reading(17_000.0, 14_000.0, 9_000.0), gpus()), 0.6)
    assert uncached.components["admitted_prefill_tokens"] == 2_000  # a 2,000-token prompt found nothing cached


def test_admitted_backlog_counts_every_token_without_a_hits_counter_or_after_a_reset():
    scorer = Scorer("drain", PARAMS)
    scorer.score(IUInputs("n-iu0", backlog_reading(5_000.0, 4_000.0, running=0.0), gpus()), 0.0)
    plain = scorer.score(IUInputs("n-iu0", backlog_reading(15_000.0, 4_000.0), gpus()), 0.2)
    assert plain.components["admitted_prefill_tokens"] == 10_000  # no prefix_cache_hits: nothing left out
    scorer = Scorer("drain", PARAMS)
    scorer.score(IUInputs("n-iu0", cached_reading(50_000.0, 40_000.0, 30_000.0, running=0.0), gpus()), 0.0)
    restarted = scorer.score(IUInputs("n-iu0", cached_reading(10_000.0, 0.0, 500.0), gpus()), 0.2)
    assert restarted.components["admitted_prefill_tokens"] == 0  # counters dropped: re-zeroed, no share known
    after = scorer.score(IUInputs("n-iu0", cached_reading(14_000.0, 0.0, 2_500.0), gpus()), 0.4)
    assert after.components["admitted_prefill_tokens"] == 2_000  # 4,000 admitted, half of them cached
