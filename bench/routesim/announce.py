"""A design that does NOT ship, measured in simulation only: an announce channel from the edges to the agents.

The `ours` rows are what eas-edge ships; the `design: push + announce` rows are the shipped push path plus:

- edge: every request it sends is announced to the chosen IU's node agent as (iu, prompt tokens, edge,
  sequence number, send time) on one persistent connection per node; announcements are batched per node and
  leave at the edge's next tick (every ``batch_s``, 10 ms) and reach the agent ``transit_s`` (0.5 ms) later;
- agent, at once: the announced prompt's prefill seconds (at the IU's measured ``prefill_tps``) are added to
  the IU's score until the next scrape, and the updated body is pushed to every edge the way cycle bodies are
  (``PUSH_LATENCY_S`` transit, then the edge's apply interval, 20 ms);
- agent, at each scrape: vLLM's waiting count W is given real sizes: the W most recent announced prompts not
  yet seen admitted are the waiting ones (vLLM admits first come, first served), the older ones were admitted
  (:class:`AnnouncedPrompts`); waiting requests no announcement names yet count at the mean prompt as before;
- every pushed body carries, per edge, the last sequence number it counts (``announced``); the edge's ledger
  (:class:`AnnounceLedger`) then counts only its requests the body counts neither by its scrape time (sent
  before ``ts``) nor by announcement (sequence <= the acknowledged one);
- each IU entry says how much of its score announcements added (component ``announced_s``): the edge's
  anomaly detector judges the scrape's score (score - announced_s), so known work is no "high outlier"
  (:class:`ScrapeScoreDetector`; judging the announced scores measured worse, edge/README.md).

Everything else is the shipped code: the agent's Agent/Scorer/Publisher (the scorer wrapped), the edge's
EdgeView/Router/pick (the view and ledger subclassed). Announced bodies reach the view as typed ScoreBody
objects (the simulated push does not serialise them; the shipped push serialises and parses its bodies).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field, fields, replace

from eas_agent.scheduler.anomaly import AnomalyDetector
from eas_agent.scheduler.pick import EdgeLedger
from eas_agent.score import SCORE_TERMS, DrainParams, IUInputs, Scorer, ScoreResult, effective_prefill_tps
from eas_agent.scorebody import ScoreBody
from edge.feed import EdgeView
from sim.vllm.eventloop import EventLoop

from .agents import AgentFleet, SimNodeAgent
from .readers import AgentPush, ScoredEdge
from .workload import TraceRequest

ANNOUNCE_BATCH_S = 0.010  # an edge sends each node's pending announcements at its next 10 ms tick
ANNOUNCE_TRANSIT_S = 0.0005  # one small message on a LAN connection that is already open


@dataclass(frozen=True)
class Announcement:
    iu_id: str
    prompt: int  # tokens
    edge: int
    seq: int  # per edge, +1 per request sent (to any IU)
    sent: float  # the edge's clock when it sent the request to the IU


@dataclass(frozen=True)
class AnnouncedBody(ScoreBody):
    """A /scores body whose IU scores include the announcements received since its scrape (``ts``)."""

    announced: dict[int, int] = field(default_factory=dict)  # edge -> last sequence number this body counts


class AnnouncedPrompts:
    """One IU's announced prompts the agent has not seen admitted (oldest first) and what announcements added
    to its score since the last scrape. ``sizes`` False (the ablation without part (b)): an announcement the
    last scrape already counted adds nothing (the scrape counted it at the mean prompt or admitted)."""

    def __init__(self, sizes: bool = True):
        self.sizes = sizes
        self.pending: deque[int] = deque()
        self.unattributed = 0  # waiting requests of the last scrape that no announcement named
        self.scraped_at = -math.inf
        self.prefill_tps: float | None = None
        self.request_cost_s = 0.0
        self.added_s = 0.0

    def reconcile(self, waiting: int, now: float, prefill_tps: float, request_cost_s: float) -> tuple[int, int]:
        """At a scrape finding ``waiting`` requests waiting: (tokens of the announced ones among them, how many
        no announcement names). FIFO: the most recent ``waiting`` pending prompts wait, the older were admitted."""
        while len(self.pending) > waiting:
            self.pending.popleft()
        self.unattributed = waiting - len(self.pending)
        self.scraped_at, self.prefill_tps, self.request_cost_s, self.added_s = now, prefill_tps, request_cost_s, 0.0
        return sum(self.pending), self.unattributed

    def announce(self, prompt: int, sent: float) -> None:
        if self.prefill_tps is None:  # no scrape yet: the first one will count it
            self.pending.append(prompt)
        elif sent >= self.scraped_at:  # the last scrape did not see it: its prefill on top of the score
            self.pending.append(prompt)
            self.added_s += prompt / self.prefill_tps
        elif self.sizes and self.unattributed > 0:  # the last scrape counted it waiting at the mean request: now its real size
            self.unattributed -= 1
            self.pending.append(prompt)
            self.added_s += prompt / self.prefill_tps - self.request_cost_s
        # else the last scrape found it admitted already (the admitted-prefill term counts its real tokens)
        # or, without sizes, counted it waiting at the mean prompt as shipped (the edge keeps the excess)


class AnnounceScorer(Scorer):
    """The shipped drain score with vLLM's waiting count at the announced prompts' real sizes (``sizes``
    False: at the mean prompt as shipped, the announcements only reset at the scrape; an ablation)."""

    def __init__(self, params: DrainParams, prompts: AnnouncedPrompts):
        super().__init__("drain", params)
        self.prompts = prompts

    def score(self, inputs: IUInputs, now: float) -> ScoreResult:
        result = super().score(inputs, now)
        reading, m = inputs.vllm, inputs.vllm.metrics
        if result.score is None or m is None or m.num_requests_waiting is None:
            return result
        prefill_tps = self.prefill.value  # drain_score updated it for this reading
        mean = reading.mean_prompt_tokens or self.params.mean_prompt_tokens_prior
        prefill_eff = effective_prefill_tps(self.params, prefill_tps, reading.preemptions_per_s or 0.0, mean)
        waiting = int(m.num_requests_waiting)
        tokens, unattributed = self.prompts.reconcile(waiting, now, prefill_tps, mean / prefill_eff)
        if not self.prompts.sizes:
            return result
        backlog = tokens + unattributed * mean
        score = max(0.0, result.score + SCORE_TERMS["drain"]["queue_s"] * (backlog - waiting * mean) / prefill_eff)
        components = {**result.components, "backlog_tokens": round(backlog), "queue_s": round(backlog / prefill_eff, 4)}
        return replace(result, score=round(score, 4), components=components)


class NodeAnnouncements:
    """One node agent's side of the channel: its IUs' announced prompts and the last sequence per edge."""

    def __init__(self, agent: SimNodeAgent, waiting_sizes: bool = True):
        self.agent = agent
        self.node = agent.config.node
        self.prompts = {iu.id: AnnouncedPrompts(waiting_sizes) for iu in agent.config.ius}
        params = DrainParams(frozen_after_s=agent.config.frozen_after_s)
        for pipeline in agent.agent.pipelines:
            pipeline.scorer = AnnounceScorer(params, self.prompts[pipeline.iu.id])
        self.acked: dict[int, int] = {}

    def receive(self, batch: list[Announcement]) -> None:
        for a in batch:
            self.prompts[a.iu_id].announce(a.prompt, a.sent)
            self.acked[a.edge] = max(self.acked.get(a.edge, 0), a.seq)

    def body(self) -> AnnouncedBody | None:
        """The last cycle's /scores body, its scores plus what announcements added since, and the acks."""
        base = self.agent.sink.body
        if base is None:
            return None
        ius = {}
        for iu_id, entry in base.ius.items():
            added = self.prompts[iu_id].added_s
            if entry.score is None or not added:
                ius[iu_id] = entry
                continue
            score = round(max(0.0, entry.score + added), 4)
            ius[iu_id] = replace(entry, score=score,
                                 components={**entry.components, "announced_s": round(score - entry.score, 4)})
        kept = {f.name: getattr(base, f.name) for f in fields(ScoreBody) if f.name != "ius"}
        return AnnouncedBody(**kept, ius=ius, announced=dict(self.acked))


class AnnounceNodes:
    """Every node's announce endpoint; after each batch the node's body is pushed to every edge.
    ``waiting_sizes`` False: the ablation without part (b), scrapes count waiting requests at the mean prompt."""

    def __init__(self, fleet: AgentFleet, loop: EventLoop, transit_s: float = ANNOUNCE_TRANSIT_S,
                 waiting_sizes: bool = True):
        self.loop, self.transit_s, self.waiting_sizes = loop, transit_s, waiting_sizes
        self.nodes = {agent.config.node: NodeAnnouncements(agent, waiting_sizes) for agent in fleet.agents}
        self.of_agent = {id(n.agent): n for n in self.nodes.values()}
        self.node_of = {iu.id: agent.config.node for agent in fleet.agents for iu in agent.config.ius}
        self.listeners: list = []  # (NodeAnnouncements, now): a body to push
        self.pushers: list[AnnouncePush] = []
        self.batches = self.announcements = 0

    def send(self, node: str, batch: list[Announcement], now: float) -> None:
        self.loop.schedule(now + self.transit_s, self._deliver, (node, batch))

    def _deliver(self, item, now: float) -> None:
        node, batch = item
        self.nodes[node].receive(batch)
        self.batches += 1
        self.announcements += len(batch)
        for listener in self.listeners:
            listener(self.nodes[node], now)

    def view(self, loop: EventLoop) -> AnnounceView:
        return AnnounceView(clock=lambda: loop.now)


class AnnounceSender:
    """One edge's announcements: per node, those sent since its last batch leave at the edge's next tick."""

    def __init__(self, nodes: AnnounceNodes, loop: EventLoop, phase_s: float, batch_s: float = ANNOUNCE_BATCH_S):
        self.nodes, self.loop, self.phase_s, self.batch_s = nodes, loop, phase_s, batch_s
        self.buffers: dict[str, list[Announcement]] = {}

    def next_tick(self, now: float) -> float:
        return self.phase_s + (math.floor((now - self.phase_s) / self.batch_s) + 1) * self.batch_s

    def announce(self, announcement: Announcement, now: float) -> None:
        node = self.nodes.node_of[announcement.iu_id]
        buffer = self.buffers.get(node)
        if buffer is None:
            buffer = self.buffers[node] = []
            self.loop.schedule(self.next_tick(now), self._flush, node)
        buffer.append(announcement)

    def _flush(self, node: str, now: float) -> None:
        self.nodes.send(node, self.buffers.pop(node), now)


class AnnouncePush(AgentPush):
    """The shipped push path carrying announced bodies: after every cycle and after every announce batch."""

    def __init__(self, nodes: AnnounceNodes, fleet: AgentFleet, view: EdgeView, loop: EventLoop):
        self.nodes = nodes
        self.announce_pushes = 0  # bodies pushed because of an announce batch (cycle bodies not counted)
        super().__init__(fleet, view, loop)
        nodes.listeners.append(self._on_batch)
        nodes.pushers.append(self)

    def _on_cycle(self, agent: SimNodeAgent, now: float) -> None:
        self._push(self.nodes.of_agent[id(agent)], now)

    def _on_batch(self, node: NodeAnnouncements, now: float) -> None:
        self.announce_pushes += 1
        self._push(node, now)

    def _push(self, node: NodeAnnouncements, now: float) -> None:
        body = node.body()
        if body is not None:
            self.loop.schedule(now + self.latency_s, self._arrive, (node.node, body))


class ScrapeScoreDetector(AnomalyDetector):
    """The edge's anomaly detector over the scrape's scores: what announcements added is known work."""

    def observe(self, entries, now: float):
        scraped = [e if e.score is None or not e.components.get("announced_s") else
                   replace(e, score=max(0.0, e.score - e.components["announced_s"])) for e in entries]
        return super().observe(scraped, now)


class AnnounceView(EdgeView):
    """EdgeView that keeps, per node, the acknowledgements of the body its snapshot uses. A pushed body wins
    a tie on ``ts`` with the KV's (the KV body of the same cycle has no announcements in it)."""

    def __init__(self, **kwargs):
        super().__init__(detector=ScrapeScoreDetector(), **kwargs)
        self.announced: dict[str, dict[int, int]] = {}

    def _bodies(self):
        merged = dict(self.bodies)
        for node, seen in self.polled.items():
            if node not in merged or seen.body.ts >= merged[node].body.ts:
                merged[node] = seen
        self.announced = {node: getattr(seen.body, "announced", {}) for node, seen in merged.items()}
        return merged

    def acked(self, edge: int, node: str) -> int:
        return self.announced.get(node, {}).get(edge, 0)


class AnnounceLedger(EdgeLedger):
    """The edge's ledger, less what the score counts through this edge's announcements. ``acked(iu)``: the
    last sequence number of this edge that the IU's current score counts. Sequence numbers grow with send
    time, so "counted by announcement" is "sent no later than the acknowledged request". ``sized``: the agent
    gives waiting requests their announced sizes (False: the shipped queued excess is kept for all)."""

    def __init__(self, acked, sized: bool = True):
        super().__init__()
        self.acked, self.sized = acked, sized
        self.send_times: list[float] = []  # seq - 1 -> send time

    @property
    def seq(self) -> int:
        return len(self.send_times)

    def on_sent(self, iu_id: str, now: float, *args, **kwargs) -> None:
        super().on_sent(iu_id, now, *args, **kwargs)
        self.send_times.append(now)

    def acked_at(self, iu_id: str) -> float:
        seq = self.acked(iu_id)
        return self.send_times[seq - 1] if seq > 0 else -math.inf

    def sent_cost_since(self, iu_id: str, ts: float, default_cost_s: float) -> float:
        acked_at = self.acked_at(iu_id)
        times = self._since(iu_id, ts)
        cost = self.queued_excess(iu_id, ts, acked_at if self.sized else -math.inf) if self.queued else 0.0
        if not times:
            return cost
        known, unknown = self._sums[iu_id]
        for sent, sent_cost in times:  # the oldest, already in the score through their announcements
            if sent > acked_at:
                break
            if sent_cost is None:
                unknown -= 1
            else:
                known -= sent_cost
        else:  # all of them: no float residue of the subtractions
            return cost
        return cost + max(0.0, known) + unknown * default_cost_s

    def queued_excess(self, iu_id: str, ts: float, acked_at: float = -math.inf) -> float:
        """The shipped excess, for requests not announced by the score: an announced one has its real size."""
        excess = super().queued_excess(iu_id, ts)
        return excess - sum(e for sent, until, e in self.queued.get(iu_id, ())
                            if sent <= acked_at and sent < ts <= until)


class AnnounceEdge(ScoredEdge):
    """The shipped edge (p2c Router) with the announce ledger; every request it sends is announced."""

    def __init__(self, view: AnnounceView, rng, iu_ids: list[str], index: int, nodes: AnnounceNodes,
                 sender: AnnounceSender):
        super().__init__(view, rng, iu_ids, "p2c")
        self.index, self.sender = index, sender
        self.router.ledger = self.ledger = AnnounceLedger(lambda iu: view.acked(index, nodes.node_of[iu]),
                                                          nodes.waiting_sizes)

    def pick(self, request: TraceRequest, now: float) -> int:
        chosen = super().pick(request, now)
        self.sender.announce(Announcement(self.iu_ids[chosen], request.prompt, self.index, self.ledger.seq, now), now)
        return chosen


def announce_edges(fleet: AgentFleet, views: list[AnnounceView], loop: EventLoop, rngs, iu_ids: list[str],
                   nodes: AnnounceNodes) -> list[AnnounceEdge]:
    """Each edge's push feed, announce sender (ticks spread over the batch interval) and router."""
    edges = []
    for i, view in enumerate(views):
        AnnouncePush(nodes, fleet, view, loop)
        sender = AnnounceSender(nodes, loop, phase_s=ANNOUNCE_BATCH_S * i / len(views))
        edges.append(AnnounceEdge(view, rngs[i], iu_ids, i, nodes, sender))
    return edges
