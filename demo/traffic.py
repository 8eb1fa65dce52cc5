"""The demo's clients: the production request mix sent over HTTP to the edge (an ``eas-edge`` process).

Each arrival is a streaming ``/v1/completions`` request (the prompt as token ids, so the edge and the
simulated engine count the same tokens) posted to the edge, which routes it with ``pick()`` and passes the
SSE stream through; TTFT is the first chunk's arrival here, E2E the stream's end, the serving IU is the
edge's ``X-Eas-IU`` header. Latencies are kept for a rolling summary; :func:`edge_counters` reads the
edge's own ``/metrics`` for the live panel.
"""

from __future__ import annotations

import json
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
        # The production mix lives with the simulators; imported when the demo runs (tests/guards/test_import_lint.py).
        from sim.vllm.workload import draw_request_shape

        while not self.stopping.wait(self.rng.expovariate(self.rate)):
            _, prompt, output = draw_request_shape(self.rng)
            with self.lock:
                self.inflight += 1
            self.pool.submit(self._send, prompt, output)

    def _send(self, prompt: int, output: int) -> None:
        from sim.vllm.openai_api import MODEL_NAME

        body = json.dumps({"model": MODEL_NAME, "prompt": [1] * prompt, "max_tokens": output,
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
