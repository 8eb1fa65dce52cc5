"""Review H1, M4, L11 (the security review's findings, tests/faults/README.md): hostile vLLM metrics and endpoints cost one IU
its score, never the agent, the node's other IUs, the publisher or the heartbeats."""

from __future__ import annotations

import http.server
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from eas_agent.agent import Agent, IUPipeline
from eas_agent.clock import parse_system_time_offset
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import parse_config
from eas_agent.vllm_metrics import MetricsParseError, parse_vllm_metrics
from eas_wire.fetch import FetchError, HttpFetcher
from sim.memstore import MemoryStore

GOOD = (Path(__file__).parents[1] / "fixtures" / "vllm" / "v1_single_engine.txt").read_text()


def strict_json(text: str):
    """json.loads that fails on NaN/Infinity (what a Go or JS reader of the KV body would do)."""

    def refuse(name):
        raise ValueError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def replace_sample(text: str, name: str, value: str) -> str:
    out = []
    for line in text.splitlines(keepends=True):
        if line.startswith(name + "{"):
            line = line.rsplit(" ", 1)[0] + f" {value}\n"
        out.append(line)
    assert out != text.splitlines(keepends=True), name
    return "".join(out)


class NoGpus:
    def read(self, indices):
        return []

    def close(self):
        pass


def config(n_ius: int = 2, scrape_timeout_s: float = 0.15):
    return parse_config(
        {
            "node": "n1",
            "rack": "r1",
            "listen": "127.0.0.1:0",
            "scrape_timeout_s": scrape_timeout_s,
            "ius": [
                {"id": f"n1-iu{i}", "gpus": [i], "metrics_url": f"http://127.0.0.1:1/m{i}"}
                for i in range(n_ius)
            ],
        }
    )


def agent_with(fetchers, cfg=None, serve_http=True):
    cfg = cfg or config(len(fetchers))
    pipelines = [IUPipeline(cfg, i, VllmCollector(fetch)) for i, fetch in enumerate(fetchers)]
    store = MemoryStore()
    agent = Agent(cfg, store=store, gpu_backend=NoGpus(), pipelines=pipelines, serve_http=serve_http)
    return agent, store


@pytest.mark.parametrize(
    "sample, value",
    [
        ("vllm:num_requests_running", "NaN"),
        ("vllm:num_requests_running", "+Inf"),
        ("vllm:num_requests_waiting", "NaN"),
        ("vllm:num_requests_waiting", "-1e6"),
        ("vllm:kv_cache_usage_perc", "+Inf"),
        ("vllm:prompt_tokens_total", "NaN"),
        ("vllm:prompt_tokens_total", "-Inf"),
    ],
)
def test_bad_sample_makes_that_iu_unknown_and_the_rest_publish(sample, value):
    bad = replace_sample(GOOD, sample, value)
    agent, store = agent_with([lambda: GOOD, lambda: bad])
    try:
        for t in range(3):
            results = agent.cycle(1000.0 + t)  # before the fix: ValueError out of cycle (the agent stopped)
            agent.publisher.step(1000.0 + t, results)
        good, broken = results["n1-iu0"], results["n1-iu1"]
        assert good.status == "passing" and good.score is not None and good.score >= 0
        assert broken.score is None and broken.status == "warning"
        assert "non-finite or negative" in broken.reason and sample in broken.reason
        body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
        assert body["ius"]["n1-iu1"]["score"] is None and body["ius"]["n1-iu0"]["score"] == good.score
        served = strict_json(agent.http.scores_json.decode())  # what /scores serves
        assert served["ius"]["n1-iu1"]["status"] == "warning"
        errors = agent.metrics.collector_errors.labels("vllm", "n1-iu1")._value.get()
        assert errors == 3
    finally:
        agent.http.server.server_close()


def test_parser_rejects_non_finite_and_negative_samples_naming_them():
    for value in ("NaN", "+Inf", "-Inf", "-0.5"):
        with pytest.raises(MetricsParseError, match="vllm:num_requests_waiting"):
            parse_vllm_metrics(replace_sample(GOOD, "vllm:num_requests_waiting", value))
    assert (
        parse_vllm_metrics(replace_sample(GOOD, "vllm:num_requests_waiting", "0")).num_requests_waiting == 0
    )


def test_failing_iu_logs_at_most_once_a_minute(caplog):
    bad = replace_sample(GOOD, "vllm:num_requests_running", "NaN")
    agent, _ = agent_with([lambda: GOOD, lambda: bad], serve_http=False)
    with caplog.at_level(logging.WARNING, logger="eas_agent"):
        for t in range(50):
            agent.cycle(1000.0 + t * 0.2)
    lines = [r for r in caplog.records if "n1-iu1" in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in lines]


def test_a_bug_in_one_iu_never_stops_the_cycle():
    def explode():
        raise KeyError("collector bug")

    agent, _ = agent_with([lambda: GOOD, explode], serve_http=False)
    results = agent.cycle(1000.0)
    assert results["n1-iu0"].status == "passing"
    assert results["n1-iu1"].score is None and "KeyError" in results["n1-iu1"].reason


def test_publisher_never_writes_non_finite_json():
    from eas_agent.score import ScoreResult

    agent, store = agent_with([lambda: GOOD], serve_http=False)
    results = {"n1-iu0": ScoreResult(float("nan"), "passing", "", {"x": float("inf"), "y": 1.0})}
    agent.publisher.step(1000.0, results)  # before: json.dumps wrote NaN and Infinity into the KV
    body = strict_json(store.kv["clusterctl/eas/dc1/n1"][1])
    assert body["ius"]["n1-iu0"]["score"] is None and body["ius"]["n1-iu0"]["components"] == {
        "x": None,
        "y": 1.0,
    }


def test_strict_json_refuses_non_finite_numbers():
    """The backstop under the publisher's sanitising: scorebody.dumps (the KV body and /scores) raises
    instead of writing NaN/Infinity, which is invalid JSON for every non-Python reader (review H1)."""
    from eas_wire import scorebody

    for bad in (float("nan"), float("inf"), float("-inf")):
        with pytest.raises(ValueError):
            scorebody.dumps({"score": bad})
    assert scorebody.dumps({"score": 0.5}) == '{"score":0.5}'


class DripServer:
    """Answers every connection with a 200 header and then one body byte every ``every_s``."""

    def __init__(self, every_s=0.1, body_bytes=100_000, header_drip=False):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.every_s, self.body_bytes, self.header_drip = every_s, body_bytes, header_drip
        self.stopping = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        self.sock.settimeout(0.2)
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn):
        try:
            conn.recv(65536)
            head = f"HTTP/1.1 200 OK\r\nContent-Length: {self.body_bytes}\r\n\r\n".encode()
            if self.header_drip:
                for i in range(len(head)):
                    conn.sendall(head[i : i + 1])
                    if self.stopping.wait(self.every_s):
                        return
            else:
                conn.sendall(head)
            for _ in range(self.body_bytes):
                conn.sendall(b"#")
                if self.stopping.wait(self.every_s):
                    return
        except OSError:
            pass
        finally:
            conn.close()

    def close(self):
        self.stopping.set()
        self.sock.close()


def test_scrape_timeout_is_a_deadline_not_a_per_read_timeout():
    server = DripServer()
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=0.15)
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.15 s"):
            fetch()  # before the fix: ~4 s for 40 bytes, hours for a 100 KB drip
        assert time.monotonic() - started < 0.5
    finally:
        server.close()


@contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[int]:
    """An HTTP server on a loopback port with ``handler``, for as long as the block runs: yields the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def test_scrapes_reuse_one_kept_alive_connection_with_one_request_each():
    """Before the fix every scrape after the first failed on the kept-alive connection (ResponseNotReady),
    then asked again on a new one: two requests and a connection per scrape, /metrics rendered twice."""
    seen = {"connections": 0, "requests": 0}

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self):
            seen["connections"] += 1
            super().setup()

        def do_GET(self):  # noqa: N802 (http.server's naming)
            seen["requests"] += 1
            body = GOOD.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        fetch = HttpFetcher(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
        for _ in range(5):
            assert parse_vllm_metrics(fetch()).num_requests_running == 237.0
        assert seen == {"connections": 1, "requests": 5}


@pytest.mark.parametrize("length", ["\u00b2", None, "exact"])
def test_an_answer_that_closes_the_connection_is_read_whole(length):
    """An answer with "Connection: close" (an HTTP/1.0 exporter or a proxy in front of vLLM): http.client
    closes the connection's socket before the body is read, and the deadline reader read from that closed
    descriptor (EBADF: every scrape failed). A Content-Length of '²' passes str.isdigit() and int() refuses
    it: read as absent, as http.client reads it."""
    body = GOOD.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.send_response(200)
            if length is not None:
                self.send_header("Content-Length", str(len(body)) if length == "exact" else length)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    with serving(Handler) as port:
        fetch = HttpFetcher(f"http://127.0.0.1:{port}/metrics", timeout_s=1.0)
        assert parse_vllm_metrics(fetch()).num_requests_running == 237.0


def test_scrape_body_is_capped():
    server = DripServer(every_s=0.0, body_bytes=10)
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=1.0, max_body=4)
        with pytest.raises(FetchError, match="byte cap"):
            fetch()
    finally:
        server.close()


@pytest.mark.parametrize("slow_index", [1, 0])
def test_one_dripping_endpoint_does_not_stall_the_node(slow_index):
    """Headers dripped too: on a worker thread only the agent's abort at the deadline can stop that read; the
    first IU is scraped on the cycle's own thread, where its fetcher's deadline stops it."""
    server = DripServer(header_drip=True)
    try:
        cfg = config(3)
        slow = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=cfg.scrape_timeout_s)
        fetchers = [lambda: GOOD, lambda: GOOD, lambda: GOOD]
        fetchers[slow_index] = slow
        agent, store = agent_with(fetchers, cfg=cfg, serve_http=False)
        started = time.monotonic()
        for t in range(5):
            results = agent.cycle(1000.0 + t * 0.2)
            agent.publisher.step(1000.0 + t * 0.2, results)
        elapsed = time.monotonic() - started
        assert elapsed < 5 * (cfg.scrape_timeout_s + 0.2), elapsed  # before: one cycle took seconds
        fine = [f"n1-iu{i}" for i in range(3) if i != slow_index]
        assert results[fine[0]].status == results[fine[1]].status == "passing"
        assert results[f"n1-iu{slow_index}"].score is None and results[f"n1-iu{slow_index}"].status == "warning"
        assert store.checks[fine[0]][0] == "passing"  # TTL checks kept being refreshed
    finally:
        server.close()


def test_one_iu_dripping_its_headers_is_cut_at_the_deadline():
    """A node with one IU scrapes it on the cycle's own thread (no executor, no abort): the fetcher itself
    must hold the deadline while reading the headers. Before: one cycle took the whole drip (4.2 s)."""
    server = DripServer(header_drip=True)
    try:
        cfg = config(1)
        slow = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=cfg.scrape_timeout_s)
        agent, store = agent_with([slow], cfg=cfg, serve_http=False)
        for t in range(3):
            started = time.monotonic()
            results = agent.cycle(1000.0 + t * 0.2)
            assert time.monotonic() - started < cfg.scrape_timeout_s + 0.2
            agent.publisher.step(1000.0 + t * 0.2, results)
        assert results["n1-iu0"].score is None and results["n1-iu0"].status == "warning"
        assert f"within {cfg.scrape_timeout_s:g} s" in results["n1-iu0"].reason
        assert store.checks["n1-iu0"][0] == "warning"  # the heartbeat went on
    finally:
        server.close()


def test_dripped_headers_are_cut_at_the_deadline_without_an_abort():
    server = DripServer(header_drip=True)
    try:
        fetch = HttpFetcher(f"http://127.0.0.1:{server.port}/metrics", timeout_s=0.15)
        started = time.monotonic()
        with pytest.raises(FetchError, match="within 0.15 s"):
            fetch()
        assert time.monotonic() - started < 0.4
    finally:
        server.close()


@pytest.mark.parametrize(
    "text", ["System time     : . seconds fast of NTP time", "System time : 1.2.3 seconds slow of NTP time"]
)
def test_clock_parse_never_raises(text):
    assert parse_system_time_offset(text) is None  # before: float('.') raised inside the cycle


def test_clock_parse_reads_offsets():
    assert parse_system_time_offset("System time     : 0.000012 seconds slow of NTP time") == -0.000012
