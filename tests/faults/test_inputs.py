"""Hostile inputs, in bulk (fixed seeds): malformed vLLM metrics, score bodies, pastes and HTTP requests.
Each kind counts what it tried; nothing may raise out of the component or leave it unable to serve."""

from __future__ import annotations

import copy
import json
import math
import random
import socket
from pathlib import Path

import pytest
import requests

from devconsul.server import DevConsulServer
from eas_agent.agent import Agent, IUPipeline
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import parse_config
from edge.feed import EdgeView
from edge.pool import AnomalyDetector, PoolView
from preflight.parsers import PARSERS, ParseError, parse, to_contract_json
from sim.memstore import MemoryStore
from tests.preflight.parsers.test_fuzz import fixtures, mutate

ROOT = Path(__file__).parents[1]
VLLM = sorted((ROOT / "fixtures" / "vllm").glob("*.txt"))
GOOD = (ROOT / "fixtures" / "vllm" / "v1_single_engine.txt").read_text()
VALUES = ["NaN", "+Inf", "-Inf", "-1", "-1e308", "1e308", "1e400", "0", "nan", "x", "", "1_0", "0x10", "--1"]


def strict(text: str):
    return json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))


def hostile_scrape(rng: random.Random) -> str:
    text = rng.choice(VLLM).read_text()
    lines = text.split("\n")
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(lines))
        line = lines[i]
        if line.startswith("vllm:") and rng.random() < 0.7:
            lines[i] = line.rsplit(" ", 1)[0] + " " + rng.choice(VALUES)
        elif rng.random() < 0.5:
            lines[i] = line[: rng.randrange(len(line) + 1)]
        else:
            lines.insert(i, "".join(chr(rng.randrange(1, 0x250)) for _ in range(rng.randrange(0, 50))))
    return "\n".join(lines)


def test_malformed_metrics_never_stop_the_agent(tally):
    rng = random.Random(1501)
    cfg = parse_config({"node": "n1", "rack": "r1", "ius": [
        {"id": "n1-iu0", "gpus": [0], "metrics_url": "http://127.0.0.1:1/a"},
        {"id": "n1-iu1", "gpus": [1], "metrics_url": "http://127.0.0.1:1/b"},
    ]})
    box = {"text": GOOD}

    class NoGpus:
        def read(self, indices):
            return []

        def close(self):
            pass

    pipelines = [IUPipeline(cfg, 0, VllmCollector(lambda: GOOD)), IUPipeline(cfg, 1, VllmCollector(lambda: box["text"]))]
    store = MemoryStore()
    agent = Agent(cfg, store=store, gpu_backend=NoGpus(), pipelines=pipelines, serve_http=False)
    n = 1500
    for t in range(n):
        box["text"] = hostile_scrape(rng)
        now = 1000.0 + t * 0.2
        results = agent.cycle(now)
        agent.publisher.step(now, results)
        for r in results.values():
            assert r.score is None or (math.isfinite(r.score) and r.score >= 0), (box["text"], r)
        # the healthy IU keeps its score (its constant counters make it "frozen" after 10 s: warning, scored)
        assert results["n1-iu0"].score is not None, results["n1-iu0"]
    body = strict(store.kv["clusterctl/eas/dc1/n1"][1])
    assert set(body["ius"]) == {"n1-iu0", "n1-iu1"}
    tally.inputs("vLLM scrapes (NaN/Inf/negative/garbage)", n)


def hostile_body(rng: random.Random):
    base = {"node": "n2", "rack": "r1", "ts": 100.0, "heartbeat_s": 2.0, "seq": 3, "clock_offset_s": None,
            "ius": {"n2-iu0": {"score": 1.0, "status": "passing", "reason": "", "components": {"request_cost_s": 0.1}}}}
    # 10**400 and -10**400: ints JSON reads but no float holds (math.isfinite raises OverflowError on them)
    junk_values = [None, "x", -1, 1e308, float("nan"), [], {}, True, 10**30, 10**400, -(10**400), "0.1", {"a": 1},
                   {"vllm": {"ok": True, "duration_s": 10**400, "error": None}}]

    class Junk:  # a fresh value each time (one shared {} could end up inside itself)
        @staticmethod
        def pick():
            return copy.deepcopy(rng.choice(junk_values))

    body = json.loads(json.dumps(base))
    for _ in range(rng.randint(1, 3)):
        where = rng.choice(["top", "iu", "comp", "whole", "raw", "deep"])
        if not isinstance(body, dict):
            break
        if where == "top":
            body[rng.choice(list(base) + ["extra"])] = Junk.pick()
        elif where == "iu" and isinstance(body.get("ius"), dict) and body["ius"]:
            entry = body["ius"].setdefault("n2-iu0", {})
            if isinstance(entry, dict):
                entry[rng.choice(["score", "status", "reason", "components", "level", "collectors"])] = Junk.pick()
            else:
                body["ius"]["n2-iu0"] = Junk.pick()
        elif where == "comp":
            body["ius"] = {"n2-iu0": {"score": 0.5, "status": "passing", "components": Junk.pick()}}
        elif where == "whole":
            body = Junk.pick()
        elif where == "deep":  # nested past the decoder's recursion limit (RecursionError), here or in a value
            depth = rng.choice([100_000, 5_000])
            nested = "[" * depth + "]" * depth
            text = json.dumps(body, allow_nan=True)
            return (nested if rng.random() < 0.5 else text.replace('"ius"', f'"x": {nested}, "ius"', 1)).encode()
        else:
            return "".join(chr(rng.randrange(1, 0x7F)) for _ in range(rng.randrange(0, 80))).encode()
    text = json.dumps(body, allow_nan=True)
    return text.encode() if rng.random() < 0.9 else text.encode()[: rng.randrange(len(text) + 1)]


@pytest.mark.parametrize("reader", [PoolView, EdgeView])
def test_malformed_score_bodies_never_break_the_reader(tally, reader):
    rng = random.Random(1502)
    view = reader(detector=AnomalyDetector(), clock=lambda: 100.0)
    health = [{"Service": {"ID": iu, "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": iu.split("-")[0]}},
               "Checks": [{"CheckID": f"eas:{iu}", "Status": "passing"}]} for iu in ("n1-iu0", "n2-iu0")]
    view.apply_health(health)
    good = {"Key": "clusterctl/eas/dc1/n1", "Value": json.dumps(
        {"node": "n1", "rack": "r1", "ts": 100.0, "heartbeat_s": 2.0, "seq": 1,
         "ius": {"n1-iu0": {"score": 1.0, "status": "passing", "components": {}}}}).encode()}
    n = 3000
    for _ in range(n):
        hostile = hostile_body(rng)
        view.apply_kv([good, {"Key": "clusterctl/eas/dc1/n2", "Value": hostile}])
        scored = {e.iu_id for e in view.snapshot().scored}
        assert "n1-iu0" in scored
        for e in view.snapshot().entries:
            assert e.score is None or (math.isfinite(e.score) and e.score >= 0)
            assert e.stale_after <= 100.0 + 2.0 + 3 * 60.0
    tally.inputs(f"score bodies under the KV prefix ({reader.__name__})", n)


def test_malformed_pastes_only_ever_give_a_parse_error(tally):
    total = 0
    kinds = [kind for kind in sorted(PARSERS) if fixtures(kind)]
    assert kinds == sorted(PARSERS)  # every parser has fixtures to mutate
    for kind in kinds:
        for n, path in enumerate(fixtures(kind)):
            rng = random.Random(2500 + n)
            original = path.read_text(errors="replace")
            for _ in range(25):
                _, text = mutate(rng, original)
                total += 1
                try:
                    json.dumps(to_contract_json(kind, parse(kind, text)), allow_nan=False)
                except ParseError:
                    pass
    tally.inputs(f"pasted tool outputs ({len(kinds)} parsers)", total)


def raw_request(rng: random.Random) -> bytes:
    method = rng.choice([b"GET", b"PUT", b"POST", b"DELETE", b"HEAD", b"PATCH", b"BREW", b""])
    path = rng.choice([b"/v1/kv/a", b"/v1/kv/a?recurse&index=5&wait=1ms", b"/v1/txn", b"/v1/agent/service/register",
                       b"/v1/health/service/x?filter=" + rng.choice([b"Service.Port%20==%201", b"((((", b"%ff%fe"]),
                       b"/v1/catalog/services?index=-1", b"/" + bytes(rng.randrange(33, 127) for _ in range(20)),
                       b"/scores", b"/metrics", b"*"])
    headers = []
    for _ in range(rng.randint(0, 4)):
        headers.append(rng.choice([
            b"Content-Length: " + rng.choice([b"-1", b"99999999999", b"abc", b"3", b"0", b""]),
            b"Transfer-Encoding: chunked", b"X-Consul-Token: " + bytes(rng.randrange(33, 127) for _ in range(8)),
            b"Host: x", b"Expect: 100-continue", b"Connection: close",
        ]))
    body = rng.choice([b"", b"{}", b"null", b"[" * 5000, b"-5\r\nxx\r\n0\r\n\r\n", b"\xff\xfe", b"3\r\nabc\r\n0\r\n\r\n"])
    return method + b" " + path + b" HTTP/1.1\r\n" + b"\r\n".join(headers) + b"\r\n\r\n" + body


def fire(address: str, data: bytes) -> None:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2) as sock:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
            while sock.recv(65536):
                pass
    except OSError:
        pass  # the server may close on us: that is an answer


def test_malformed_requests_never_break_the_servers(tally):
    from eas_agent.http import AgentHttpServer, AgentMetrics

    rng = random.Random(1503)
    n = 400
    agent_http = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    agent_http.start()
    try:
        with DevConsulServer(addr="127.0.0.1:0", connection_timeout_s=1.0) as dev:
            for _ in range(n):
                data = raw_request(rng)
                fire(dev.address, data)
                fire(agent_http.address, data)
            assert requests.put(f"http://{dev.address}/v1/kv/after", data=b"ok", timeout=5).json() is True
            assert requests.get(f"http://{dev.address}/v1/kv/after?raw", timeout=5).content == b"ok"
            assert requests.get(f"http://{agent_http.address}/scores", timeout=5).status_code == 200
    finally:
        agent_http.stop()
    tally.inputs("raw HTTP requests (devconsul + agent)", 2 * n)
