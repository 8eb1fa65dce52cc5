"""The announce channel, agent side: edges tell a node's agent what they just sent to its IUs.

Why: a score is computed from a vLLM scrape every 200 ms. Between two scrapes an edge knows only its own
requests (its ledger); the work other edges sent since the score, and the real size of long prompts that
vLLM's waiting gauge counts as one request each, are invisible to it. In ``bench/route_sim.py`` that is
what keeps 4 and 16 edges short of the oracle (docs/decisions/0003-announce-channel.md). With the channel
every edge sees every edge's work within ~20-30 ms.

The messages (``POST /announce`` on the agent's HTTP server, eas_agent/http.py; the edge's sender is
edge/announce.py) are in eas_wire/announce.py, the contract in docs/contracts/announce.md.

What the agent does with a batch (:class:`NodeAnnouncements`): each prompt's prefill seconds (tokens / the
IU's measured ``prefill_tps``) are added to the IU's score until the next scrape (the scrape then sees the
request itself), the body served on ``/scores`` is rebuilt at once (so the edges' blocking queries answer
within a round trip) with ``announced`` (edge -> last sequence number counted) and
``ius.*.components.announced_s`` (what announcements added: the edge's anomaly detector judges the scrape's
score). At each scrape vLLM's waiting count W gets sizes: the W most recent announced prompts not yet seen
admitted wait (vLLM admits first come, first served), older ones were admitted (:class:`AnnouncedPrompts`,
:class:`AnnounceScorer`).

What a forged or broken sender can do: only a batch signed by an edge key this node holds is heard
(eas_agent/announce_keys.py), and only for edge ids that name that key; each announcement's tokens are capped
at ``max_prompt_tokens`` (the model's context), its send time must be within
:data:`~eas_wire.announce.SENT_TOLERANCE_S` of the agent's clock, each edge is held to ``rate_per_s``
announcements a second and the node as a whole to ``node_rate_per_s`` (token buckets), what announcements add
to one IU between two scrapes is at most :data:`ANNOUNCED_PROMPTS_PER_SCRAPE` prompts of ``max_prompt_tokens``
at its prefill rate, and at most :data:`~eas_wire.scorebody.MAX_ANNOUNCED_EDGES` edges are remembered. What an
announcement adds ends at the next scrape by construction; a FIFO entry lasts at most until vLLM reports
fewer waiting requests. The KV body never carries announcements (``Publisher`` writes the scrape's body).

The relay (eas_wire/placed.py): an accepted announcement's ``blocks`` (a few of its prompt's block hashes)
become a placement numbered by this agent; the ``/scores`` body carries those of the last
:data:`~eas_wire.placed.RELAY_WINDOW_S` (at most :data:`~eas_wire.placed.MAX_PLACED`), so every edge's prefix
index learns what every edge sent to this node's IUs. What a forged edge can do with it: name hashes for this
node's IUs, at its announce rate; each edge's index holds a bounded number per IU (edge/pool/prefix.py), so
the worst is a misplaced prefix estimate for those IUs until real placements push it out.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import replace

from eas_agent.score import SCORE_TERMS, IUInputs, Scorer, ScoreResult, effective_prefill_tps
from eas_wire.announce import AnnounceError, Announcement, batch_seqs, parse_batch
from eas_wire.placed import MAX_PLACED, RELAY_WINDOW_S, Placement
from eas_wire.scorebody import MAX_ANNOUNCED_EDGES, ScoreBody
from eas_wire.signing import edge_key_id

MAX_PENDING = 4096  # per IU: vLLM's waiting queue of one engine is a few hundred requests at most
DEFAULT_MAX_PROMPT_TOKENS = 131_072  # Llama 3.1's context; the agent config sets the served model's
DEFAULT_RATE_PER_S = 2_000.0  # per edge; one edge sends a pool of 128 nodes ~1,000 requests/s at most
DEFAULT_BURST = 4_000.0
# across all edges: a node's few IUs admit a few hundred requests a second; 16 edges at their busiest send it
# far less than this, and invented ids (each with its own per-edge bucket) cannot add up past it
DEFAULT_NODE_RATE_PER_S = 2_000.0
# Between two scrapes (200 ms) one IU is plausibly handed a few requests by all edges together; 16 prompts
# at the model's context is far above that, and bounds what a broken or compromised edge adds to one IU
ANNOUNCED_PROMPTS_PER_SCRAPE = 16


class EdgeKeyMismatch(AnnounceError):
    """A batch speaks for an edge id that does not name the key that signed it."""


class AnnouncedPrompts:
    """One IU's announced prompts the agent has not seen admitted (oldest first) and what announcements added
    to its score since the last scrape. Called from the agent's cycle (``reconcile``) and its HTTP threads
    (``announce``), hence the lock."""

    def __init__(self, max_added_tokens: int = ANNOUNCED_PROMPTS_PER_SCRAPE * DEFAULT_MAX_PROMPT_TOKENS):
        self.lock = threading.Lock()
        self.max_added_tokens = max_added_tokens  # what announcements may add per scrape, in prompt tokens
        self.pending: deque[int] = deque(maxlen=MAX_PENDING)
        self.unattributed = 0  # waiting requests of the last scrape that no announcement named
        self.scraped_at = -math.inf
        self.prefill_tps: float | None = None
        self.request_cost_s = 0.0
        self.added_s = 0.0

    def reconcile(self, waiting: int, now: float, prefill_tps: float, request_cost_s: float) -> tuple[int, int]:
        """At a scrape finding ``waiting`` requests waiting: (tokens of the announced ones among them, how many
        no announcement names). FIFO: the most recent ``waiting`` pending prompts wait, the older were admitted."""
        with self.lock:
            while len(self.pending) > waiting:
                self.pending.popleft()
            self.unattributed = waiting - len(self.pending)
            self.scraped_at, self.prefill_tps, self.request_cost_s, self.added_s = now, prefill_tps, request_cost_s, 0.0
            return sum(self.pending), self.unattributed

    @property
    def max_added_s(self) -> float:
        """The most announcements may add to the score between two scrapes (infinite before the first)."""
        return math.inf if self.prefill_tps is None else self.max_added_tokens / self.prefill_tps

    def announce(self, prompt: int, sent: float) -> bool:
        """Count one announced prompt; False when what it adds was cut at :attr:`max_added_s`."""
        with self.lock:
            if self.prefill_tps is None:  # no scrape yet: the first one will count it
                self.pending.append(prompt)
                return True
            if sent >= self.scraped_at:  # the last scrape did not see it: its prefill on top of the score
                self.pending.append(prompt)
                added = prompt / self.prefill_tps
            elif self.unattributed > 0:  # the scrape counted it waiting at the mean: its real size
                self.unattributed -= 1
                self.pending.append(prompt)
                added = prompt / self.prefill_tps - self.request_cost_s
            else:  # the last scrape found it admitted already (the admitted-prefill term counts its real tokens)
                return True
            bound = self.max_added_s
            self.added_s = min(bound, self.added_s + added)
            return self.added_s < bound


class AnnounceScorer:
    """An IU's scorer (``inner``) with vLLM's waiting count at the announced prompts' real sizes; the seed
    profile and a scrape without a waiting count are scored as ``inner`` scores them."""

    def __init__(self, inner: Scorer, prompts: AnnouncedPrompts):
        self.inner, self.prompts = inner, prompts

    def score(self, inputs: IUInputs, now: float) -> ScoreResult:
        inner = self.inner
        result = inner.score(inputs, now)
        reading = inputs.vllm
        m = reading.metrics if reading is not None else None
        if inner.profile != "drain" or result.score is None or m is None or m.num_requests_waiting is None:
            return result
        params = inner.params
        prefill_tps = inner.prefill.value  # drain_score updated it for this reading
        mean = reading.mean_prompt_tokens or params.mean_prompt_tokens_prior
        prefill_eff = effective_prefill_tps(params, prefill_tps, reading.preemptions_per_s or 0.0, mean)
        waiting = int(m.num_requests_waiting)
        tokens, unattributed = self.prompts.reconcile(waiting, now, prefill_tps, mean / prefill_eff)
        if unattributed == waiting:  # no announced prompt waits: drain's own terms
            return result
        backlog = tokens + unattributed * mean
        score = max(0.0, result.score + SCORE_TERMS["drain"]["queue_s"] * (backlog - waiting * mean) / prefill_eff)
        components = {**result.components, "backlog_tokens": round(backlog), "queue_s": round(backlog / prefill_eff, 4)}
        return replace(result, score=round(score, 4), components=components)


class NodeAnnouncements:
    """One node agent's side of the channel: its IUs' announced prompts, the last sequence number per edge,
    each edge's rate bound, and the ``/scores`` body with what announcements added."""

    def __init__(self, iu_ids: Iterable[str], *, max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS,
                 rate_per_s: float = DEFAULT_RATE_PER_S, burst: float = DEFAULT_BURST,
                 node_rate_per_s: float = DEFAULT_NODE_RATE_PER_S):
        self.prompts = {iu: AnnouncedPrompts(ANNOUNCED_PROMPTS_PER_SCRAPE * max_prompt_tokens) for iu in iu_ids}
        self.max_prompt_tokens, self.rate_per_s, self.burst = max_prompt_tokens, rate_per_s, burst
        # one bucket for every edge together, 2 s of its rate deep: a bound invented ids cannot multiply
        self.node_bucket = [2 * node_rate_per_s, -math.inf]
        self.node_rate_per_s = node_rate_per_s
        self.lock = threading.Lock()
        self.acked: OrderedDict[str, int] = OrderedDict()  # edge -> last seq counted; least recently heard first
        self.buckets: dict[str, list[float]] = {}  # edge -> [tokens left, when refilled]
        self.counts: Counter[str] = Counter()  # accepted, and ignored ones by reason (the agent's metrics)
        self.placed: deque[tuple[float, Placement]] = deque(maxlen=MAX_PLACED)  # (received, placement)
        self.placed_seq = 0

    def scorer(self, iu_id: str, inner: Scorer) -> AnnounceScorer:
        """``inner`` (the IU's scorer) with the waiting prompts' announced sizes."""
        return AnnounceScorer(inner, self.prompts[iu_id])

    def receive_json(self, obj, now: float, key: str) -> tuple[int, Counter]:
        """Parse and count one batch (:func:`~eas_wire.announce.parse_batch`) signed by ``key`` (its key
        id); (accepted, ignored by reason)."""
        accepted, ignored, _ignored_seqs = self.receive_batch(obj, now, key)
        return accepted, ignored

    def receive_batch(self, obj, now: float, key: str) -> tuple[int, Counter, list[int]]:
        """:meth:`receive_json` plus the sequence numbers of the announcements it did not count (those
        that have one): this node's acknowledgement (the last counted) may pass over them, so the edge must
        count them by time (``EdgeLedger.unannounce``); the answer to ``POST /announce`` lists them.
        Raises :class:`~eas_wire.announce.AnnounceError` when the batch's edge id does not name ``key``:
        one edge's key never moves another edge's acknowledgement."""
        edge, batch, ignored = parse_batch(obj, self.prompts, now, self.max_prompt_tokens)
        if edge_key_id(edge) != key:
            raise EdgeKeyMismatch(f"edge {edge!r} does not name the key {key} that signed the batch")
        counted = set(self.receive(edge, batch, now, ignored))
        return len(counted), ignored, [seq for seq in batch_seqs(obj) if seq not in counted]

    def receive(self, edge: str, batch: list[Announcement], now: float, ignored: Counter | None = None
                ) -> list[int]:
        """Count ``batch`` (parsed) from ``edge``; the sequence numbers counted. ``ignored`` gets the
        reasons of those not counted."""
        ignored = ignored if ignored is not None else Counter()
        accepted = []
        with self.lock:
            acked = self.acked.get(edge, 0)
            bucket = self.buckets.get(edge)
            if bucket is None:
                bucket = [self.burst, now]
            bucket[0] = min(self.burst, bucket[0] + max(0.0, now - bucket[1]) * self.rate_per_s)
            bucket[1] = now
            node = self.node_bucket
            node[0] = min(2 * self.node_rate_per_s, node[0] + max(0.0, now - node[1]) * self.node_rate_per_s)
            node[1] = now
            for a in batch:
                if a.seq <= acked:
                    ignored["replayed"] += 1
                elif bucket[0] < 1.0:
                    ignored["rate_limited"] += 1
                elif node[0] < 1.0:
                    ignored["node_rate_limited"] += 1
                else:
                    bucket[0] -= 1.0
                    node[0] -= 1.0
                    accepted.append(a)
                    acked = a.seq
            if accepted or edge in self.acked:
                self.acked[edge] = acked
                self.acked.move_to_end(edge)
                self.buckets[edge] = bucket
            while len(self.acked) > MAX_ANNOUNCED_EDGES:  # a forgotten edge reads bodies as if from the KV
                gone, _ = self.acked.popitem(last=False)
                self.buckets.pop(gone, None)
            for a in accepted:  # under the lock: a body never acknowledges what its scores do not hold yet
                if not self.prompts[a.iu].announce(a.tokens, a.sent):
                    ignored["announced_capped"] += 1  # counted, its addition cut at the IU's bound
                if a.blocks:
                    self.placed_seq += 1
                    self.placed.append((now, Placement(self.placed_seq, a.iu, a.blocks)))
            self.counts["accepted"] += len(accepted)
            self.counts.update(ignored)
        return [a.seq for a in accepted]

    def body(self, base: ScoreBody) -> ScoreBody:
        """``base`` (the last cycle's body) with what announcements added since its scrape, the edges'
        acknowledgements and the placements of the relay window, read under the lock :meth:`receive` holds: what a body acknowledges, its
        scores hold."""
        with self.lock:
            announced = dict(self.acked)
            added = {iu_id: prompts.added_s for iu_id, prompts in self.prompts.items()}
            since = base.ts - RELAY_WINDOW_S
            placed = tuple(p for received, p in self.placed if received >= since)
        ius = {}
        for iu_id, entry in base.ius.items():
            extra = added.get(iu_id, 0.0)
            if entry.score is None or not extra:
                ius[iu_id] = entry
                continue
            score = round(max(0.0, entry.score + extra), 4)
            ius[iu_id] = replace(entry, score=score,
                                 components={**entry.components, "announced_s": round(score - entry.score, 4)})
        return replace(base, ius=ius, announced=announced, placed=placed)
