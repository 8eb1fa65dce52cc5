"""One simulated IU: an HTTP server on the IU's address:port serving vLLM-like ``/metrics`` and ``/health``.

The load model is advanced lazily to the current time on each request, so an idle server costs nothing and
no background thread is needed besides the HTTP one. Controls (``set_arrival_rate``, ``hang``, ``fail``)
let tests and the demo drive different loads and faults.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler

from eas_agent.http import QuietHTTPServer
from eas_agent.sim.exposition import VllmExposition
from eas_agent.sim.loadmodel import LoadModel, ModelParams


class SimulatedIU:
    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        schema: str = "v1",
        arrival_rate: float = 1.0,
        seed: int = 0,
        params: ModelParams | None = None,
        clock=time.monotonic,
        warmup_s: float = 0.0,
    ):
        """``warmup_s``: the model starts that long in the past, so the first scrape shows a steady state."""
        self.clock = clock
        self.model = LoadModel(params, arrival_rate=arrival_rate, seed=seed, start=clock() - warmup_s)
        self.exposition = VllmExposition(self.model, schema)
        self.lock = threading.Lock()
        self.healthy = True  # /health answer
        self.failing = False  # /metrics answers 500
        self.scrapes = 0
        self.server = QuietHTTPServer((host, port), self._handler())
        self.thread: threading.Thread | None = None

    @property
    def address(self) -> str:
        host, port = self.server.server_address[:2]
        return f"{host}:{port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.address}/metrics"

    def metrics_text(self) -> str:
        with self.lock:
            self.model.advance(self.clock())
            self.scrapes += 1
            return self.exposition.render()

    def set_arrival_rate(self, rate: float) -> None:
        with self.lock:
            self.model.advance(self.clock())
            self.model.set_arrival_rate(rate)

    def complete(self, prompt_tokens: int, max_tokens: int, timeout_s: float = 120.0) -> dict | None:
        """Serve one request through the load model, blocking until it finishes in model time.

        Returns its TTFT and end-to-end latency (seconds), or None when it did not finish within timeout_s
        (a hung engine). Like a non-streaming completion call, the answer arrives once the request is done.
        """
        with self.lock:
            self.model.advance(self.clock())
            request = self.model.submit(prompt_tokens, max_tokens)
        deadline = self.clock() + timeout_s
        while self.clock() < deadline:
            time.sleep(0.05)  # answer resolution only: latencies come from model time
            with self.lock:
                self.model.advance(self.clock())
                if request.finished_at is not None:
                    return {
                        "ttft_s": request.first_token_at - request.arrival,
                        "e2e_s": request.finished_at - request.arrival,
                        "prompt_tokens": request.prompt,
                        "completion_tokens": request.generated,
                    }
        return None

    def hang(self, hung: bool = True) -> None:
        """Freeze the engine (counters stop, queue grows) while /metrics and /health keep answering."""
        with self.lock:
            self.model.advance(self.clock())
            self.model.hung = hung

    def _handler(self):
        sim = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes; with Nagle on, keep-alive clients wait for a delayed ACK
            disable_nagle_algorithm = True

            def do_GET(self):  # noqa: N802 (http.server's naming)
                if self.path.startswith("/metrics"):
                    if sim.failing:
                        return self._send(500, b"internal error\n", "text/plain")
                    body = sim.metrics_text().encode()
                    return self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                if self.path.startswith("/health"):
                    return self._send(200 if sim.healthy else 503, b"", "text/plain")
                return self._send(404, b"not found\n", "text/plain")

            def do_POST(self):  # noqa: N802
                if not self.path.startswith("/v1/completions"):
                    return self._send(404, b"not found\n", "text/plain")
                try:
                    length = int(self.headers.get("Content-Length", 0))
                    body = json.loads(self.rfile.read(length) or b"{}")
                    prompt, output = int(body["prompt_tokens"]), int(body.get("max_tokens", 16))
                    if prompt <= 0 or output <= 0:
                        raise ValueError("prompt_tokens and max_tokens must be positive")
                except (ValueError, KeyError, TypeError) as exc:
                    return self._send(400, f"bad request: {exc}\n".encode(), "text/plain")
                answer = sim.complete(prompt, output)
                if answer is None:
                    return self._send(504, b"request did not finish in time\n", "text/plain")
                return self._send(200, json.dumps(answer).encode(), "application/json")

            def _send(self, code: int, body: bytes, content_type: str) -> None:
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep test output clean
                pass

        return Handler

    def start(self) -> SimulatedIU:
        self.thread = threading.Thread(
            target=self.server.serve_forever,
            kwargs={"poll_interval": 0.1},
            name=f"sim-iu-{self.address}",
            daemon=True,
        )
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> SimulatedIU:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
