"""The demo's clients: the production request mix sent over HTTP to the edge (an ``eas-edge`` process).

Each arrival is a streaming ``/v1/completions`` request (the prompt as token ids, so the edge and the
simulated engine count the same tokens and the engine's prefix cache hashes the real prompt) posted to the
edge, which routes it with ``pick()`` and passes the SSE stream through; TTFT is the first chunk's arrival
here, E2E the stream's end, the serving IU is the edge's ``X-Eas-IU`` header. Latencies are kept for a
rolling summary; :func:`edge_counters` reads the edge's own ``/metrics`` for the live panel.

Prompts (:class:`DemoPrompts`): :data:`MULTI_TURN_SHARE` of the arrivals are the next turn of one of up to
:data:`OPEN_CONVERSATIONS` open conversations: the previous turn's prompt, its answer and a new user
message, so the prompt grows and starts with the turn before (what a unit's prefix cache can serve). The
others are single turns of the production mix, of random token ids (no two share a prefix), each opening a
conversation. The share is the demo's choice: production traces differ widely (Wang et al., "KVCache Cache
in the Wild", arXiv 2506.02634: under 0.1% of a cloud provider's API requests are multi-turn, while its
chatbot traffic's reuse is mostly within a user's conversation); 30% shows both kinds of traffic side by
side. The stand-in engine streams no token ids, so an answer's ids are derived from the conversation and
turn (:func:`answer_ids`): the next turn carries them exactly as a client would send its transcript back.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter, deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Completed:
    at: float
    iu_id: str
    ttft_s: float
    e2e_s: float


MULTI_TURN_SHARE = 0.3  # of the arrivals, the next turn of an open conversation (module docstring)
OPEN_CONVERSATIONS = 32  # conversations a next turn may continue; a new one replaces the oldest
USER_TURN_MEAN_TOKENS = 120  # a follow-up user message (bench/routesim/sessions.py's multi-turn workload)
USER_TURN_SIGMA = 0.6
VOCABULARY = 128_256  # Llama 3's vocabulary: the token ids drawn are valid for the served model


@dataclass
class Conversation:
    key: int
    turn: int  # turns sent so far
    prompt: list[int]  # the last turn's prompt
    answer_tokens: int  # the last turn's max_tokens (the stand-in engine generates exactly that many)


def answer_ids(key: int, turn: int, tokens: int) -> list[int]:
    """The token ids of conversation ``key``'s answer to turn ``turn`` (deterministic: the next turn sends
    them back as its prefix's middle)."""
    rng = random.Random(f"answer:{key}:{turn}")
    return [rng.randrange(VOCABULARY) for _ in range(tokens)]


class DemoPrompts:
    """The demo's prompts, from one seeded RNG: single turns of unique token ids and the next turns of open
    conversations (module docstring)."""

    def __init__(self, rng: random.Random, multi_turn_share: float = MULTI_TURN_SHARE,
                 open_conversations: int = OPEN_CONVERSATIONS):
        if not 0.0 <= multi_turn_share < 1.0 or open_conversations < 1:
            raise ValueError(f"multi_turn_share {multi_turn_share!r} (0..<1) or open_conversations "
                             f"{open_conversations!r} (>= 1) out of range")
        self.rng, self.share, self.limit = rng, multi_turn_share, open_conversations
        self.open: dict[int, Conversation] = {}  # insertion order: the oldest first
        self.keys = 0

    def draw(self) -> tuple[list[int], int, Conversation]:
        """(prompt token ids, max tokens, the conversation it is a turn of) of the next arrival."""
        # The production mix lives with the simulators; imported when the demo runs (tests/guards/test_import_lint.py).
        from sim.vllm.workload import MAX_MODEL_LEN, draw_request_shape

        rng = self.rng
        _, prompt_tokens, output = draw_request_shape(rng)
        if self.open and rng.random() < self.share:
            conversation = self.open[rng.choice(list(self.open))]
            user = max(1, int(rng.lognormvariate(math.log(USER_TURN_MEAN_TOKENS) - USER_TURN_SIGMA ** 2 / 2,
                                                 USER_TURN_SIGMA)))
            prompt = (conversation.prompt + answer_ids(conversation.key, conversation.turn, conversation.answer_tokens)
                      + [rng.randrange(VOCABULARY) for _ in range(user)])
            if len(prompt) + output <= MAX_MODEL_LEN:
                conversation.turn += 1
                conversation.prompt, conversation.answer_tokens = prompt, output
                return prompt, output, conversation
            del self.open[conversation.key]  # the context is full: the conversation ends, a new one starts
        self.keys += 1
        conversation = Conversation(self.keys, 1, [rng.randrange(VOCABULARY) for _ in range(prompt_tokens)], output)
        if len(self.open) >= self.limit:
            del self.open[next(iter(self.open))]
        self.open[conversation.key] = conversation
        return conversation.prompt, output, conversation


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class DemoEdge:
    def __init__(self, edge_url: str, rate: float, seed: int = 0, workers: int = 96, api_key: str | None = None):
        """``edge_url``: http://HOST:PORT of the eas-edge process; ``rate``: requests/s; ``api_key``: the
        tenant's key (sent as ``Authorization: Bearer``)."""
        self.edge_url, self.rate = edge_url, rate
        self.auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.rng = random.Random(seed)
        self.prompts = DemoPrompts(random.Random(seed ^ 0x7E57))
        self.turns: Counter[str] = Counter()  # arrivals by kind: "single" turns and "next" turns
        self.lock = threading.Lock()
        self.completed: deque[Completed] = deque(maxlen=20_000)
        self.modes: Counter[str] = Counter()  # the edge's answers: routed, or its own 503 reason
        self.sent_to: Counter[str] = Counter()
        self.inflight = 0
        self.errors = 0
        self.unroutable = 0
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="demo-client")
        self.thread = threading.Thread(target=self._arrivals, name="demo-arrivals", daemon=True)

    def start(self) -> DemoEdge:
        self.thread.start()
        return self

    def stop(self, drain_s: float = 3.0) -> None:
        self.stopping.set()
        self.thread.join(timeout=2)
        # requests still in flight are abandoned after drain_s: the IU servers are stopped next anyway
        deadline = time.monotonic() + drain_s
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _arrivals(self) -> None:
        while not self.stopping.wait(self.rng.expovariate(self.rate)):
            prompt, output, conversation = self.prompts.draw()
            with self.lock:
                self.inflight += 1
                self.turns["single" if conversation.turn == 1 else "next"] += 1
            self.pool.submit(self._send, prompt, output)

    def _send(self, prompt: list[int], output: int) -> None:
        from sim.vllm.openai_api import MODEL_NAME

        body = json.dumps({"model": MODEL_NAME, "prompt": prompt, "max_tokens": output,
                           "stream": True}).encode()
        request = urllib.request.Request(f"{self.edge_url}/v1/completions", data=body, method="POST",
                                         headers={"Content-Type": "application/json", **self.auth})
        started, first, iu_id, done, mode = time.monotonic(), None, None, None, "routed"
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                iu_id = answer.headers.get("X-Eas-IU")
                for line in answer:
                    if first is None and line.startswith(b"data: {"):
                        first = time.monotonic()
                    if line.startswith(b"event: error"):
                        raise ValueError("the stream ended with an error event")
            if first is not None and iu_id:
                done = Completed(time.time(), iu_id, first - started, time.monotonic() - started)
        except urllib.error.HTTPError as exc:
            mode = f"http {exc.code}"
        except (OSError, ValueError):
            pass
        with self.lock:
            self.inflight -= 1
            self.modes[mode] += 1
            if iu_id:
                self.sent_to[iu_id] += 1
            if mode.startswith("http 503"):
                self.unroutable += 1
            elif done is None:
                self.errors += 1
            else:
                self.completed.append(done)

    def summary(self, window_s: float = 15.0) -> dict:
        """Rolling latency summary over the last ``window_s`` seconds, plus totals."""
        cutoff = time.time() - window_s
        with self.lock:
            recent = [c for c in self.completed if c.at >= cutoff]
            total = len(self.completed)
            inflight = self.inflight
            modes, errors, unroutable = dict(self.modes), self.errors, self.unroutable
            sent_to = dict(self.sent_to)
            turns = dict(self.turns)
        ttft = [c.ttft_s for c in recent]
        e2e = [c.e2e_s for c in recent]
        return {
            "window_s": window_s,
            "completed_window": len(recent),
            "completed_total": total,
            "inflight": inflight,
            "ttft_p50_s": percentile(ttft, 0.50),
            "ttft_p95_s": percentile(ttft, 0.95),
            "e2e_p50_s": percentile(e2e, 0.50),
            "e2e_p95_s": percentile(e2e, 0.95),
            "pick_modes": modes,
            "sent_to": sent_to,
            "errors": errors,
            "unroutable": unroutable,
            "turns": turns,
        }


def edge_counters(admin_urls: list[str]) -> dict | str:
    """The edges' own /metrics (each on its admin listener), summed into what the live panel says
    (:func:`demo.view.edge_line`): picks by mode, requests in flight, queued, rejected and retried, agents
    pushing scores, scores ignored and, announcing, announcements and batches by result; ``edges``: how many
    answered, ``unread``: why the others did not. Why none could be read, when none could."""
    texts, unread = [], []
    for url in admin_urls:
        try:
            with urllib.request.urlopen(f"{url}/metrics", timeout=1) as answer:
                texts.append(answer.read().decode())
        except OSError as exc:
            unread.append(f"{url}: {exc}")
    if not texts:
        return "; ".join(unread) or "no edge"
    return {**counters_of(*texts), "edges": len(texts), "unread": unread}


SUMMED = {"eas_edge_inflight": "inflight", "eas_edge_queue_depth": "queued", "eas_edge_retries_total": "retried",
          "eas_edge_rejected_total": "rejected", "eas_edge_push_connected": "agents_pushing",
          "eas_edge_scores_ignored_total": "scores_ignored"}
BY_LABEL = {"eas_edge_picks_total": ("picks", "mode"), "eas_edge_announcements_total": ("announced", "result"),
            "eas_edge_announce_batches_total": ("announce_batches", "result")}


def counters_of(*texts: str) -> dict:
    """Each edge's /metrics text, summed."""
    values: dict = {}
    for family in (f for text in texts for f in text_string_to_metric_families(text)):
        for sample in family.samples:
            if sample.name in SUMMED:
                values[SUMMED[sample.name]] = values.get(SUMMED[sample.name], 0) + sample.value
            elif sample.name in BY_LABEL:
                key, label = BY_LABEL[sample.name]
                by = values.setdefault(key, Counter())
                by[sample.labels[label]] += sample.value
    # an edge without the announce channel counts none: nothing to say about it
    if not sum(values.get("announced", {}).values()) and not sum(values.get("announce_batches", {}).values()):
        values.pop("announced", None)
        values.pop("announce_batches", None)
    return values
