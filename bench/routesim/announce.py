"""The announce channel as eas-edge and eas-agent ship it, driven in simulated time.

The rows ``ours (push + announce + Consul)`` are the shipped push path plus the announce channel
(docs/contracts/announce.md has the protocol; edge/announce.py the edge's sender):

- edge: every request it sends is announced to the chosen IU's node agent as (iu, prompt tokens, sequence
  number, send time, a few of its block hashes: edge/pool/prefix.py's relay_blocks); announcements are batched per node and leave at the edge's next tick (every
  ``batch_s``, 10 ms, the edges' ticks spread over the interval) and reach the agent ``transit_s`` (0.5 ms)
  later on a connection already open;
- agent: the shipped :class:`~eas_agent.announce.NodeAnnouncements` of the node's real ``Agent``
  (``Agent.announcements``) receives the batch; its IUs' scorers are the shipped
  :class:`~eas_agent.announce.AnnounceScorer` around the drain scorer (the agent wraps them itself), and the
  body it serves is :meth:`~eas_agent.announce.NodeAnnouncements.body` of the last cycle's body, pushed to
  every edge the way cycle bodies are (``PUSH_LATENCY_S`` transit, then the edge's apply interval, 20 ms);
- edge: the shipped ``EdgeView`` with its ``edge_id`` set (it reads the bodies' relayed placements, which the
  router's prefix index takes before each pick, as edge/proxy.py does) (entries carry the body's acknowledgement), the
  shipped ``Router`` whose ``EdgeLedger`` announces (sequence numbers; acknowledged requests leave its cost)
  and the shipped anomaly detector (it judges ``score - announced_s``).

What is simulated: only the transport (timers for the batch tick, the transit and the push). Bodies reach
the view as typed ScoreBody objects (the simulated push does not serialise them; the shipped push
serialises and parses its bodies). What the simulation does not model is in edge/README.md.
"""

from __future__ import annotations

import math
from dataclasses import replace

from eas_agent.announce import NodeAnnouncements
from eas_wire.announce import Announcement
from eas_wire.placed import first_unsent
from edge.feed import EdgeView
from edge.pool.prefix import relay_blocks
from sim.vllm.eventloop import EventLoop

from .agents import AgentFleet, SimNodeAgent
from .readers import AgentPush, ScoredEdge
from .workload import TraceRequest

ANNOUNCE_BATCH_S = 0.010  # edge.config's announce batch_ms default
ANNOUNCE_TRANSIT_S = 0.0005  # one small message on a LAN connection that is already open


def edge_id(index: int) -> str:
    return f"edge{index}.sim"


class AnnounceNodes:
    """Every node agent's announce endpoint (the shipped NodeAnnouncements of each node's Agent); after each
    batch the node's body is pushed to every edge."""

    def __init__(self, fleet: AgentFleet, loop: EventLoop, transit_s: float = ANNOUNCE_TRANSIT_S):
        self.loop, self.transit_s = loop, transit_s
        self.agents = {agent.config.node: agent for agent in fleet.agents}
        self.node_of = {iu.id: agent.config.node for agent in fleet.agents for iu in agent.config.ius}
        self.listeners: list = []  # (SimNodeAgent, now): a body to push
        self.pushers: list[AnnouncePush] = []
        self.batches = self.announcements = 0

    @staticmethod
    def channel(agent: SimNodeAgent) -> NodeAnnouncements:
        return agent.agent.announcements

    @classmethod
    def body(cls, agent: SimNodeAgent):
        """What the agent's /scores serves now: its last cycle's body with the announcements since."""
        base = agent.agent.scores_base
        return None if base is None else cls.channel(agent).body(base)

    def send(self, node: str, edge: str, batch: list[Announcement], now: float) -> None:
        self.loop.schedule(now + self.transit_s, self._deliver, (node, edge, batch))

    def _deliver(self, item, now: float) -> None:
        node, edge, batch = item
        agent = self.agents[node]
        self.channel(agent).receive(edge, batch, now)
        self.batches += 1
        self.announcements += len(batch)
        for listener in self.listeners:
            listener(agent, now)


class AnnounceSender:
    """One edge's announcements (edge/announce.py's timing): per node, those sent since its last batch leave
    at the edge's next tick."""

    def __init__(self, nodes: AnnounceNodes, loop: EventLoop, edge: str, phase_s: float,
                 batch_s: float = ANNOUNCE_BATCH_S):
        self.nodes, self.loop, self.edge, self.phase_s, self.batch_s = nodes, loop, edge, phase_s, batch_s
        self.buffers: dict[str, list[Announcement]] = {}

    def next_tick(self, now: float) -> float:
        return self.phase_s + (math.floor((now - self.phase_s) / self.batch_s) + 1) * self.batch_s

    def announce(self, announcement: Announcement, now: float) -> None:
        node = self.nodes.node_of[announcement.iu]
        buffer = self.buffers.get(node)
        if buffer is None:
            buffer = self.buffers[node] = []
            self.loop.schedule(self.next_tick(now), self._flush, node)
        buffer.append(announcement)

    def _flush(self, node: str, now: float) -> None:
        self.nodes.send(node, self.edge, self.buffers.pop(node), now)


class AnnouncePush(AgentPush):
    """The shipped push path carrying announced bodies: after every cycle and after every announce batch."""

    def __init__(self, nodes: AnnounceNodes, fleet: AgentFleet, view: EdgeView, loop: EventLoop):
        self.nodes = nodes
        self.announce_pushes = 0  # bodies pushed because of an announce batch (cycle bodies not counted)
        self.placed_carried = 0  # relayed placements in the bodies pushed to this edge (each once per body)
        self.sent: dict[str, int] = {}  # node -> the relay number of the last placement pushed to this edge
        super().__init__(fleet, view, loop)
        for agent in fleet.agents:  # an announcing edge holds a signed stream to every agent
            agent.sink.edge_streams += 1
        nodes.listeners.append(self._on_batch)
        nodes.pushers.append(self)

    def _on_cycle(self, agent: SimNodeAgent, now: float) -> None:
        self._push(agent, now)

    def _on_batch(self, agent: SimNodeAgent, now: float) -> None:
        self.announce_pushes += 1
        self._push(agent, now)

    def _push(self, agent: SimNodeAgent, now: float) -> None:
        body = self.nodes.body(agent)
        if body is not None:
            node = agent.config.node
            if body.placed:  # as the agent's stream writes it: the placements not yet written to this edge
                sent = self.sent.get(node, 0)
                self.sent[node] = body.placed[-1].seq
                body = replace(body, placed=body.placed[first_unsent(body.placed, sent):])
            self.placed_carried += len(body.placed)
            self.loop.schedule(now + self.latency_s, self._arrive, (agent.config.node, body))

    def _arrive(self, item, now: float) -> None:
        self.view.read_placed(item[1])  # as edge/feed.py reads a line's placements: as it arrives
        super()._arrive(item, now)


class AnnounceEdge(ScoredEdge):
    """The shipped edge (p2c Router, its ledger announcing); every request it sends is announced."""

    def __init__(self, view: EdgeView, rng, iu_ids: list[str], sender: AnnounceSender, prefix: bool = True):
        view.edge_id = sender.edge
        super().__init__(view, rng, iu_ids, "p2c", announcing=True, prefix=prefix)
        self.sender = sender

    def pick(self, request: TraceRequest, now: float) -> int:
        chosen = super().pick(request, now)
        # as edge/proxy.py announces: the tokens the chosen IU is expected to prefill (its prefix cache's left out)
        tokens = self.decision.prefill_tokens(request.prompt) if self.decision is not None else request.prompt
        blocks = relay_blocks(request.blocks) if self.router.prefix is not None else ()
        self.sender.announce(Announcement(self.iu_ids[chosen], tokens, self.ledger.seq, now, blocks), now)
        return chosen


def announce_edges(fleet: AgentFleet, views: list[EdgeView], loop: EventLoop, rngs, iu_ids: list[str],
                   nodes: AnnounceNodes, prefix: bool = True) -> list[AnnounceEdge]:
    """Each edge's push feed, announce sender (ticks spread over the batch interval) and router."""
    edges = []
    for i, view in enumerate(views):
        AnnouncePush(nodes, fleet, view, loop)
        sender = AnnounceSender(nodes, loop, edge_id(i), phase_s=ANNOUNCE_BATCH_S * i / len(views))
        edges.append(AnnounceEdge(view, rngs[i], iu_ids, sender, prefix))
    return edges
