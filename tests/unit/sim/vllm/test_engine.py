"""sim/vllm's one engine model (engine.py on roofline.py): its building blocks, and the simulated vLLM server's
LoadModel driving that same engine (so the agent's inputs in the demo are what bench/route_sim.py routes on)."""

from __future__ import annotations

import random

import pytest

from sim.vllm.engine import InferenceUnit, Seq
from sim.vllm.eventloop import EventLoop
from sim.vllm.loadmodel import LoadModel, ModelParams
from sim.vllm.roofline import IUModel, decode_group_time, decode_steps_within
from sim.vllm.workload import draw_request_shape

pytestmark = pytest.mark.unit


def test_decode_group_closed_form_matches_step_by_step():
    model = IUModel()
    for batch, context in ((1, 300), (100, 250_000), (4000, 400_000)):  # memory-bound ... compute-bound
        coeffs = model.decode_step_linear(batch, context)
        overhead = model.engine.step_overhead_s
        for k in (1, 7, 120):
            brute = sum(max(coeffs[0] + coeffs[1] * i, coeffs[2] + coeffs[3] * i) + overhead for i in range(k))
            assert decode_group_time(coeffs, overhead, k) == pytest.approx(brute, rel=1e-9)
            assert decode_steps_within(coeffs, overhead, k, brute) == k
            assert decode_steps_within(coeffs, overhead, k, brute * 0.999) == k - 1


def test_roofline_numbers_are_the_documented_ones():
    model = IUModel()
    assert model.model.kv_bytes_per_token == 327_680
    assert 440_000 < model.kv_capacity_tokens < 455_000
    assert 12_000 < model.prefill_tokens_per_s < 13_000
    single = model.step_time(1, 300, 300)  # one sequence decoding: weights over HBM + overhead
    assert 0.015 < single < 0.019


def _run_one_iu(requests, model=None):
    loop = EventLoop()
    done: list[Seq] = []
    unit = InferenceUnit(0, "t-iu0", model or IUModel(), loop.schedule, lambda seq, now: done.append(seq))
    for seq, at in requests:
        loop.schedule(at, lambda s, now: unit.submit(s, now), seq)
    peak = [0]

    def watch(_arg, now):
        peak[0] = max(peak[0], unit.kv_used)
        if loop.pending():
            loop.schedule(now + 0.05, watch)

    loop.schedule(0.0, watch)
    loop.run()
    return unit, done, peak[0]


def test_iu_serves_every_token_and_preempts_when_kv_runs_out():
    rng = random.Random(3)
    shapes = [draw_request_shape(rng)[1:] for _ in range(400)]
    requests = [(Seq(i, p, o, 0.0, 0.0, 0), 0.0) for i, (p, o) in enumerate(shapes)]  # a burst: KV must run out
    unit, done, peak = _run_one_iu(requests)
    assert len(done) == len(requests)
    assert all(s.first_token is not None and s.done_at >= s.first_token for s in done)
    # every output token exactly once: a preempted request re-prefills what it had, it does not re-emit it
    assert unit.counters.generation_tokens == sum(o for _, o in shapes)
    assert unit.counters.preemptions > 0
    assert peak <= unit.capacity
    assert unit.kv_used == 0 and not unit.running and not unit.waiting


def test_short_request_queues_behind_a_long_prefill():
    long_first = [(Seq(0, 12_842, 10, 0.0, 0.0, 0), 0.0), (Seq(1, 327, 10, 0.001, 0.0, 0), 0.001)]
    _, done, _ = _run_one_iu(long_first)
    short = next(s for s in done if s.rid == 1)
    alone = IUModel().step_time(327, 327 * 327 / 2, 327)
    assert short.first_token - short.arrival > 10 * alone  # FCFS chunked prefill: it waits for the long one


def test_load_model_serves_a_lone_request_at_the_roofline_speed():
    # the server's engine is the route simulator's: a lone request's TTFT is one roofline prefill step and
    # each further token one decode step (not: its own coefficients, 12 ms + 80 us/token)
    model = LoadModel(arrival_rate=0.0, start=100.0)
    request = model.submit(327, 5)
    model.advance(110.0)
    roofline = IUModel()
    prefill = roofline.step_time(327, 327 * 327 / 2, 327)
    assert request.first_token_at - request.arrival == pytest.approx(prefill, rel=1e-9)
    decode = decode_group_time(roofline.decode_step_linear(1, 328), roofline.engine.step_overhead_s, 4)
    assert request.finished_at - request.first_token_at == pytest.approx(decode, rel=1e-9)
    assert request.generated == 5 and model.success_total == 1 and model.prompt_tokens_total == 327
    assert model.num_gpu_blocks == roofline.kv_capacity_tokens // 16  # the roofline's KV, in vLLM blocks


def test_load_model_streams_tokens_inside_a_decode_group():
    # the engine runs consecutive decode steps as one event; a streaming client must still see tokens as
    # each step ends, not in one burst at the group's end
    model = LoadModel(arrival_rate=0.0)
    request = model.submit(100, 200)
    model.advance(0.5)
    seen = request.generated
    model.advance(1.0)
    assert 0 < seen < request.generated < 200
    assert model.generation_tokens_total == request.generated


def test_load_model_hang_stalls_new_requests_and_resumes():
    model = LoadModel(arrival_rate=0.0)
    model.advance(1.0)
    model.hung = True
    request = model.submit(327, 3)
    model.advance(30.0)
    assert request.first_token_at is None and not model.waiting and not model.running
    model.hung = False
    model.advance(31.0)
    assert request.finished_at is not None and request.finished_at - request.arrival < 0.5


def test_load_model_small_kv_pool_is_in_blocks():
    model = LoadModel(ModelParams(num_gpu_blocks=100), arrival_rate=0.0)
    assert model.num_gpu_blocks == 100 and model.unit.capacity == 1600
    with pytest.raises(ValueError, match="KV capacity"):
        LoadModel(ModelParams(num_gpu_blocks=0))


def test_requests_longer_than_max_model_len_are_refused():
    # vLLM answers 400; the engine would otherwise re-prefill a sequence its KV can never hold
    from sim.vllm.openai_api import ApiError, parse_request

    with pytest.raises(ApiError, match="maximum context length is 32768"):
        parse_request(b'{"prompt_tokens": 32000, "max_tokens": 1000}', chat=False)
    assert parse_request(b'{"prompt_tokens": 32000, "max_tokens": 768}', chat=False)[1:] == (32000, 768)
    with pytest.raises(ValueError, match="max_model_len"):
        LoadModel(arrival_rate=0.0).submit(40_000, 1)
