"""The demo's edge: the production request mix, routed by the reader library, sent to simulated IUs.

Each arrival asks ``eas_agent.scheduler.pick`` for an IU (the view is kept fresh by Consul blocking
queries), records it in this edge's ledger, and sends a non-streaming completion to that IU's server,
which answers when the request has finished in its load model. Latencies are kept for a rolling summary.
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

from eas_agent.scheduler import EdgeLedger, PoolView, pick
from eas_agent.sim.workload import draw_request_shape


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
    def __init__(self, view: PoolView, endpoints: dict[str, str], rate: float, seed: int = 0, workers: int = 96):
        """``endpoints``: IU id -> "address:port" of its (simulated) vLLM server; ``rate``: requests/s."""
        self.view, self.endpoints, self.rate = view, endpoints, rate
        self.rng = random.Random(seed)
        self.ledger = EdgeLedger()
        self.lock = threading.Lock()
        self.completed: deque[Completed] = deque(maxlen=20_000)
        self.modes: Counter[str] = Counter()
        self.sent_to: Counter[str] = Counter()
        self.errors = 0
        self.unroutable = 0
        self.stopping = threading.Event()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="demo-edge")
        self.thread = threading.Thread(target=self._arrivals, name="demo-arrivals", daemon=True)

    def start(self) -> DemoEdge:
        self.thread.start()
        return self

    def stop(self, drain_s: float = 3.0) -> None:
        self.stopping.set()
        self.thread.join(timeout=2)
        # requests still in flight are abandoned after drain_s: the IU servers are stopped next anyway
        deadline = time.monotonic() + drain_s
        while sum(self.ledger.inflight.values()) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.pool.shutdown(wait=False, cancel_futures=True)

    def _arrivals(self) -> None:
        while not self.stopping.wait(self.rng.expovariate(self.rate)):
            _, prompt, output = draw_request_shape(self.rng)
            now = time.time()
            choice = pick(self.view.snapshot(), self.ledger, now, self.rng)
            with self.lock:
                self.modes[choice.mode] += 1
                if choice.iu_id is None or choice.iu_id not in self.endpoints:
                    self.unroutable += 1
                    continue
                self.ledger.on_sent(choice.iu_id, now)
                self.sent_to[choice.iu_id] += 1
            self.pool.submit(self._send, choice.iu_id, prompt, output)

    def _send(self, iu_id: str, prompt: int, output: int) -> None:
        body = json.dumps({"prompt_tokens": prompt, "max_tokens": output}).encode()
        request = urllib.request.Request(
            f"http://{self.endpoints[iu_id]}/v1/completions", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as answer:
                result = json.load(answer)
            done = Completed(time.time(), iu_id, float(result["ttft_s"]), float(result["e2e_s"]))
        except (OSError, ValueError, KeyError, urllib.error.URLError):
            done = None
        with self.lock:
            self.ledger.on_done(iu_id)
            if done is None:
                self.errors += 1
            else:
                self.completed.append(done)

    def summary(self, window_s: float = 15.0) -> dict:
        """Rolling latency summary over the last ``window_s`` seconds, plus totals."""
        cutoff = time.time() - window_s
        with self.lock:
            recent = [c for c in self.completed if c.at >= cutoff]
            total = len(self.completed)
            inflight = sum(self.ledger.inflight.values())
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
