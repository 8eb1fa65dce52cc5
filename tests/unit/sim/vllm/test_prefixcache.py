"""sim/vllm/prefixcache.py and the engine's use of it: chained block hashes, longest leading hit, LRU
eviction in free KV, a hit skipping its tokens' prefill, and V1's hit counters."""

from __future__ import annotations

import pytest

from sim.vllm.engine import InferenceUnit, Seq
from sim.vllm.eventloop import EventLoop
from sim.vllm.prefixcache import PrefixCache, block_hashes, token_block_hashes
from sim.vllm.roofline import IUModel

pytestmark = pytest.mark.unit


def test_blocks_chain_on_their_parents_and_only_full_blocks_count():
    a = block_hashes([(1, 40)], 16)
    assert len(a) == 2  # 40 tokens: two full blocks, the last 8 tokens are not cached
    b = block_hashes([(1, 32), (2, 16)], 16)
    assert b[:2] == a and len(b) == 3
    c = block_hashes([(9, 16), (1, 32)], 16)
    assert not set(c) & set(a)  # the same tokens after another first block hash differently


def test_token_id_blocks_chain_on_their_parents_and_only_full_blocks_count():
    ids = list(range(1000, 1040))
    a = token_block_hashes(ids, 16)
    assert len(a) == 2  # 40 ids: two full blocks
    assert token_block_hashes(ids + [7] * 30, 16)[:2] == a  # a longer prompt with this prefix: the same leading blocks
    moved = token_block_hashes([5] * 16 + ids, 16)
    assert not set(moved) & set(a)  # the same ids after another first block hash differently
    assert token_block_hashes(ids[:15], 16) == ()
    changed = token_block_hashes(ids[:17] + [0] + ids[18:], 16)
    assert changed[0] == a[0] and changed[1] != a[1]  # one id changed: its block and all after it differ


def test_the_hit_is_the_leading_run_and_never_the_whole_prompt():
    cache = PrefixCache(16)
    hashes = block_hashes([(1, 64)], 16)
    cache.store(hashes[:2])
    assert cache.hit_tokens(hashes, 64) == 32
    cache.store(hashes)
    assert cache.hit_tokens(hashes, 64) == 63  # the last token is always computed
    cache.blocks.pop(hashes[0])
    assert cache.hit_tokens(hashes, 64) == 0  # a missing first block: nothing after it is usable


def test_eviction_drops_the_least_recently_used_first():
    cache = PrefixCache(16)
    old, new = block_hashes([(1, 32)], 16), block_hashes([(2, 32)], 16)
    cache.store(old)
    cache.store(new)
    cache.hit_tokens(old, 100)  # touched: now the most recent
    cache.fit(32)
    assert cache.peek(old) == 2 and cache.peek(new) == 0 and cache.evictions == 2


def test_caching_off_finds_nothing():
    cache = PrefixCache(16, enabled=False)
    hashes = block_hashes([(1, 64)], 16)
    cache.store(hashes)
    assert cache.hit_tokens(hashes, 64) == 0


def _serve(prefix_caching: bool) -> tuple[InferenceUnit, list[Seq]]:
    loop = EventLoop()
    done: list[Seq] = []
    unit = InferenceUnit(0, "iu", IUModel(), loop.schedule, lambda seq, now: done.append(seq),
                         prefix_caching=prefix_caching)
    template = (1, 4000)
    first = Seq(0, 4100, 4, 0.0, 0.0, 0, block_hashes([template, (2, 100)]))
    second = Seq(1, 4100, 4, 1.0, 0.0, 0, block_hashes([template, (3, 100)]))
    loop.schedule(0.0, lambda _a, now: unit.submit(first, now))
    loop.schedule(1.0, lambda _a, now: unit.submit(second, now))
    loop.run()
    return unit, done


def test_a_hit_skips_the_cached_prefill_and_is_counted():
    cached, done = _serve(True)
    cold, cold_done = _serve(False)
    ttft = {s.rid: s.first_token - s.arrival for s in done}
    cold_ttft = {s.rid: s.first_token - s.arrival for s in cold_done}
    assert ttft[0] == pytest.approx(cold_ttft[0])
    assert ttft[1] < 0.2 * cold_ttft[1]  # 4,000 of 4,100 tokens were cached
    assert cached.counters.prefix_cache_hits == 4000 and cached.counters.prefix_cache_queries == 8200
    assert cold.counters.prefix_cache_hits == 0
