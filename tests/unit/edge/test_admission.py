"""The edge's queue (edge.admission through EdgeState): first come, first served; busy is a 429 with the
predicted wait, unavailable a 503."""

from __future__ import annotations

import asyncio
import random
from dataclasses import replace

import pytest

from edge.config import EdgeConfig
from edge.feed import EdgeView
from edge.metrics import EdgeMetrics
from edge.proxy import EdgeState
from edge.routing import Router

pytestmark = pytest.mark.unit


def one_iu_state(**config) -> EdgeState:
    view = EdgeView()
    view.apply_health([{"Node": {"Node": "n0"}, "Service": {"Service": "vllm-iu-n0", "ID": "n0-iu0", "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": "n0"}},
                        "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]}])
    return EdgeState(replace(EdgeConfig(), **config), view, Router(random.Random(1), max_inflight_per_iu=1),
                     EdgeMetrics())


def test_a_freed_slot_goes_to_the_oldest_waiter_even_when_a_new_request_arrives_at_that_moment():
    async def scenario():
        state = one_iu_state(max_queue=8, queue_timeout_s=5.0)
        order: list[str] = []

        async def request(name: str, hold_s: float = 0.01):
            decision = await state.acquire(None, set())
            order.append(name)
            await asyncio.sleep(hold_s)
            state.release(decision.iu_id)

        held = await state.acquire(None, set())
        waiters = []
        for name in ("w1", "w2"):
            waiters.append(asyncio.create_task(request(name)))
            await asyncio.sleep(0)
        assert len(state.waiters) == 2

        async def release_and_arrive():  # the slot frees and a new request arrives in the same instant
            state.release(held.iu_id)
            await request("late")

        await asyncio.wait_for(asyncio.gather(release_and_arrive(), *waiters), 5)
        assert order == ["w1", "w2", "late"]
        return state

    asyncio.run(scenario())


def test_a_full_queue_is_busy_with_the_wait_predicted_from_the_drain_rate_and_no_iu_is_unavailable():
    async def scenario():
        state = one_iu_state(max_queue=2, queue_timeout_s=5.0)
        for _ in range(4):  # four requests served one after the other: 4 slots freed in the last 10 s
            decision = await state.acquire(None, set())
            state.release(decision.iu_id)
        held = await state.acquire(None, set())
        queued = [asyncio.create_task(state.acquire(None, set())) for _ in range(2)]
        await asyncio.sleep(0)
        with pytest.raises(Exception) as info:
            await state.acquire(None, set())
        busy = info.value
        assert type(busy).__name__ == "Busy" and busy.reason == "queue_full"
        assert busy.retry_after_s == 8  # 2 ahead + this one, at 4 per 10 s: 7.5 s
        for task in queued:
            task.cancel()
        await asyncio.gather(*queued, return_exceptions=True)
        assert len(state.waiters) == 0
        state.release(held.iu_id)
        state.view.apply_health([])  # nothing registered: unavailable, not busy
        with pytest.raises(Exception) as info:
            await state.acquire(None, set())
        assert type(info.value).__name__ == "Unavailable" and info.value.reason == "no_healthy_iu"

    asyncio.run(scenario())


def test_a_request_for_another_model_never_waits_behind_a_queue_it_does_not_compete_with():
    async def scenario():
        state = one_iu_state(max_queue=8, queue_timeout_s=5.0)
        state.view.apply_health([
            {"Node": {"Node": f"n{n}"}, "Service": {"Service": f"vllm-iu-n{n}", "ID": iu, "Address": "127.0.0.1", "Port": 8000 + n, "Meta": {"node": f"n{n}", "model": m}},
             "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]}
            for n, (iu, m) in enumerate((("n0-iu0", "model-a"), ("n1-iu0", "model-b")))])
        not_a, not_b = frozenset({"n1-iu0"}), frozenset({"n0-iu0"})
        held = await state.acquire(None, set(), not_serving=not_a)
        assert held.iu_id == "n0-iu0"
        queued = asyncio.create_task(state.acquire(None, set(), not_serving=not_a))
        await asyncio.sleep(0)
        assert len(state.waiters) == 1
        other = await asyncio.wait_for(state.acquire(None, set(), not_serving=not_b), 1)
        assert other.iu_id == "n1-iu0"
        state.release(held.iu_id)
        assert (await asyncio.wait_for(queued, 1)).iu_id == "n0-iu0"

    asyncio.run(scenario())
