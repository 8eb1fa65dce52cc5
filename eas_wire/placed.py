"""Prompt placements: which IU was sent a prompt with which leading blocks, relayed by the IU's node agent to
every edge (the contracts: docs/contracts/announce.md, docs/contracts/score-body.md).

Why: each edge's prefix index (edge/pool/prefix.py) knows only the prompts *it* sent. With 16 edges a
conversation's turns reach 16 indexes, each holding a sixteenth of them, and a turn's edge guesses where the
others went. An edge's announcement (eas_wire/announce.py) now carries a few of its prompt's block hashes
(:data:`MAX_BLOCKS` (depth, hash) pairs: the edge's own text-chunk hashes, see edge/pool/prefix.py), the
node's agent keeps the placements of the last :data:`RELAY_WINDOW_S` (at most :data:`MAX_PLACED`), and its
``/scores`` body carries them to every edge: every edge's index then holds what every edge sent.

Why not vLLM's own KV events (``--kv-events-config``: ``BlockStored`` / ``BlockRemoved`` /
``AllBlocksCleared`` over ZMQ, as NVIDIA Dynamo's KV router and llm-d's kv-cache manager consume them): their
``block_hashes`` are hashes of *token ids*, and an edge has no tokenizer (it hashes text, edge/tokens.py), so
it could not look a request up in them; the routers that consume them tokenize every request with the
model's tokenizer and chat template.

Wire shape, both in an announcement (``"blocks"``) and in a placement: ``[[depth, hash], ...]``, depth in
blocks (1 .. :data:`MAX_DEPTH`, strictly increasing), hash an integer in [0, 2**64). A placement in a body:
``{"seq": <the agent's relay number, +1 per placement>, "iu": "<IU id of that node>", "blocks": [...]}``.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

MAX_BLOCKS = 16  # per prompt: its last block and up to 15 sampled depths (edge/pool/prefix.py's relay_blocks)
MAX_DEPTH = 2048  # edge/pool/prefix.py's MAX_HASHED_BLOCKS: 32k tokens
MAX_HASH = (1 << 64) - 1
MAX_PLACED = 64  # per body: a node's IUs are sent a few requests per 200 ms cycle at full load
RELAY_WINDOW_S = 0.25  # a body carries the placements of the last quarter second, more than one agent cycle
#                        (200 ms): a follower that falls behind gets the latest body only (eas_agent/http.py),
#                        and still reads each placement unless it read no body of the node for that long.
#                        A stream line carries only those not yet written to that stream (:func:`first_unsent`):
#                        every edge decodes each placement once; a blocking query's answer repeats the window

Blocks = tuple[tuple[int, int], ...]


class PlacedError(ValueError):
    """A ``blocks`` or ``placed`` value is unusable; the message names the field and value."""


def blocks_from_json(obj, where: str = "blocks") -> Blocks:
    """``[[depth, hash], ...]`` checked (see the module docstring); raises :class:`PlacedError`. Every edge
    reads every placement once: one plain loop with exact type tests (a bool is no depth or hash)."""
    if type(obj) is not list:
        raise PlacedError(f"{where} {str(obj)[:80]!r} is not a list")
    if len(obj) > MAX_BLOCKS:
        raise PlacedError(f"{where} has {len(obj)} entries (more than {MAX_BLOCKS})")
    pairs = []
    last = 0
    for pair in obj:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not int or type(pair[1]) is not int:
            raise PlacedError(f"{where} entry {str(pair)[:80]!r} is not [depth, hash]")
        depth, h = pair
        if not last < depth <= MAX_DEPTH:
            raise PlacedError(f"{where} depth {depth} is not increasing within 1..{MAX_DEPTH}")
        if not 0 <= h <= MAX_HASH:
            raise PlacedError(f"{where} hash {str(h)[:40]} is not in [0, 2**64)")
        pairs.append((depth, h))
        last = depth
    return tuple(pairs)


def blocks_to_json(blocks: Blocks) -> list[list[int]]:
    return [[depth, h] for depth, h in blocks]


@dataclass(frozen=True, slots=True)
class Placement:
    seq: int
    iu: str
    blocks: Blocks

    def to_json(self) -> dict:
        return {"seq": self.seq, "iu": self.iu, "blocks": blocks_to_json(self.blocks)}


def first_unsent(placed: Sequence[Placement], sent: int) -> int:
    """The index in ``placed`` (in relay-number order, as a body holds them) of the first placement numbered
    after ``sent``, the last one already written to a stream: the stream's next line carries
    ``placed[first_unsent(placed, sent):]``, so that each follower decodes each placement once instead of in
    every body of the window (with 16 edges that decoding was most of the relay's CPU, bench/prefix_cost.py)."""
    return bisect_right(placed, sent, key=_seq)


def _seq(placement: Placement) -> int:
    return placement.seq


def placed_from_json(obj, ius, max_seq: int, after: int = 0) -> tuple[tuple[Placement, ...], int]:
    """(the usable placements of a body's ``placed`` in order, how many were dropped): one naming an IU not
    in the body's ``ius`` (a node speaks only for its own IUs) or malformed is dropped, the others kept;
    raises :class:`PlacedError` when ``placed`` itself is not a list of at most :data:`MAX_PLACED`.

    ``after``: the last relay number the reader already holds from this node; placements up to it are
    skipped unread (a body repeats a window of them: each is checked once), unless the body's last one is
    below it (the agent restarted and numbers from 1 again)."""
    if not isinstance(obj, list):
        raise PlacedError(f"placed {str(obj)[:80]!r} is not a list")
    if len(obj) > MAX_PLACED:
        raise PlacedError(f"placed has {len(obj)} entries (more than {MAX_PLACED})")
    newest = obj[-1].get("seq") if obj and isinstance(obj[-1], dict) else None
    last = after if _int(newest) and newest >= after else 0
    kept: list[Placement] = []
    dropped = 0
    for item in obj:
        try:
            if not isinstance(item, dict):
                raise PlacedError("not an object")
            seq, iu = item.get("seq"), item.get("iu")
            if _int(seq) and 0 < seq <= last == after:
                continue  # read before
            if not _int(seq) or not last < seq <= max_seq:
                raise PlacedError(f"seq {str(seq)[:40]!r} is not increasing")
            if not isinstance(iu, str) or iu not in ius:
                raise PlacedError(f"iu {str(iu)[:80]!r} is not one of the body's IUs")
            kept.append(Placement(seq, iu, blocks_from_json(item.get("blocks"), f"placed.{seq}.blocks")))
            last = seq
        except PlacedError:
            dropped += 1
    return tuple(kept), dropped


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
