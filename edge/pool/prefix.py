"""Which IU probably holds a request's prompt prefix in its KV cache: an index of what every edge sent.

vLLM caches a prompt in blocks of 16 tokens, each block's hash chained on its parent's
(sim/vllm/prefixcache.py cites the code), and a new prompt skips the prefill of its longest run of leading
blocks found cached. The edge has no tokenizer, so it cannot compute vLLM's hashes; it needs only its *own*
hashes to be consistent: equal leading text gives equal leading hashes, and the deepest hash of a request
found recorded for an IU says how much of the prompt was sent to that IU before.

Hashing (:func:`text_block_hashes`): the prompt text the edge forwards (a chat request's messages in order,
each as ``role`` + NUL + ``content`` + NUL (edge/tokens.py's ``prompt_parts``), the order the chat template
lays them out in) is
cut into chunks of ``CHARS_PER_BLOCK`` characters (16 tokens at ~4 characters per token, the usual English
rate for Llama-3's tokenizer), and chunk i's hash is blake2b(hash of chunk i-1 + chunk i). A chunk stands for
about one vLLM block: the estimate is "about this many tokens are cached", which is what the cost needs.

What is kept (:class:`PrefixIndex`): per IU, the hashes of every ``stride``-th chunk of each prompt this edge
sent there and of its last full chunk, and the few chunks (:func:`relay_blocks`) of each prompt any edge
sent there, which its announcement carried to the IU's node agent and the agent's ``/scores`` body relayed
(eas_wire/placed.py, :class:`RelayedPlacements`); least recently sent first, at most ``max_blocks_per_iu``
per IU (older ones are the first the IU's own LRU eviction would have dropped too). A match is the deepest recorded
chunk of the request per IU; the estimate is that many chunks' tokens, at most the prompt minus one token.

What corrects it: the IU's published prefix-cache hit rate (``ScoreTerms.prefix_hit_rate``): an IU that
reports prefix caching off (V0's -1 sentinel) gets no credit, whatever the index says
(:func:`cached_tokens`).
"""

from __future__ import annotations

import bisect
import hashlib
import zlib
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from consul_io.layout import is_iu_of
from eas_wire.placed import MAX_BLOCKS as MAX_RELAYED_BLOCKS
from eas_wire.placed import MAX_DEPTH

CHARS_PER_TOKEN = 4
TOKENS_PER_BLOCK = 16  # vLLM's default --block-size
CHARS_PER_BLOCK = CHARS_PER_TOKEN * TOKENS_PER_BLOCK
DEFAULT_STRIDE = 8  # record every 8th block (128 tokens): an 8x smaller index, matches to within 127 tokens
DEFAULT_MAX_BLOCKS_PER_IU = 512
COMMON_SHARE = 0.5  # a prefix sent to half the IUs (and at least 4) is everywhere (see PrefixIndex.match)
MAX_HASHED_BLOCKS = MAX_DEPTH  # 32k tokens: a longer prompt's tail is matched as uncached
RELAY_DEPTHS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)  # x stride (relay_blocks)
MAX_PENDING_PLACED = 8192  # relayed placements not yet taken: seconds of a 128-node pool's requests


def text_block_hashes(parts: Iterable[str], chars_per_block: int = CHARS_PER_BLOCK,
                      max_blocks: int = MAX_HASHED_BLOCKS) -> tuple[int, ...]:
    """The chained hash of every full ``chars_per_block``-byte chunk of the concatenated ``parts`` (UTF-8),
    the first ``max_blocks`` of them: chunk i's hash is the CRC-32 and the Adler-32 of the text up to its
    end (each computed on from the previous chunk's), so it depends on every byte before it, is the same in
    every process (the body summary may run in a worker) and costs ~0.1 us a chunk."""
    text = "".join(parts).encode("utf-8", "surrogatepass")
    hashes: list[int] = []
    crc, adler = 0, 1
    end = min(len(text) - chars_per_block + 1, max_blocks * chars_per_block)
    for start in range(0, max(0, end), chars_per_block):
        chunk = text[start:start + chars_per_block]
        crc, adler = zlib.crc32(chunk, crc), zlib.adler32(chunk, adler)
        hashes.append(crc << 32 | adler)
    return tuple(hashes)


class PromptPrefix(NamedTuple):
    """What routing knows of a prompt's prefix: its block hashes, its conversation's key and the tokens before
    its last message."""

    hashes: tuple[int, ...] = ()
    home_key: int = 0
    context_tokens: int = 0


def prompt_prefix(parts: Sequence[str]) -> PromptPrefix:
    """The hashing parts of a prompt (edge/tokens.py's ``prompt_parts``) as routing reads them."""
    if not parts:
        return NO_PREFIX
    context = sum(len(part) for part in parts[:-1]) // CHARS_PER_TOKEN
    return PromptPrefix(text_block_hashes(parts), conversation_key(parts), context)


class PrefixIndex:
    """Per IU, the block hashes of prompts sent there (every ``stride``-th and each prompt's last), LRU."""

    def __init__(self, stride: int = DEFAULT_STRIDE, max_blocks_per_iu: int = DEFAULT_MAX_BLOCKS_PER_IU,
                 tokens_per_block: int = TOKENS_PER_BLOCK):
        if stride < 1 or max_blocks_per_iu < 1:
            raise ValueError("stride and max_blocks_per_iu must be >= 1")
        self.stride, self.max_blocks, self.tokens_per_block = stride, max_blocks_per_iu, tokens_per_block
        self.per_iu: dict[str, OrderedDict[int, int]] = {}  # iu -> {hash: depth in blocks}
        self.holders: dict[int, str | tuple[str, ...]] = {}  # hash -> the IU(s) recorded holding it

    def record(self, iu_id: str, hashes: Sequence[int]) -> None:
        """The prompt with these block hashes was sent to ``iu_id`` (by this edge)."""
        if not hashes:
            return
        last = len(hashes) - 1
        blocks = [(depth + 1, hashes[depth]) for depth in range(self.stride - 1, last, self.stride)]
        blocks.append((last + 1, hashes[last]))
        self.record_blocks(iu_id, blocks)

    def record_blocks(self, iu_id: str, blocks: Sequence[tuple[int, int]]) -> None:
        """A prompt with these (depth, hash) blocks was sent to ``iu_id`` (by any edge: relayed by its agent)."""
        if not blocks:
            return
        held = self.per_iu.get(iu_id)
        if held is None:
            held = self.per_iu[iu_id] = OrderedDict()
        for depth, h in blocks:
            self._add(iu_id, held, h, depth)
        while len(held) > self.max_blocks:
            old, _ = held.popitem(last=False)
            self._drop_holder(old, iu_id)

    def _add(self, iu_id: str, held: OrderedDict, h: int, depth: int) -> None:
        if h in held:
            held.move_to_end(h)
            return
        held[h] = depth
        holders = self.holders.get(h)
        if holders is None:
            self.holders[h] = iu_id
        elif isinstance(holders, str):
            if holders != iu_id:
                self.holders[h] = (holders, iu_id)
        elif iu_id not in holders:
            self.holders[h] = (*holders, iu_id)

    def _drop_holder(self, h: int, iu_id: str) -> None:
        holders = self.holders.get(h)
        if holders == iu_id:
            del self.holders[h]
        elif isinstance(holders, tuple):
            rest = tuple(i for i in holders if i != iu_id)
            self.holders[h] = rest[0] if len(rest) == 1 else rest

    def forget(self, iu_id: str) -> None:
        """The IU left the pool (or restarted: its cache is empty)."""
        for h in self.per_iu.pop(iu_id, ()):
            self._drop_holder(h, iu_id)

    def match(self, hashes: Sequence[int]) -> tuple[dict[str, int], int]:
        """(IU -> blocks of this prompt it probably holds (the deepest recorded one), for IUs holding any;
        the blocks of it that are *common*: recorded on at least ``COMMON_SHARE`` of the IUs this index knows,
        and 4). A common prefix (a system prompt, a template in wide use) is hot, so every IU's LRU keeps it:
        it counts as cached on every IU."""
        found: dict[str, int] = {}
        common = 0
        common_holders = max(4, int(COMMON_SHARE * len(self.per_iu)))
        holders_of = self.holders.get
        for depth in range(len(hashes) - 1, -1, -1):
            holders = holders_of(hashes[depth])
            if holders is None:
                continue
            if isinstance(holders, str):
                if holders not in found:
                    found[holders] = depth + 1
                continue
            if len(holders) >= common_holders:
                common = depth + 1  # every shallower block is common too: no IU is credited less
                break
            for iu_id in holders:
                if iu_id not in found:
                    found[iu_id] = depth + 1
        return found, common

    def entries(self) -> int:
        return sum(len(held) for held in self.per_iu.values())


class Cached(dict):
    """IU -> tokens of a prompt estimated cached there; IUs not named hold ``default`` (a common prefix)."""

    def __init__(self, default: int = 0):
        super().__init__()
        self.default = default
        # (IU, tokens the index backs there) when that IU's value is a presumed home's, not the index's
        self.presumed: tuple[str, int] | None = None

    def backed(self, iu_id: str) -> int:
        """Tokens the index itself places in ``iu_id``'s cache (a presumed home's guess left out)."""
        if self.presumed is not None and self.presumed[0] == iu_id:
            return self.presumed[1]
        return self[iu_id]

    def __missing__(self, iu_id: str) -> int:
        return self.default


HOME_POINTS_PER_IU = 16  # 256 IUs: 4,096 points, built in ~3 ms when the membership changes


class HomeRing:
    """Consistent hashing of conversation keys onto IUs (``HOME_POINTS_PER_IU`` points each on a 64-bit ring),
    built once per membership: every edge with the same IUs names the same home for a key, and an IU leaving
    moves only the keys it was home to."""

    def __init__(self, iu_ids: Iterable[str]):
        self.iu_ids = tuple(sorted(iu_ids))
        points = sorted((_mix(_iu_hash(iu_id) + point), iu_id) for iu_id in self.iu_ids
                        for point in range(HOME_POINTS_PER_IU))
        self.points = [p for p, _ in points]
        self.owners = [iu for _, iu in points]

    def home(self, key: int) -> str | None:
        if not self.points:
            return None
        i = bisect.bisect_left(self.points, _mix(key))
        return self.owners[i % len(self.points)]


def home_iu(key: int, iu_ids: Iterable[str]) -> str | None:
    """The IU a conversation's turns go to while it is not busier than the prefill they save (one-off
    :class:`HomeRing`; the router keeps its ring while the membership stays the same)."""
    return HomeRing(iu_ids).home(key)


_IU_HASHES: dict[str, int] = {}


def _iu_hash(iu_id: str) -> int:
    h = _IU_HASHES.get(iu_id)
    if h is None:
        if len(_IU_HASHES) > 65536:
            _IU_HASHES.clear()
        h = _IU_HASHES[iu_id] = int.from_bytes(hashlib.blake2b(iu_id.encode(), digest_size=8).digest(), "little")
    return h


def _mix(x: int) -> int:
    """splitmix64's finalizer: every input bit moves every output bit."""
    x &= 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def conversation_key(parts: Sequence[str]) -> int:
    """The key of the IU a prompt's context should stay on (:class:`HomeRing`): a conversation with history
    (three parts or more) keys on its opening (the first two parts: the system message and the first user
    message), the same at every turn; a prompt of two parts (a template or system message and one question)
    on its first part, so the questions of one template meet there; 0 (none) for a prompt of one part."""
    if len(parts) < 2:
        return 0
    opening = "".join(parts[:2] if len(parts) > 2 else parts[:1]).encode("utf-8", "surrogatepass")
    return int.from_bytes(hashlib.blake2b(opening, digest_size=8).digest(), "little") or 1


def cached_tokens(blocks: int, prompt_tokens: int, hit_rate: float | None,
                  tokens_per_block: int = TOKENS_PER_BLOCK) -> int:
    """Tokens of the prompt estimated cached on an IU the index says holds ``blocks`` of it: none when the
    IU reports prefix caching off (``hit_rate`` -1, vLLM V0's sentinel); never the whole prompt."""
    if blocks <= 0 or (hit_rate is not None and hit_rate < 0):
        return 0
    return min(blocks * tokens_per_block, max(0, prompt_tokens - 1))


NO_PREFIX = PromptPrefix()


def relay_blocks(hashes: Sequence[int], stride: int = DEFAULT_STRIDE) -> tuple[tuple[int, int], ...]:
    """The (depth, hash) pairs an announcement carries for a prompt with these block hashes (at most
    ``eas_wire.placed.MAX_BLOCKS``): its last block (what the next turn of its conversation starts with) and
    the blocks at ``stride`` x 1, 2, 3, 4, 6, 8, 12, ... (about 1.4x apart: a prompt sharing only some leading
    blocks (a system prompt, a template) matches within ~30% of the shared depth)."""
    last = len(hashes)
    if not last:
        return ()
    depths = [d for d in RELAY_DEPTHS if d * stride < last][:MAX_RELAYED_BLOCKS - 1]
    return (*((d * stride, hashes[d * stride - 1]) for d in depths), (last, hashes[last - 1]))


class RelayedPlacements:
    """Placements relayed in the agents' bodies (eas_wire/placed.py) that the router has not taken yet,
    oldest first, at most ``max_pending`` (the oldest go first if the router falls behind: a hint lost,
    never a wrong one); per node the last relay number read, so that each placement is taken once although a
    body repeats a second of them. Read by the feed (any thread), taken by the router."""

    def __init__(self, max_pending: int = MAX_PENDING_PLACED):
        self.pending: deque[tuple[str, tuple[tuple[int, int], ...]]] = deque(maxlen=max_pending)
        self.last_seq: dict[str, int] = {}
        self.read_total = 0

    def read(self, node: str, placed) -> None:
        """The ``placed`` of one body of ``node`` (its IUs only: the body's reader checked them). A relay
        number below the last one read means the agent restarted: its numbering starts again."""
        if not placed:
            return
        last = self.last_seq.get(node, 0)
        if placed[-1].seq < last:
            last = 0
        for placement in placed:
            if placement.seq > last and is_iu_of(placement.iu, node):
                self.pending.append((placement.iu, placement.blocks))
                self.read_total += 1
        self.last_seq[node] = placed[-1].seq

    def take(self) -> list[tuple[str, tuple[tuple[int, int], ...]]]:
        """The placements read since the last call, oldest first."""
        taken = []
        pop = self.pending.popleft
        try:
            while True:
                taken.append(pop())
        except IndexError:
            return taken
