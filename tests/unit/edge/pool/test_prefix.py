"""edge/pool/prefix.py: consistent text hashing, the per-IU index (bounded, common prefixes, forgetting),
the conversation key and its home IU, the cached-token estimate with V0's caching-off sentinel, and the
blocks an announcement relays and the placements an edge reads back."""

from __future__ import annotations

import pytest

from eas_wire.placed import MAX_BLOCKS, Placement, blocks_from_json
from edge.pool.prefix import (
    CHARS_PER_BLOCK,
    MAX_HASHED_BLOCKS,
    PrefixIndex,
    RelayedPlacements,
    cached_tokens,
    conversation_key,
    home_iu,
    prompt_prefix,
    relay_blocks,
    text_block_hashes,
)

pytestmark = pytest.mark.unit


def test_equal_leading_text_gives_equal_leading_hashes():
    a = text_block_hashes(["x" * CHARS_PER_BLOCK * 3, "tail-a"])
    b = text_block_hashes(["x" * CHARS_PER_BLOCK * 3, "tail-b" * 40])
    assert len(a) == 3 and b[:3] == a and len(b) > 3
    assert text_block_hashes(["y" + "x" * CHARS_PER_BLOCK * 3])[1:] != a[1:]  # chained on the parents
    assert text_block_hashes(["short"]) == ()


def test_match_finds_the_deepest_recorded_block_per_iu():
    index = PrefixIndex(stride=2)
    hashes = tuple(range(100, 110))
    index.record("iu-a", hashes[:5])  # blocks 2, 4 and the last (5) recorded
    index.record("iu-b", hashes)
    found, common = index.match(hashes)
    assert found == {"iu-a": 5, "iu-b": 10} and common == 0
    assert index.match(tuple(range(7)))[0] == {}


def test_a_prefix_recorded_on_many_ius_is_common():
    index = PrefixIndex(stride=1)
    template = (1, 2, 3)
    for i in range(8):
        index.record(f"iu-{i}", (*template, 1000 + i))
    found, common = index.match((*template, 5000))
    assert common == 3 and found == {}  # no IU is credited less than the common prefix


def test_the_index_is_bounded_per_iu_and_forgets_an_iu():
    index = PrefixIndex(stride=1, max_blocks_per_iu=16)
    for start in range(0, 400, 20):
        index.record("iu-a", tuple(range(start, start + 20)))
    assert index.entries() == 16
    assert len(index.holders) == 16
    index.forget("iu-a")
    assert index.entries() == 0 and not index.holders


def test_conversation_key_is_stable_across_turns_and_home_is_agreed():
    turn1 = ["system\0be brief\0", "user\0hello\0"]
    turn2 = [*turn1, "assistant\0hi\0", "user\0more\0"]
    turn3 = [*turn2, "assistant\0ok\0", "user\0again\0"]
    assert conversation_key(turn2) == conversation_key(turn3) != 0
    assert conversation_key(turn1) != conversation_key(turn2)  # two parts: keyed on the template alone
    assert conversation_key(["user\0only\0"]) == 0
    ius = [f"r01n{i:02d}-iu0" for i in range(32)]
    home = home_iu(conversation_key(turn2), ius)
    assert home == home_iu(conversation_key(turn3), list(reversed(ius)))
    others = [iu for iu in ius if iu != ius[0] or iu == home]
    assert home_iu(conversation_key(turn2), others) == home  # another IU leaving does not move it
    assert prompt_prefix(turn2).context_tokens == sum(len(p) for p in turn2[:-1]) // 4


def test_cached_tokens_respects_the_caching_off_sentinel():
    assert cached_tokens(10, 1000, None) == 160
    assert cached_tokens(10, 1000, 0.3) == 160
    assert cached_tokens(10, 1000, -1.0) == 0
    assert cached_tokens(100, 1000, None) == 999


def test_relay_blocks_carry_the_last_block_and_sampled_depths_the_index_matches():
    hashes = tuple(range(101, 101 + 300))  # 300 blocks
    blocks = relay_blocks(hashes, stride=8)
    assert len(blocks) <= MAX_BLOCKS and blocks[-1] == (300, hashes[-1])
    assert [d for d, _ in blocks[:-1]] == [8, 16, 24, 32, 48, 64, 96, 128, 192, 256]
    assert all(h == hashes[d - 1] for d, h in blocks)
    assert relay_blocks((), 8) == () and relay_blocks((7,), 8) == ((1, 7),)
    longest = relay_blocks(tuple(range(MAX_HASHED_BLOCKS)), 8)
    assert len(longest) == MAX_BLOCKS and blocks_from_json([list(p) for p in longest]) == longest
    index = PrefixIndex(stride=8)
    index.record_blocks("n1-iu3", blocks)
    next_turn = hashes + (9001, 9002)  # the conversation goes on: its last prompt's blocks lead this one
    assert index.match(next_turn) == ({"n1-iu3": 300}, 0)
    other_question = hashes[:70] + (5, 6, 7)  # shares the first 70 blocks: matched at the deepest sampled
    assert index.match(other_question) == ({"n1-iu3": 64}, 0)


def test_relayed_placements_are_taken_once_per_relay_number_and_bounded():
    relayed = RelayedPlacements(max_pending=3)
    first = (Placement(1, "n1-iu0", ((8, 1),)), Placement(2, "n1-iu1", ((8, 2),)))
    relayed.read("n1", first)
    relayed.read("n1", (*first, Placement(3, "n1-iu0", ((8, 3),))))  # the next body repeats the window
    relayed.read("n1", (Placement(4, "n2-iu0", ((8, 4),)),))  # an IU not of the body's node: never
    assert relayed.take() == [("n1-iu0", ((8, 1),)), ("n1-iu1", ((8, 2),)), ("n1-iu0", ((8, 3),))]
    assert relayed.take() == []
    relayed.read("n1", (Placement(1, "n1-iu0", ((8, 9),)),))  # numbering below the last: the agent restarted
    relayed.read("n2", tuple(Placement(s, "n2-iu0", ((8, s),)) for s in range(1, 6)))
    assert relayed.take() == [("n2-iu0", ((8, s),)) for s in (3, 4, 5)]  # the oldest went first
