"""vLLM's automatic prefix caching, as the engine model uses it.

vLLM hashes a prompt in full blocks of ``block_size`` tokens (16 by default); block i's hash covers the
hash of block i-1 and block i's own token ids (V1: ``hash_block_tokens(parent_block_hash,
curr_block_token_ids, extra_keys)`` in ``vllm/v1/core/kv_cache_utils.py``; V0:
``PrefixCachingBlockAllocator.hash_block_tokens(is_first_block, prev_block_hash, cur_block_token_ids)`` in
``vllm/core/block/prefix_caching_block.py``). Equal hashes therefore mean equal tokens from the start of
the prompt, so a lookup walks the prompt's hashes from the first and stops at the first miss
(``find_longest_cache_hit``); only full blocks are cached, and at least the prompt's last token is always
computed (the scheduler needs its logits). Blocks no running sequence holds stay cached until their memory
is needed, then the least recently used goes first (V1's free-block queue).

The simulation has no token ids: a prompt is a sequence of *segments* (a system template, a conversation's
messages, a reply), each a (content id, tokens) pair, and a block's "token ids" are the pieces of segments
it covers. :func:`block_hashes` chains them as vLLM chains token ids, so two prompts share exactly the
leading blocks whose tokens they share. A request that does carry its prompt (the stand-in server's OpenAI
API) is hashed from its token ids by :func:`token_block_hashes`, chained the same way.

Memory: cached blocks live in the KV memory running sequences do not use (:meth:`PrefixCache.fit`); the
engine counts a hit's blocks against the admitted sequence like any other (vLLM shares them between
sequences; counting them per sequence overstates KV use when many running sequences share one template).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

DEFAULT_BLOCK_SIZE = 16  # vLLM's --block-size default on CUDA


def block_hashes(segments: Sequence[tuple[int, int]], block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, ...]:
    """The chained hash of every full block of a prompt made of ``segments`` ((content id, tokens) each)."""
    hashes: list[int] = []
    parent = 0
    pieces: list[tuple[int, int, int]] = []
    room = block_size
    for content, tokens in segments:
        start = 0
        while start < tokens:
            take = min(room, tokens - start)
            pieces.append((content, start, start + take))
            start += take
            room -= take
            if room == 0:
                parent = hash((parent, tuple(pieces)))  # tuples of ints hash the same in every process
                hashes.append(parent)
                pieces, room = [], block_size
    return tuple(hashes)


def token_block_hashes(token_ids: Sequence[int], block_size: int = DEFAULT_BLOCK_SIZE) -> tuple[int, ...]:
    """The chained hash of every full block of a prompt given as token ids (vLLM's ``hash_block_tokens``:
    the parent block's hash and this block's ids); a trailing partial block has none."""
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start:start + block_size])))
        hashes.append(parent)
    return tuple(hashes)


class PrefixCache:
    """The block hashes an engine holds, least recently used first."""

    def __init__(self, block_size: int = DEFAULT_BLOCK_SIZE, enabled: bool = True):
        if block_size <= 0:
            raise ValueError(f"block_size must be > 0, got {block_size}")
        self.block_size = block_size
        self.enabled = enabled
        self.blocks: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0

    def hit_tokens(self, hashes: Sequence[int], prompt: int) -> int:
        """Tokens of a ``prompt``-token prompt whose KV is cached (the longest run of leading blocks found),
        never the whole prompt (its last token is always computed). Touches the blocks found."""
        if not self.enabled or not hashes:
            return 0
        blocks = self.blocks
        found = 0
        for h in hashes:
            if h not in blocks:
                break
            blocks.move_to_end(h)
            found += 1
        return min(found * self.block_size, max(0, prompt - 1))

    def peek(self, hashes: Sequence[int]) -> int:
        """Leading blocks of ``hashes`` cached, without touching them (an observer's read)."""
        if not self.enabled:
            return 0
        found = 0
        for h in hashes:
            if h not in self.blocks:
                break
            found += 1
        return found

    def store(self, hashes: Sequence[int]) -> None:
        """Blocks just computed: cached, most recently used."""
        if not self.enabled:
            return
        blocks = self.blocks
        for h in hashes:
            blocks[h] = None
            blocks.move_to_end(h)

    def fit(self, free_tokens: int) -> None:
        """Evict least recently used blocks until the cache fits in ``free_tokens`` of KV memory."""
        limit = max(0, free_tokens) // self.block_size
        blocks = self.blocks
        while len(blocks) > limit:
            blocks.popitem(last=False)
            self.evictions += 1

    def clear(self) -> None:
        self.blocks.clear()
