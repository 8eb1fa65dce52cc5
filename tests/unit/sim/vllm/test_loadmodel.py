"""The simulated vLLM: continuous batching, KV filling and preemption show up in the metrics and the score."""

from __future__ import annotations

import random

import pytest

from eas_agent.collectors.vllm import VllmCollector
from eas_agent.score import IUInputs, Scorer
from sim.vllm.exposition import model_metrics
from sim.vllm.loadmodel import LoadModel, ModelParams

pytestmark = pytest.mark.unit


def run(model: LoadModel, seconds: float, step: float = 0.2):
    collector, scorer = VllmCollector(fetch=lambda: ""), Scorer("drain")
    results = []
    t = model.now
    while t < seconds:
        t += step
        model.advance(t)
        results.append(scorer.score(IUInputs("n-iu0", collector.observe(t, model_metrics(model))), t))
    return results


def test_light_load_runs_everything_with_no_queue():
    model = LoadModel(arrival_rate=1.0, seed=1)
    results = run(model, 60)
    assert model.success_total > 40 and not model.waiting and model.preemptions_total == 0
    # a snapshot taken while a prompt is mid-prefill scores its admitted-prefill seconds (the engine counts
    # prompt tokens at the first token, as vLLM V1 does), so the typical snapshot is what must be ~0
    scores = sorted(r.score for r in results[len(results) // 2:])
    assert scores[len(scores) // 2] < 0.05 and results[-1].components["queue_s"] == 0.0


def test_small_kv_pool_fills_and_preempts():
    params = ModelParams(num_gpu_blocks=3000, prompt_mean_tokens=3000, output_mean_tokens=600)
    model = LoadModel(params, arrival_rate=3.0, seed=2)
    results = run(model, 90)
    # KV swings when a long request finishes (the queue's head is admitted only when its chunk fits): the
    # typical snapshot of the second half is the "full" one, not whichever instant the run ends on
    kv = sorted(r.components["kv_usage"] for r in results[len(results) // 2:])
    assert model.preemptions_total > 0 and kv[len(kv) // 2] > 0.85 and model.waiting
    assert max(r.components["preemptions_per_s"] for r in results) > 0
    assert max(r.components["kv_s"] for r in results) > 0  # KV above the preemption level costs time
    assert results[-1].components["queue_s"] > 1.0 and results[-1].score > 1.0


def test_overload_builds_a_queue_and_measures_capacity():
    model = LoadModel(arrival_rate=20.0, seed=3)
    result = run(model, 40)[-1]
    assert len(model.waiting) > 50
    assert result.components["prefill_tps"] > 8000  # measured at saturation, above the prior
    assert result.components["queue_s"] > 2.0


def test_hung_engine_freezes_every_counter():
    model = LoadModel(arrival_rate=5.0, seed=4)
    model.advance(30)
    before = model_metrics(model)
    model.hung = True
    model.advance(60)
    assert model_metrics(model) == before


def _post(address: str, body: bytes):
    import urllib.error
    import urllib.request

    request = urllib.request.Request(f"http://{address}/v1/completions", data=body, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_completion_endpoint_serves_a_request_through_the_model():
    import json

    from sim.vllm.server import SimulatedIU

    with SimulatedIU("127.0.0.1", 0, arrival_rate=0) as sim:
        status, body = _post(sim.address, json.dumps({"prompt_tokens": 327, "max_tokens": 12}).encode())
        assert status == 200
        answer = json.loads(body)
        assert answer["completion_tokens"] == 12 and answer["prompt_tokens"] == 327
        assert 0 < answer["ttft_s"] < answer["e2e_s"] < 5
        assert sim.model.success_total == 1 and sim.model.prompt_tokens_total == 327
        status, body = _post(sim.address, b'{"max_tokens": 3}')
        assert status == 400 and b"prompt_tokens" in body


def _hits_of(prompts: list[list[int]]) -> tuple[int, int]:
    """(hit tokens, looked-up tokens) after serving ``prompts`` one after another on an otherwise idle IU."""
    model = LoadModel(arrival_rate=0.0)
    t = 0.0
    for ids in prompts:
        request = model.submit(len(ids), 8, ids)
        while request.finished_at is None:
            t += 0.5
            model.advance(t)
    return model.prefix_hits_total, model.prefix_queries_total


def test_prompts_with_token_ids_hit_the_blocks_an_earlier_prompt_computed():
    rng = random.Random(3)
    first = [rng.randrange(128_000) for _ in range(1000)]
    second = first + [rng.randrange(128_000) for _ in range(300)]  # the next turn: the first prompt, then more
    hits, queries = _hits_of([first, second])
    assert queries == 2300 and hits == 992  # the first prompt's 62 full blocks of 16
    unique = [[rng.randrange(128_000) for _ in range(1000)] for _ in range(3)]
    assert _hits_of(unique) == (0, 3000)
    assert _hits_of([[1] * 1008, [1] * 1008])[0] == 1007  # equal prompts of 63 full blocks: all but the last token


def test_prompts_of_unknown_content_keep_the_configured_hit_fraction():
    model = LoadModel(ModelParams(prefix_hit_fraction=0.25), arrival_rate=0.0)
    request = model.submit(1000, 8)
    model.advance(30.0)
    assert request.finished_at is not None
    assert (model.prefix_hits_total, model.prefix_queries_total) == (250, 1000)
    assert model.prefix_hit_rate == 0.25
