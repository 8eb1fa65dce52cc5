"""The announce channel, edge side: each request this edge sends is announced to its IU's node agent.

The messages: eas_wire/announce.py (the contract: docs/contracts/announce.md); what the agent does with
them: eas_agent/announce.py. Here: :class:`AnnounceSender`, on the
edge's event loop and its one ``aiohttp.ClientSession``.

- The request path calls :meth:`AnnounceSender.announce` (an append, and a timer when the node has none):
  nothing is awaited there.
- Per node, what was queued leaves at this edge's next tick of ``batch_s`` (10 ms; the tick's phase is
  drawn at start so that edges spread over the interval) as one ``POST /announce``, items in sequence
  order. At most one POST per node is in flight: what is queued meanwhile waits for the next tick after
  it ends (the agent's acknowledgement "everything up to ``seq``" needs each node's batches in order). A
  batch holds at most :data:`~eas_wire.announce.MAX_BATCH_ITEMS`; more are dropped.
- A dropped announcement is handed to the ledger (``EdgeLedger.unannounce``): an acknowledgement of a
  higher number does not cover it, so the edge counts that request by time, as without the channel.
  Dropped: a POST that failed (no connection, no answer within :data:`TIMEOUT_S`, any status but 200),
  everything queued for a node while its agent is failing (a backoff of ~:data:`BACKOFF_S`, jittered, after
  each failure: no queue builds up behind an unreachable agent), a batch's overflow, and what a 200 says
  the agent did not count (``ignored_seqs``: its acknowledgement, the last number counted, may pass over
  them). An answer that accepted fewer than the batch held without naming exactly which has the whole
  batch counted by time: a score briefly counts the accepted ones twice, never one not at all.
- Each POST is signed with this edge's Ed25519 key (eas_wire/signing.py: the exact body, a time and a
  nonce); the agents hold only the edges' public keys.
- 401 (the agent does not hold this edge's public key, or refused the signature), 403 (the edge id does not
  name the key), 404 (the channel is off at that agent), 400/413 (the agent refused the batch's shape) back
  off like a failure. Each node's state changes (working, failing, unauthorized, off, refused) are logged once
  per change, at most one line per :data:`LOG_INTERVAL_S` per node; the key is never logged.
- :meth:`AnnounceSender.close` sends what is queued at once and waits for it (bounded), then stops.

The edge id (:func:`edge_id`) is this edge's name, its key's id and a nonce drawn at each start, so a
restarted edge never matches an acknowledgement given to its previous life and no other key speaks for it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import re
import secrets
import socket
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from eas_wire.announce import ANNOUNCE_PATH, MAX_BATCH_ITEMS, Announcement, batch_json, read_answer
from eas_wire.scorebody import EDGE_ID
from eas_wire.signing import KEY_ID_HEX, SIGNATURE_HEADER, Ed25519PrivateKey, key_id, sign

log = logging.getLogger("edge.announce")

NONCE_HEX = 8
MAX_NAME = 80 - 1 - KEY_ID_HEX - 1 - NONCE_HEX  # EDGE_ID allows 80 characters: name, key id, nonce
DEFAULT_BATCH_S = 0.01
TIMEOUT_S = 0.5  # one POST, connecting included: an agent on the same network answers in ~1 ms
BACKOFF_S = 1.0
LOG_INTERVAL_S = 30.0
CLOSE_TIMEOUT_S = 1.0

# non-200 answers of the agent's endpoint: (state, what it means)
REFUSALS = {
    401: ("unauthorized", "401: the agent does not hold this edge's public key or refused its signature"),
    403: ("refused", "403: the agent says the edge id does not name this edge's key"),
    404: ("off", "404: the announce channel is off at that agent"),
    400: ("refused", "400: the agent refused the batch as malformed"),
    413: ("refused", "413: the agent refused the batch as too large"),
}


def edge_id(key: Ed25519PrivateKey, name: str | None = None) -> str:
    """``<name>.<key id>.<8 hex digits>``: ``name`` (default: this host's name) with every character the edge
    id does not allow (:data:`~eas_wire.scorebody.EDGE_ID`) replaced by ``-``, cut to fit; ``key``'s id
    (what the agents check the signature against); a new nonce each call."""
    raw = socket.gethostname() if name is None else name
    clean = re.sub(r"[^A-Za-z0-9._:-]", "-", raw).lstrip("._:-")[:MAX_NAME] or "edge"
    ident = f"{clean}.{key_id(key.public_key())}.{secrets.token_hex(NONCE_HEX // 2)}"
    if not EDGE_ID.fullmatch(ident):  # cannot happen by construction; a wrong id would be refused by every agent
        raise ValueError(f"edge id {ident!r} does not match {EDGE_ID.pattern}")
    return ident


@dataclass(eq=False)
class _Node:
    name: str
    agent: str  # HOST:PORT of its agent
    pending: list = field(default_factory=list)  # (iu, tokens, seq, sent, blocks), in sequence order
    timer: asyncio.TimerHandle | None = None
    inflight: asyncio.Task | None = None
    down_until: float = 0.0  # loop time: announcements until then are dropped (the agent failed)
    state: str = "ok"
    logged_at: float = -math.inf
    unlogged: int = 0  # state changes not logged (rate limit)


class AnnounceSender:
    """Batches this edge's announcements per node and sends them, one POST per node at a time.

    ``ledger``: the router's ``EdgeLedger`` (``unannounce``); ``rtt``: called with each successful POST's
    round trip in seconds (a histogram's ``observe``). ``batches`` (sent | failed | dropped) and
    ``announcements`` (sent | dropped) count what happened, for /metrics."""

    def __init__(self, session: aiohttp.ClientSession, ledger, edge: str, key: Ed25519PrivateKey, *,
                 batch_s: float = DEFAULT_BATCH_S, timeout_s: float = TIMEOUT_S, backoff_s: float = BACKOFF_S,
                 rng: random.Random | None = None, rtt: Callable[[float], None] | None = None):
        self.session, self.ledger, self.edge, self.key = session, ledger, edge, key
        self.batch_s, self.backoff_s = batch_s, backoff_s
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.rng = rng if rng is not None else random.Random()
        self.phase = self.rng.uniform(0.0, batch_s)  # this edge's ticks within the interval
        self.rtt = rtt
        self.nodes: dict[str, _Node] = {}
        self.batches: Counter[str] = Counter()
        self.announcements: Counter[str] = Counter()
        self.closing = self.closed = False

    # -- the request path ---------------------------------------------------------------------------------
    def announce(self, node: str, agent_address: str, iu: str, tokens: int, seq: int, sent: float,
                 blocks: tuple = ()) -> None:
        """Queue request ``seq`` (``tokens`` prompt tokens sent to ``iu`` at wall time ``sent``; ``blocks``: a
        few of its block hashes for the agent to relay, eas_wire/placed.py) for the agent of ``node`` at
        ``agent_address`` (HOST:PORT). Never waits."""
        n = self.nodes.get(node)
        if n is None:
            n = self.nodes[node] = _Node(node, agent_address)
        elif n.agent != agent_address:  # the node's agent moved: a new agent, nothing of the old one's state
            n.agent, n.down_until = agent_address, 0.0
        loop = asyncio.get_running_loop()
        if self.closed or len(n.pending) >= MAX_BATCH_ITEMS or (n.down_until and loop.time() < n.down_until):
            self._drop([seq])
            return
        n.pending.append((iu, tokens, seq, sent, blocks))
        if n.timer is None and n.inflight is None:
            self._schedule(n, loop)

    # -- batches ------------------------------------------------------------------------------------------
    def _drop(self, seqs) -> None:
        self.ledger.unannounce(seqs)
        self.announcements["dropped"] += len(seqs)

    def _drop_pending(self, n: _Node) -> None:
        """Drop what is queued for ``n`` (one dropped batch), never sent."""
        if n.pending:
            self.batches["dropped"] += 1
            self._drop([item[2] for item in n.pending])
            n.pending = []

    def _schedule(self, n: _Node, loop: asyncio.AbstractEventLoop) -> None:
        now = loop.time()
        n.timer = loop.call_at(now if self.closing else now + self.batch_s - (now - self.phase) % self.batch_s,
                               self._tick, n)

    def _tick(self, n: _Node) -> None:
        n.timer = None
        if n.inflight is not None or not n.pending:
            return
        batch, n.pending = n.pending, []
        n.inflight = asyncio.get_running_loop().create_task(self._post(n, batch), name=f"announce-{n.name}")

    async def _post(self, n: _Node, batch: list) -> None:
        seqs = [item[2] for item in batch]
        data = batch_json(self.edge, (Announcement(*item) for item in batch))
        loop = asyncio.get_running_loop()
        started = loop.time()
        failure = None  # (state, detail)
        accepted = len(batch)
        try:
            headers = {SIGNATURE_HEADER: sign(self.key, data, time.time()), "Content-Type": "application/json"}
            async with self.session.post(f"http://{n.agent}{ANNOUNCE_PATH}", data=data, headers=headers,
                                         timeout=self.timeout) as answer:
                raw = await answer.read()
                status = answer.status
            if status == 200:
                accepted, ignored_seqs = read_answer(raw, seqs)
            else:
                failure = REFUSALS.get(status, ("failing", f"HTTP {status}"))
        except asyncio.CancelledError:  # close() gave up on it
            n.inflight = None
            self.batches["failed"] += 1
            self._drop(seqs)
            raise
        except Exception as exc:  # noqa: BLE001 - refused, reset, timed out, or a bug: the batch is lost either way
            failure = ("failing", type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}")
        n.inflight = None
        if failure is None:
            self.batches["sent"] += 1
            self.announcements["sent"] += accepted
            if accepted < len(batch):  # those the agent did not count (all of them when it does not say which)
                self.ledger.unannounce(ignored_seqs)
                self.announcements["dropped"] += len(batch) - accepted
            if self.rtt is not None:
                self.rtt(loop.time() - started)
            n.down_until = 0.0
            self._set_state(n, "ok", "announcements accepted")
        else:
            self.batches["failed"] += 1
            self._drop(seqs)
            n.down_until = loop.time() + self.backoff_s * self.rng.uniform(0.75, 1.25)
            self._drop_pending(n)  # queued behind the failed batch: the agent is failing, they go too
            self._set_state(n, *failure)
        if n.pending and n.timer is None:
            self._schedule(n, loop)

    def _set_state(self, n: _Node, state: str, detail: str) -> None:
        if state == n.state:
            return
        n.state = state
        now = time.monotonic()
        if now - n.logged_at < LOG_INTERVAL_S:
            n.unlogged += 1
            return
        hidden = f" ({n.unlogged} changes since the last line not logged)" if n.unlogged else ""
        n.logged_at, n.unlogged = now, 0
        if state == "ok":
            log.info("announce to %s (%s): working again%s", n.name, n.agent, hidden)
        else:
            log.warning("announce to %s (%s): %s; its announcements are dropped for ~%g s after each failure "
                        "(its requests counted by time)%s", n.name, n.agent, detail, self.backoff_s, hidden)

    # -- shutdown -----------------------------------------------------------------------------------------
    def _send_now(self, n: _Node) -> None:
        """``n``'s queue leaves now (unless a POST is in flight) instead of at its next tick."""
        if n.timer is not None:
            n.timer.cancel()
            n.timer = None
        self._tick(n)

    async def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Send what is queued now and wait for it up to ``timeout_s``; then cancel what is left and stop."""
        self.closing = True
        loop = asyncio.get_running_loop()
        for n in self.nodes.values():
            self._send_now(n)
        deadline = loop.time() + timeout_s
        while True:
            busy = [n.inflight for n in self.nodes.values() if n.inflight is not None]
            remaining = deadline - loop.time()
            if not busy or remaining <= 0:
                break
            await asyncio.wait(busy, timeout=remaining)
            for n in self.nodes.values():  # what was queued behind a POST that just ended
                self._send_now(n)
        self.closed = True
        left = []
        for n in self.nodes.values():
            if n.timer is not None:
                n.timer.cancel()
                n.timer = None
            if n.inflight is not None:
                n.inflight.cancel()
                left.append(n.inflight)
            self._drop_pending(n)
        if left:
            await asyncio.gather(*left, return_exceptions=True)

