"""The announce channel's messages: what an edge posts to a node's agent and what the agent answers (the
contract: docs/contracts/announce.md). The agent's side (what it does with a batch) is eas_agent/announce.py,
the edge's (batching, backoff, the ledger) edge/announce.py.

    POST /announce
    X-Eas-Signature: key=<key id>,ts=<time>,nonce=<hex>,sig=<Ed25519 signature> (eas_wire/signing.py)
    {"edge": "edge-a.6b1f0c2d9e4a7781.3f9c2b1d", "announcements": [{"iu": "r01n01-iu0", "tokens": 1834, "seq": 17,
                                                   "sent": 1764780000.123, "blocks": [[8, 5012...], ...]}, ...]}

    200 {"accepted": 1, "ignored": {"unknown_iu": 1}, "ignored_seqs": [18]}

- ``edge``: the edge's name, its key's id and a nonce drawn at its start (:data:`~eas_wire.scorebody.EDGE_ID`),
  so a restarted edge never matches an acknowledgement of its previous life, and no key speaks for another
  key's edge;
- ``seq``: per edge, +1 per request sent (to any IU); an edge sends each node's batches one at a time and
  in order, so "the node has everything up to ``seq``" is one number;
- ``sent``: the edge's clock when it sent the request to vLLM; the agent compares it with its own
  (both NTP-disciplined, as the score's ``ts`` already assumes);
- ``blocks`` (optional): a few of the prompt's block hashes with their depths (eas_wire/placed.py), which the
  agent relays to every edge in its ``/scores`` body; malformed ones are dropped (``blocks_invalid``) and
  the announcement kept.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass

from eas_wire.placed import Blocks, PlacedError, blocks_from_json, blocks_to_json
from eas_wire.scorebody import EDGE_ID, MAX_SEQ

ANNOUNCE_PATH = "/announce"
MAX_BATCH_ITEMS = 512  # an edge batches 10 ms of one node's requests: a few at most
MAX_BATCH_BYTES = 384 * 1024  # 512 announcements of ~700 bytes, each with its 16 blocks
SENT_TOLERANCE_S = 5.0  # chrony keeps nodes within ~1 ms; 5 s is a broken clock or a replay, not skew
# Why an announcement was not counted: by the batch's reader (parse_batch) and by the agent's state
# (``replayed``: at or below the last number counted for that edge; ``rate_limited``: the edge's bucket is
# empty; ``node_rate_limited``: the node's bucket, shared by all edges, is). ``tokens_capped`` and
# ``announced_capped`` (what it adds cut at the IU's bound) are counted and the announcement kept.
IGNORED_REASONS = ("malformed", "unknown_iu", "tokens_invalid", "seq_invalid", "sent_out_of_range",
                   "tokens_capped", "replayed", "rate_limited", "node_rate_limited", "announced_capped",
                   "blocks_invalid")


@dataclass(frozen=True, slots=True)
class Announcement:
    iu: str
    tokens: int
    seq: int
    sent: float
    blocks: Blocks = ()  # (depth, hash) pairs of the prompt's leading blocks (eas_wire/placed.py)


class AnnounceError(ValueError):
    """The batch as a whole is unusable (nothing of it is counted); the message names the field."""


def _int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def parse_batch(obj, ius: Container[str], now: float, max_prompt_tokens: int | None = None,
                ) -> tuple[str, list[Announcement], Counter]:
    """(edge id, the usable announcements in order, ignored ones by reason). Raises :class:`AnnounceError`
    when the batch itself is malformed. One bad announcement is ignored and counted, the others kept;
    tokens above ``max_prompt_tokens`` (None: no cap) are capped (counted ``tokens_capped``), not refused."""
    if not isinstance(obj, dict):
        raise AnnounceError(f"body is {type(obj).__name__}, not an object")
    edge = obj.get("edge")
    if not isinstance(edge, str) or not EDGE_ID.fullmatch(edge):
        raise AnnounceError(f"edge {str(edge)[:80]!r} is not an edge id ({EDGE_ID.pattern})")
    items = obj.get("announcements")
    if not isinstance(items, list):
        raise AnnounceError(f"announcements is {type(items).__name__}, not a list")
    if len(items) > MAX_BATCH_ITEMS:
        raise AnnounceError(f"announcements has {len(items)} entries (more than {MAX_BATCH_ITEMS})")
    ignored: Counter[str] = Counter()
    kept: list[Announcement] = []
    last_seq = 0
    for item in items:
        if not isinstance(item, dict):
            ignored["malformed"] += 1
            continue
        iu, tokens, seq, sent = item.get("iu"), item.get("tokens"), item.get("seq"), item.get("sent")
        if not isinstance(iu, str) or iu not in ius:
            ignored["unknown_iu"] += 1
        elif not _int(tokens) or tokens < 1:
            ignored["tokens_invalid"] += 1
        elif not _int(seq) or not last_seq < seq <= MAX_SEQ:
            ignored["seq_invalid"] += 1  # not an integer, or not increasing within the batch
        elif isinstance(sent, bool) or not isinstance(sent, (int, float)) or not math.isfinite(sent) \
                or abs(sent - now) > SENT_TOLERANCE_S:
            ignored["sent_out_of_range"] += 1
        else:
            if max_prompt_tokens is not None and tokens > max_prompt_tokens:
                ignored["tokens_capped"] += 1  # kept, at the cap
                tokens = max_prompt_tokens
            blocks: Blocks = ()
            if item.get("blocks") is not None:
                try:
                    blocks = blocks_from_json(item["blocks"])
                except PlacedError:
                    ignored["blocks_invalid"] += 1  # kept, without blocks: its tokens still count
            kept.append(Announcement(iu, tokens, seq, float(sent), blocks))
            last_seq = seq
    return edge, kept, ignored


def batch_seqs(obj) -> list[int]:
    """The sequence numbers of a batch :func:`parse_batch` accepted, in order (items without one left out)."""
    seqs = (item.get("seq") for item in obj["announcements"] if isinstance(item, dict))
    return [seq for seq in seqs if _int(seq)]


def batch_json(edge: str, announcements: Iterable[Announcement]) -> bytes:
    """The body of one ``POST /announce`` (compact JSON)."""
    items = [{"iu": a.iu, "tokens": a.tokens, "seq": a.seq, "sent": a.sent,
              **({"blocks": blocks_to_json(a.blocks)} if a.blocks else {})} for a in announcements]
    return json.dumps({"edge": edge, "announcements": items}, separators=(",", ":")).encode()


def answer_json(accepted: int, ignored: Mapping[str, int], ignored_seqs: list[int]) -> bytes:
    """A 200 answer: how many were counted, the others by reason, and the sequence numbers of those not
    counted (the edge counts those requests by time: the node's acknowledgement may pass over them)."""
    answer = {"accepted": accepted, "ignored": dict(ignored), "ignored_seqs": ignored_seqs}
    return json.dumps(answer).encode() + b"\n"


def read_answer(raw: bytes, seqs: list[int]) -> tuple[int, list[int]]:
    """(how many of the batch's announcements (``seqs``) a 200 answer says it counted, the sequence numbers of
    those it did not). An answer that does not say which (an older agent), says something inconsistent or
    cannot be read: every announcement of the batch is taken as not counted, so the edge counts them by time
    (counted twice for a moment, never missed); one that cannot be read counts none as accepted."""
    try:
        answer = json.loads(raw)
        accepted, ignored = answer.get("accepted"), answer.get("ignored_seqs")
    except (ValueError, AttributeError):
        return 0, list(seqs)
    if not (_int(accepted) and 0 <= accepted <= len(seqs)):
        return 0, list(seqs)
    if accepted == len(seqs):
        return accepted, []
    if isinstance(ignored, list) and len(ignored) == len(seqs) - accepted and set(ignored) <= set(seqs):
        return accepted, ignored
    return accepted, list(seqs)
