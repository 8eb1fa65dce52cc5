"""One simulated IU: an HTTP server on the IU's address:port serving vLLM-like ``/metrics`` and ``/health``,
and the OpenAI-compatible completions API (``openai_api``: streaming SSE or not) through the load model.

``api_key``: like ``vllm serve --api-key`` (or ``VLLM_API_KEY``), every ``/v1/*`` request must carry
``Authorization: Bearer <key>``, else 401 ``{"error": "Unauthorized"}`` as vLLM answers; ``/metrics`` and
``/health`` stay open, as in vLLM (its key covers only the API's path prefixes).

The load model is advanced lazily to the current time on each request, so an idle server costs nothing and
no background thread is needed besides the HTTP one. Controls (``set_arrival_rate``, ``hang``, ``fail``)
let tests and the demo drive different loads and faults; two more make a bad canary for traffic rollouts:

- ``slowdown`` (>= 1): the engine runs that many times slower (its model time runs at 1/slowdown of real
  time: prefill, decode and its own background load alike), as a slower build or driver would;
- ``error_fraction`` (0..1): that share of completion requests is answered ``500`` in vLLM's error shape
  (``{"object": "error", ..., "type": "InternalServerError", "code": 500}``, as vLLM's OpenAI server answers
  an engine exception: ``vllm/entrypoints/openai/protocol.py`` ``ErrorResponse``), before the engine sees it.
"""

from __future__ import annotations

import hmac
import itertools
import random
import threading
import time

from eas_agent.serving import QuietHandler, QuietHTTPServer
from sim.vllm import openai_api
from sim.vllm.exposition import VllmExposition
from sim.vllm.loadmodel import LoadModel, ModelParams

TICK_S = 0.05  # answer resolution: latencies come from model time, the server looks at it this often


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
        api_key: str | None = None,
        slowdown: float = 1.0,
        error_fraction: float = 0.0,
    ):
        """``warmup_s``: the model starts that long in the past, so the first scrape shows a steady state."""
        if not slowdown >= 1.0 or not 0.0 <= error_fraction <= 1.0:
            raise ValueError(f"slowdown {slowdown!r} (>= 1) or error_fraction {error_fraction!r} (0..1) out of range")
        if slowdown != 1.0:
            origin = clock()
            clock = (lambda real: lambda: origin + (real() - origin) / slowdown)(clock)
        self.clock = clock
        self.errors = random.Random(seed ^ 0x5EED)
        self.error_fraction = error_fraction
        self.api_key = api_key
        self.model = LoadModel(params, arrival_rate=arrival_rate, seed=seed, start=clock() - warmup_s)
        self.exposition = VllmExposition(self.model, schema)
        self.lock = threading.Lock()
        self.healthy = True  # /health answer
        self.failing = False  # /metrics answers 500
        self.scrapes = 0
        self.die_after_tokens: int | None = None  # fault: a stream's connection is cut after that many tokens
        self.ids = itertools.count(1)
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

    def complete(self, prompt_tokens: int, max_tokens: int, timeout_s: float = 120.0,
                 token_ids: list[int] | None = None) -> dict | None:
        """Serve one request through the load model, blocking until it finishes in model time.

        Returns its TTFT and end-to-end latency (seconds), or None when it did not finish within timeout_s
        (a hung engine). Like a non-streaming completion call, the answer arrives once the request is done.
        """
        events = list(self.generate(prompt_tokens, max_tokens, timeout_s, token_ids))
        return events[-1] if events and "ttft_s" in events[-1] else None

    def generate(self, prompt_tokens: int, max_tokens: int, timeout_s: float = 120.0,
                 token_ids: list[int] | None = None):
        """Yield ``{"new_tokens": n}`` as the load model generates them (every TICK_S), then the summary dict
        of :meth:`complete` once finished; stops without a summary after ``timeout_s``. A preempted request
        regenerates tokens it had (recompute): only tokens beyond those already yielded count as new.
        ``token_ids``: the prompt's, hashed for the prefix cache (None: content unknown)."""
        with self.lock:
            self.model.advance(self.clock())
            request = self.model.submit(prompt_tokens, max_tokens, token_ids)
        deadline, sent = self.clock() + timeout_s, 0
        while self.clock() < deadline:
            time.sleep(TICK_S)
            with self.lock:
                self.model.advance(self.clock())
                generated, finished = request.generated, request.finished_at is not None
            if generated > sent:
                yield {"new_tokens": generated - sent}
                sent = generated
            if finished:
                yield {
                    "ttft_s": request.first_token_at - request.arrival,
                    "e2e_s": request.finished_at - request.arrival,
                    "prompt_tokens": request.prompt,
                    "completion_tokens": request.generated,
                }
                return

    def hang(self, hung: bool = True) -> None:
        """Freeze the engine (counters stop, queue grows) while /metrics and /health keep answering."""
        with self.lock:
            self.model.advance(self.clock())
            self.model.hung = hung

    def _handler(self):
        sim = self

        class Handler(QuietHandler):
            protocol_version = "HTTP/1.1"
            # headers and body go out in two writes; with Nagle on, keep-alive clients wait for a delayed ACK
            disable_nagle_algorithm = True

            def _refused(self) -> bool:
                """vLLM's key check: /v1/* without ``Bearer <api_key>`` is answered 401 here."""
                if sim.api_key is None or not self.path.startswith("/v1"):
                    return False
                if hmac.compare_digest(self.headers.get("Authorization", "").encode(),
                                       f"Bearer {sim.api_key}".encode()):
                    return False
                self._send(401, b'{"error": "Unauthorized"}', "application/json")
                return True

            def do_GET(self):  # noqa: N802 (http.server's naming)
                if self._refused():
                    return None
                if self.path.startswith("/metrics"):
                    if sim.failing:
                        return self._send(500, b"internal error\n", "text/plain")
                    body = sim.metrics_text().encode()
                    return self._send(200, body, "text/plain; version=0.0.4; charset=utf-8")
                if self.path.startswith("/health"):
                    return self._send(200 if sim.healthy else 503, b"", "text/plain")
                if self.path.startswith("/version"):
                    return self._send(200, openai_api.version_body(), "application/json")
                if self.path.startswith("/v1/models"):
                    return self._send(200, openai_api.models_body(), "application/json")
                return self._send(404, b"not found\n", "text/plain")

            def do_POST(self):  # noqa: N802
                if self._refused():
                    self.close_connection = True  # the body was not read
                    return None
                chat = self.path.startswith("/v1/chat/completions")
                if not chat and not self.path.startswith("/v1/completions"):
                    return self._send(404, b"not found\n", "text/plain")
                try:
                    length = int(self.headers.get("Content-Length", 0))
                    body, prompt, output = openai_api.parse_request(self.rfile.read(length), chat)
                except openai_api.ApiError as exc:
                    return self._send(exc.code, exc.body(), "application/json")
                except ValueError as exc:  # Content-Length
                    return self._send(400, openai_api.error_body(400, str(exc), "BadRequestError"),
                                      "application/json")
                if sim.error_fraction and sim.errors.random() < sim.error_fraction:
                    return self._send(500, openai_api.error_body(500, "simulated engine error", "InternalServerError"),
                                      "application/json")
                rid = f"cmpl-sim-{next(sim.ids)}"
                token_ids = openai_api.prompt_token_ids(body, chat)
                if body.get("stream"):
                    return self._stream(rid, chat, prompt, output, openai_api.wants_usage(body), token_ids)
                answer = sim.complete(prompt, output, token_ids=token_ids)
                if answer is None:
                    return self._send(504, openai_api.error_body(504, "request did not finish in time",
                                                                 "InternalServerError"), "application/json")
                return self._send(200, openai_api.completion_body(rid, chat, prompt, answer), "application/json")

            def _stream(self, rid: str, chat: bool, prompt: int, output: int, usage: bool,
                        token_ids: list[int] | None) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                sent = 0
                for event in sim.generate(prompt, output, token_ids=token_ids):
                    if "new_tokens" not in event:
                        break
                    limit = sim.die_after_tokens
                    if limit is not None and sent + event["new_tokens"] > limit:
                        self.close_connection = True  # the fault: the engine dies mid-stream, no last chunk
                        self.wfile.flush()
                        self.connection.shutdown(2)
                        return
                    sent += event["new_tokens"]
                    done = sent >= output
                    self._chunk(openai_api.chunk_event(rid, chat, event["new_tokens"],
                                                       finish="length" if done else None))
                if usage:
                    self._chunk(openai_api.usage_event(rid, chat, prompt, sent))
                self._chunk(openai_api.DONE_EVENT)
                self._chunk(b"")

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

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
