"""``clusterctl loadtest`` for real: through the edge to simulated vLLM IUs scored by their agents; errors by
kind against a misbehaving upstream; Ctrl-C prints the partial results and exits 130."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml
from aiohttp import web

from cli.main import main
from operate.loadgen import Generator, Planned
from tests.integration.operate.pool import live_pool

pytestmark = pytest.mark.integration

# one class met easily, one whose limit no engine meets: both judged (>= 50 requests each)
TWO_CLASSES = {"name": "two-classes", "classes": {
    "easy": {"share": 0.5, "prompt_tokens": {"mean": 300, "sigma": 0.3}, "output_tokens": 16,
             "slo": {"ttft_p99_ms": 3000, "e2e_p99_ms": 6000}},
    "impossible": {"share": 0.5, "prompt_tokens": 300, "output_tokens": 16, "slo": {"ttft_p99_ms": 1}}}}


def run_cli(args: list[str]) -> int:
    try:
        main(args)
    except SystemExit as exc:
        return exc.code
    return 0


def test_a_short_run_through_the_edge_judges_each_slo_and_writes_the_report(tmp_path, consul_addr, capsys):
    scenario = tmp_path / "two.yml"
    scenario.write_text(yaml.safe_dump(TWO_CLASSES))
    out = tmp_path / "report"
    with live_pool(tmp_path, consul_addr, nodes=2) as (edge, _):
        code = run_cli(["loadtest", "--endpoint", f"http://{edge.address}", "--rate", "14", "--duration", "9",
                        "--scenario", str(scenario), "--out", str(out), "--consul", consul_addr, "--min-samples", "40",
                        "--json"])
    result = json.loads(capsys.readouterr().out)
    assert code == 1, result  # an SLO missed
    verdicts = {(v["class"], v["metric"]): v["verdict"] for v in result["slo"]}
    assert verdicts == {("easy", "ttft"): "met", ("easy", "e2e"): "met", ("impossible", "ttft"): "not met"}, result
    easy = result["classes"]["easy"]
    assert easy["errors"] == {} and easy["ok"] == easy["requests"] >= 40
    assert 0 < easy["latency_s"]["ttft"]["p50"] <= easy["latency_s"]["ttft"]["p99"] < 3.0
    assert 0 < easy["latency_s"]["itl"]["p50"] < 0.2  # the simulated engine's ~17 ms decode step, 50 ms ticks
    # the generator shares this process (and its GIL) with the pool's engines, agents and edge, so a loaded host
    # delays its sends by a tenth of a second now and then; one that waited on its own sends would lag by
    # whole requests (seconds)
    assert result["generator_lag"]["p99_s"] < 0.5
    assert result["utilisation"]["mean_pct"] == 80.0  # the stand-in NVML's GPUs, as the agents published them
    assert set(result["utilisation"]["units"]) == {"n1-iu0", "n2-iu0"}
    written = {p.name for p in out.iterdir()}
    assert {"loadtest.json", "loadtest.md", "latency-over-time.png", "ttft-cdf.png", "utilisation.png"} <= written
    assert "not met" in (out / "loadtest.md").read_text()


class Misbehaving:
    """An upstream answering 503, cutting its stream, or never answering, by prompt length."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.address = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._answer)
        self.runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        host, port = site._server.sockets[0].getsockname()[:2]
        return f"http://{host}:{port}"

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        tokens = len((await request.json())["prompt"])
        if tokens == 1:
            return web.json_response({"object": "error", "message": "busy"}, status=503)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        event = {"choices": [{"index": 0, "text": "tok ", "finish_reason": None}]}
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if tokens == 2:
            request.transport.close()  # the engine died mid-stream
            return response
        if tokens == 3:
            await asyncio.sleep(3)  # hangs past the client's 1 s timeout
        await response.write(b"data: [DONE]\n\n")
        return response

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)


def test_errors_are_counted_by_kind():
    upstream = Misbehaving()
    try:
        planned = [Planned(i, 0.01 * i, "A", tokens, 4, 0) for i, tokens in enumerate((1, 2, 3, 4))]
        outcomes = asyncio.run(Generator(upstream.address, timeout_s=1.0).run(planned))
    finally:
        upstream.close()
    by_prompt = {o.prompt_tokens: o for o in outcomes}
    assert {n: o.error for n, o in by_prompt.items()} == {1: "http_503", 2: "cut_stream", 3: "timeout", 4: None}
    assert by_prompt[4].ttft_s is not None and by_prompt[4].tokens == 1
    closed = asyncio.run(Generator("http://127.0.0.1:1", timeout_s=1.0).run([Planned(0, 0.0, "A", 5, 4, 0)]))
    assert closed[0].error == "connect"


def test_ctrl_c_prints_the_partial_results_and_exits_130(tmp_path, consul_addr):
    scenario = tmp_path / "two.yml"
    scenario.write_text(yaml.safe_dump(TWO_CLASSES))  # 16-token answers: some finish within seconds
    with live_pool(tmp_path, consul_addr, nodes=2) as (edge, _):
        env = {**os.environ, "COLUMNS": "200"}
        process = subprocess.Popen([sys.executable, "-m", "cli.main", "loadtest", "--endpoint",
                                    f"http://{edge.address}", "--rate", "10", "--duration", "60", "--scenario",
                                    str(scenario)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        time.sleep(5.0)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=20)
    assert process.returncode == 130, (out, err)
    assert "interrupted: partial results" in out and "NOT MET" in out, out
    finished, planned = map(int, re.search(r"(\d+) of (\d+) requests finished", out).groups())
    assert 0 < finished < planned, out


def test_calibrate_through_an_endpoint_that_is_not_the_edge_is_exit_2(tmp_path, capsys):
    from sim.vllm.server import SimulatedIU

    scenario = tmp_path / "two.yml"
    scenario.write_text(yaml.safe_dump(TWO_CLASSES))
    with SimulatedIU("127.0.0.1", 0, arrival_rate=0) as iu:
        code = run_cli(["edge", "calibrate", "--endpoint", f"http://{iu.address}", "--rate", "20", "--requests", "10",
                        "--scenario", str(scenario)])
    assert code == 2
    assert "no answer named its unit (no X-Eas-IU header)" in capsys.readouterr().err
