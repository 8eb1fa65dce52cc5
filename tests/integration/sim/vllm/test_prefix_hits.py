"""The stand-in vLLM process hashes the prompts it is sent: a conversation's next turns hit the blocks of the
turns before (``vllm:prefix_cache_hits`` rises with them), unique prompts hit nothing."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.integration

HOST = "127.0.76.41"


@pytest.fixture
def sim_url():
    """http://HOST:PORT of a ``python -m sim.vllm`` process with no background load."""
    process = subprocess.Popen([sys.executable, "-m", "sim.vllm", "--iu", f"{HOST}:0:0", "--warmup-s", "0"],
                               stdout=subprocess.PIPE, text=True)
    try:
        metrics_url = process.stdout.readline().strip()
        assert metrics_url.endswith("/metrics"), metrics_url
        yield metrics_url.removesuffix("/metrics")
    finally:
        process.terminate()
        process.wait(timeout=10)


def complete(url: str, prompt: list[int], max_tokens: int = 4) -> dict:
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"{url}/v1/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.load(answer)


def prefix_counters(url: str) -> tuple[float, float]:
    """(vllm:prefix_cache_queries_total, vllm:prefix_cache_hits_total) as the process exposes them."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=5) as answer:
        text = answer.read().decode()
    values = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    return values["vllm:prefix_cache_queries_total"], values["vllm:prefix_cache_hits_total"]


def test_a_conversation_hits_its_earlier_turns_and_unique_prompts_do_not(sim_url):
    rng = random.Random(41)

    def ids(n: int) -> list[int]:
        return [rng.randrange(128_256) for _ in range(n)]

    for _ in range(3):
        complete(sim_url, ids(800))
    queries, hits = prefix_counters(sim_url)
    assert queries == 2400 and hits == 0

    prompt, seen = ids(800), []
    for _ in range(4):  # each turn: the previous prompt, an answer and a new user message
        complete(sim_url, prompt)
        seen.append(prefix_counters(sim_url))
        prompt = prompt + ids(200) + ids(100)
    hits_per_turn = [later[1] - earlier[1] for earlier, later in zip(seen, seen[1:], strict=False)]
    assert seen[0][1] == hits  # the first turn is new
    assert hits_per_turn == [800, 1088, 1392]  # each turn hits the full blocks of the one before
    assert seen[-1][0] - queries == 800 + 1100 + 1400 + 1700
