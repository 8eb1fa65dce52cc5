"""The generator's plan: Poisson arrivals at the rate (seeded), the mix's shares, exact token-id prompts; the
client key sent with every request to an edge that wants one."""

from __future__ import annotations

import asyncio
import http.server
import json
import statistics
import threading

import pytest

from operate.loadgen import TOKEN_POOL, Generator, Planned, TokenPool, plan, request_body
from operate.scenario import load_scenario

pytestmark = pytest.mark.unit


def test_arrivals_are_poisson_at_the_rate():
    planned = plan(load_scenario(), rate=20.0, duration_s=500.0, seed=7)
    n = len(planned)
    assert abs(n - 10000) < 4 * 100  # Poisson count: mean 10,000, sd 100
    gaps = [b.at - a.at for a, b in zip(planned, planned[1:], strict=False)]
    mean = statistics.fmean(gaps)
    assert abs(mean - 0.05) < 0.05 * 0.04
    assert abs(statistics.pstdev(gaps) / mean - 1.0) < 0.04  # exponential gaps: coefficient of variation 1
    # memoryless: the share of gaps above the mean is e^-1
    assert abs(sum(g > mean for g in gaps) / len(gaps) - 0.3679) < 0.02
    # counts per 1 s window: variance equals mean (index of dispersion 1), unlike a paced or bursty source
    counts = [0] * 500
    for p in planned:
        counts[int(p.at)] += 1
    assert abs(statistics.pvariance(counts) / statistics.fmean(counts) - 1.0) < 0.2
    assert all(0 < p.at < 500 for p in planned) and planned == sorted(planned, key=lambda p: p.at)


def test_the_plan_is_reproducible_and_follows_the_mix():
    a = plan(load_scenario(), 10.0, 300.0, seed=3)
    assert a == plan(load_scenario(), 10.0, 300.0, seed=3)
    assert a != plan(load_scenario(), 10.0, 300.0, seed=4)
    shares = {k: sum(1 for p in a if p.klass == k) / len(a) for k in "ABC"}
    assert abs(shares["A"] - 0.65) < 0.04 and abs(shares["B"] - 0.30) < 0.04 and abs(shares["C"] - 0.05) < 0.02
    assert plan(load_scenario(), 0.0, 10.0, seed=1) == [] and plan(load_scenario(), 5.0, 0.0, seed=1) == []


@pytest.mark.parametrize("tokens", [1, 327, 12842, TOKEN_POOL + 5])
def test_a_prompt_is_exactly_its_planned_token_ids(tokens):
    pool = TokenPool(seed=2)
    request = Planned(0, 0.0, "A", tokens, 16, offset=TOKEN_POOL - 3)  # wraps around the pool's end
    body = json.loads(request_body(pool, request, "m"))
    assert len(body["prompt"]) == tokens and all(isinstance(t, int) and 1000 <= t < 30000 for t in body["prompt"])
    assert body["max_tokens"] == 16 and body["stream"] is True and body["ignore_eos"] is True and body["model"] == "m"
    other = json.loads(request_body(pool, Planned(1, 0.0, "A", tokens, 16, offset=11), None))
    assert "model" not in other and other["prompt"][:8] != body["prompt"][:8]


class KeyedEdge(http.server.BaseHTTPRequestHandler):
    """An edge with one client key: 401 without it, as eas-edge's client_keys (edge/auth.py) answers."""

    KEY = "demo-key"
    seen: list[str | None] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._answer(json.dumps({"data": [{"id": "m"}]}).encode(), "application/json")

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(b'data: {"choices": [{"text": "a"}]}\n\ndata: [DONE]\n\n', "text/event-stream")

    def _answer(self, body: bytes, content_type: str) -> None:
        self.seen.append(self.headers.get("Authorization"))
        ok = self.headers.get("Authorization") == f"Bearer {self.KEY}"
        self.send_response(200 if ok else 401)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_client_key_goes_with_the_probe_and_every_request_and_none_without_it():
    from operate.calibrate import drive

    server = http.server.ThreadingHTTPServer(("127.0.145.1", 0), KeyedEdge)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.145.1:{server.server_address[1]}"
    try:
        mix = load_scenario()
        outcomes = asyncio.run(drive(endpoint, mix, 50.0, 3, api_key=KeyedEdge.KEY))
        assert [o.error for o in outcomes] == [None] * 3
        assert KeyedEdge.seen == [f"Bearer {KeyedEdge.KEY}"] * 4  # /v1/models, then each request
        keyless = asyncio.run(Generator(endpoint, "m").run(plan(mix, 50.0, 1.0, seed=1)[:2]))
        assert [o.error for o in keyless] == ["http_401"] * 2 and KeyedEdge.seen[4:] == [None] * 2
    finally:
        server.shutdown()
        server.server_close()
