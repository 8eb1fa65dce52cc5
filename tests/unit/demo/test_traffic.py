"""The demo's prompts (demo/traffic.py DemoPrompts): single turns of unique token ids, and a share of next
turns that start with their conversation's previous prompt and answer."""

from __future__ import annotations

import random

import pytest

from demo.traffic import MULTI_TURN_SHARE, DemoPrompts, answer_ids
from sim.vllm.workload import MAX_MODEL_LEN

pytestmark = pytest.mark.unit


def draws(n: int, seed: int = 0, **kwargs) -> list[tuple[list[int], int, int, int]]:
    """(prompt, max tokens, conversation key, turn) of ``n`` arrivals."""
    prompts = DemoPrompts(random.Random(seed), **kwargs)
    out = []
    for _ in range(n):
        prompt, output, conversation = prompts.draw()
        out.append((list(prompt), output, conversation.key, conversation.turn))
    return out


def test_each_next_turn_starts_with_the_previous_prompt_and_its_answer():
    last: dict[int, tuple[list[int], int]] = {}
    next_turns = 0
    for prompt, output, key, turn in draws(600):
        assert len(prompt) + output <= MAX_MODEL_LEN
        if turn > 1:
            previous, answered = last[key]
            answer = answer_ids(key, turn - 1, answered)
            assert prompt[:len(previous)] == previous
            assert prompt[len(previous):len(previous) + answered] == answer
            assert len(prompt) > len(previous) + answered  # and a new user message
            next_turns += 1
        last[key] = (prompt, output)
    assert 0.8 * MULTI_TURN_SHARE < next_turns / 600 < 1.2 * MULTI_TURN_SHARE


def test_single_turns_share_no_prefix():
    firsts = [prompt for prompt, _, _, turn in draws(300) if turn == 1]
    assert len(firsts) > 150
    assert len({tuple(p[:16]) for p in firsts if len(p) >= 16}) == len([p for p in firsts if len(p) >= 16])
    assert all(len(set(p)) > len(p) // 2 for p in firsts)  # random ids, not one repeated token


def test_prompts_are_seeded_and_answers_deterministic():
    assert draws(50, seed=7) == draws(50, seed=7) != draws(50, seed=8)
    assert answer_ids(3, 2, 40) == answer_ids(3, 2, 40) != answer_ids(3, 3, 40)


def test_only_a_few_dozen_conversations_stay_open():
    prompts = DemoPrompts(random.Random(1), open_conversations=4)
    for _ in range(200):
        prompts.draw()
        assert len(prompts.open) <= 4
    with pytest.raises(ValueError, match="multi_turn_share"):
        DemoPrompts(random.Random(1), multi_turn_share=1.0)
