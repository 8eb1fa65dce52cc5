"""The edge's score feed (agents' blocking queries), input checks, config, routing rules and packaging."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
import threading
import time
import tomllib
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.scorebody import BodyError, ScoreBody
from edge.config import ConfigError, load_edge_config
from edge.feed import EdgeView
from edge.main import main as edge_main
from edge.pool import AnomalyDetector
from edge.routing import Router
from edge.tokens import estimate_prompt_tokens
from tests.helpers.edge import Pool, body_of, metric, post, running_edge, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def test_agent_scores_blocking_query_answers_on_the_next_cycle():
    server = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    server.start()
    try:
        first = ScoreBody(node="n", ts=1.0, ius={}, seq=1)
        server.set_scores(first)
        url = f"http://{server.address}/scores"
        with urllib.request.urlopen(url, timeout=5) as answer:  # no index: at once, as before
            index = int(answer.headers["X-Eas-Index"])
            assert json.load(answer) == first.to_json()
        threading.Timer(0.3, server.set_scores, args=(ScoreBody(node="n", ts=2.0, ius={}, seq=2),)).start()
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}?index={index}&wait_s=5", timeout=10) as answer:
            waited = time.monotonic() - started
            assert json.load(answer)["seq"] == 2 and int(answer.headers["X-Eas-Index"]) == index + 1
        assert 0.25 < waited < 2.0  # woken by the cycle, not by the wait running out
        started = time.monotonic()
        with urllib.request.urlopen(f"{url}?index={index + 1}&wait_s=0.2", timeout=10) as answer:
            assert json.load(answer)["seq"] == 2  # no new cycle: the wait runs out, same body
        assert time.monotonic() - started >= 0.19
        with urllib.request.urlopen(f"{url}?index=999&wait_s=nan", timeout=5) as answer:
            assert json.load(answer)["seq"] == 2  # another index (agent restarted) or junk: at once
    finally:
        server.stop()


def healthy_view(clock, ius_of: dict) -> EdgeView:
    """An EdgeView to which Consul reported each IU (node -> its IU ids) registered and passing."""
    view = EdgeView(detector=AnomalyDetector(), clock=clock)
    view.apply_health([{"Node": {"Node": node}, "Service": {"Service": f"vllm-iu-{node}", "ID": iu, "Address": "127.0.0.1", "Port": 8000, "Meta": {"node": node}},
                        "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]}
                       for node, ius in ius_of.items() for iu in ius])
    return view


def test_nonsense_scores_are_ignored_and_counted():
    counts: Counter = Counter()
    body = body_of("n0", {"n0-iu0": -1.0, "n0-iu1": math.nan, "n0-iu2": "x", "n0-iu3": 0.2, "n0-iu4": None})
    clean, problems = ScoreBody.from_json(json.loads(json.dumps(body)), blank_bad_scores=True, counts=counts)
    assert {iu: v.score for iu, v in clean.ius.items()} == {"n0-iu0": None, "n0-iu1": None, "n0-iu2": None, "n0-iu3": 0.2, "n0-iu4": None}
    assert not problems and clean.ius["n0-iu0"].status == "warning" and "ignored score_negative" in clean.ius["n0-iu0"].reason
    assert counts == Counter(score_negative=1, score_not_finite=1, score_not_a_number=1)
    for bad, reason in (({"node": "n0", "ius": {}, "ts": "yesterday"}, "ts_invalid"),
                        (["not", "a", "body"], "body_malformed")):
        with pytest.raises(BodyError) as info:
            ScoreBody.from_json(bad, blank_bad_scores=True, counts=counts)
        assert info.value.reason == reason
    view = healthy_view(time.time, {"n0": ["n0-iu0", "n0-iu1", "n0-iu2", "n0-iu3", "n0-iu4"]})
    view.apply_kv([{"Key": "k/n0", "Value": json.dumps(body).encode()}, {"Key": "k/n1", "Value": b"{not json"}])
    assert {e.iu_id for e in view.snapshot().scored} == {"n0-iu3"}
    assert {e.iu_id for e in view.snapshot().healthy} == {"n0-iu0", "n0-iu1", "n0-iu2", "n0-iu3", "n0-iu4"}  # fail-open may use them
    assert view.ignored["body_unparseable"] == 1


def test_pushed_scores_reach_the_view_and_nonsense_from_an_agent_is_counted(consul_addr):
    pool = Pool(consul_addr, nodes=2)
    try:
        for node in pool.nodes:
            pool.publish_kv(node, {f"{node}-iu0": 0.5}, ts=time.time() - 1.0)
        with running_edge(pool) as edge:
            pool.push("n0", {"n0-iu0": 0.123})
            pool.push("n1", {"n1-iu0": -5.0})
            view = edge.state.view
            wait_for(lambda: {e.iu_id: e.score for e in view.snapshot().entries}.get("n0-iu0") == 0.123, 5,
                     "the pushed score in the view")
            wait_for(lambda: metric(edge, "eas_edge_scores_ignored_total", 'reason="score_negative"') >= 1, 5,
                     "the negative score counted")
            assert {e.iu_id for e in view.snapshot().scored} == {"n0-iu0"}
            assert metric(edge, "eas_edge_push_connected") == 2 and metric(edge, "eas_edge_push_streams") == 2
            # an agent that goes away: its node falls back to the (newer) Consul snapshot
            pool.agents["n0"].stop()
            wait_for(lambda: metric(edge, "eas_edge_push_streams") == 1, 5, "the stopped agent's stream counted gone")
            pool.publish_kv("n0", {"n0-iu0": 0.777})
            wait_for(lambda: {e.iu_id: e.score for e in view.snapshot().entries}.get("n0-iu0") == 0.777, 5,
                     "the KV score taking over")
            assert post(edge.url("/v1/completions"), {"prompt": "hi", "max_tokens": 1})[0] == 200
    finally:
        pool.stop()


def test_an_agent_before_its_first_cycle_is_waited_for_not_counted_as_a_bad_body(consul_addr):
    """An agent serves ``{}`` at index 0 until its first cycle; that is "no scores yet", not a malformed body
    (it was counted and logged as "ius is NoneType" on every edge at every agent start)."""
    pool = Pool(consul_addr, nodes=1)
    try:
        with running_edge(pool) as edge:
            wait_for(lambda: metric(edge, "eas_edge_push_connected") == 1, 5, "the agent connected")
            time.sleep(0.3)
            assert edge.state.view.rejected_bodies == 0, list(edge.state.view.problems)
            pool.push("n0", {"n0-iu0": 0.25})  # the first cycle answers the waiting query
            wait_for(lambda: {e.iu_id: e.score for e in edge.state.view.snapshot().entries}.get("n0-iu0") == 0.25,
                     5, "the first cycle's score in the view")
    finally:
        pool.stop()


def test_router_prices_its_ledger_in_prefill_seconds_and_tells_saturated_from_none():
    view = healthy_view(lambda: 100.0, {"n0": ["n0-iu0", "n0-iu1"]})
    view.apply_kv([{"Key": "k/n0", "Value": json.dumps(body_of("n0", {"n0-iu0": 0.0, "n0-iu1": 0.0}, ts=100.0,
                                                               prefill_tps=8000.0))}])
    router = Router(random.Random(1), max_inflight_per_iu=1)
    snapshot = view.snapshot()
    first = router.choose(snapshot, 100.0, prompt_tokens=1200)
    assert first.mode == "p2c" and first.cost_s == pytest.approx(1200 / 8000.0)
    router.sent(first.iu_id, 100.0, first.cost_s)
    assert router.ledger.sent_cost_since(first.iu_id, 99.0, default_cost_s=9.9) == pytest.approx(0.15)
    second = router.choose(snapshot, 100.0, prompt_tokens=10)
    assert second.iu_id != first.iu_id and second.mode == "single"  # first is at its cap of 1
    router.sent(second.iu_id, 100.0, second.cost_s)
    assert router.choose(snapshot, 100.0, prompt_tokens=10).mode == "saturated"
    router.done(first.iu_id)
    router.eject(first.iu_id, 100.0)
    assert router.choose(snapshot, 100.0, prompt_tokens=10).mode == "saturated"  # second still at its cap
    router.done(second.iu_id)
    router.eject(second.iu_id, 100.0)
    assert router.choose(snapshot, 100.0, prompt_tokens=10).mode == "none"
    # an ejection that ran out holds the IU out until its probe answers (edge/ejection.py)
    assert router.choose(snapshot, 106.0, prompt_tokens=10).iu_id is None
    for iu_id in router.outliers.due(106.0):
        router.outcome(iu_id, 106.0, "ok", 2)
    assert router.choose(snapshot, 106.0, prompt_tokens=10).iu_id is not None


def test_token_estimate():
    assert estimate_prompt_tokens({"prompt": "abcdefgh"}, chat=False) == 2
    assert estimate_prompt_tokens({"prompt": [1, 2, 3]}, chat=False) == 3
    assert estimate_prompt_tokens({"prompt": ["abcd", "abcde"]}, chat=False) == 3
    assert estimate_prompt_tokens({"messages": [{"role": "user", "content": "abcd"}]}, chat=True) == 5
    assert estimate_prompt_tokens({"messages": [{"content": [{"type": "text", "text": "abcdefgh"}]}]}, chat=True) == 6
    assert estimate_prompt_tokens({"prompt": {"odd": 1}}, chat=False) is None
    assert estimate_prompt_tokens({"messages": "hi"}, chat=True) is None


def test_config_file_flags_and_one_line_errors(tmp_path):
    path = tmp_path / "edge.yml"
    path.write_text("listen: 127.0.0.1:9000\npush:\n  agent_port: 9200\nmax_queue: 3\n")
    config = load_edge_config(path, {"max_queue": 7, "push.enabled": None})
    assert (config.listen, config.push.agent_port, config.max_queue, config.push.enabled) == (
        "127.0.0.1:9000", 9200, 7, True)
    for text, message in (
        ("push:\n  agent_port: 70000\n", "push.agent_port: expected a TCP port 1-65535, got 70000"),
        ("listen: nowhere\n", "listen: expected HOST:PORT, got 'nowhere'"),
        ("max_inflight_per_iu: 0\n", "max_inflight_per_iu: must be >= 1, got 0"),
        ("max_connections: 0\n", "max_connections: must be >= 1, got 0"),
        ("max_body_bytes: 10\n", "max_body_bytes: must be >= 1024, got 10"),
        ("colour: blue\n", "colour: unknown field"),
        ("consul: {address: 'x:1', token: 'secret'}\n", "consul.token: unknown field"),
        ("listen: [unclosed\n", "not valid YAML"),
    ):
        path.write_text(text)
        with pytest.raises(ConfigError) as info:
            load_edge_config(path)
        assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
        assert "\n" not in str(info.value)


def test_the_resource_bounds_are_config_fields_with_defaults(tmp_path):
    path = tmp_path / "edge.yml"
    path.write_text("stream_idle_timeout_s: 30\nmax_connections: 100\nheader_timeout_s: 2\nkeepalive_timeout_s: 20\n"
                    "max_body_bytes: 65536\n")
    config = load_edge_config(path)
    assert (config.stream_idle_timeout_s, config.max_connections, config.header_timeout_s,
            config.keepalive_timeout_s, config.max_body_bytes) == (30, 100, 2, 20, 65536)
    defaults = load_edge_config(None)
    assert (defaults.stream_idle_timeout_s, defaults.max_connections, defaults.header_timeout_s,
            defaults.keepalive_timeout_s, defaults.max_body_bytes) == (60, 4096, 10, 75, 8 << 20)


def test_consul_unreachable_at_start_is_one_clear_line(capsys):
    from tests.helpers.edge import free_port

    port = free_port()
    assert edge_main(["--consul", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"eas-edge: cannot reach Consul at 127.0.0.1:{port} (consul.address): ")
    assert "\n" not in err


def test_clusterctl_edge_serve_is_eas_edge(capsys):
    from tests.helpers import run_cli
    from tests.helpers.edge import free_port

    port = free_port()
    code, _out, err = run_cli(capsys, "edge", "serve", "--consul", f"127.0.0.1:{port}", "--listen", "127.0.0.1:0")
    assert code == 2 and err.startswith(f"eas-edge: cannot reach Consul at 127.0.0.1:{port}")
    code, out, _err = run_cli(capsys, "edge", "serve", "--help")
    assert code == 0 and "--agent-port" in out and "--no-push" in out


# The last aiohttp release that fixed a published advisory (CVE-2026-69244, in 3.14.3): the edge is an
# unauthenticated HTTP server, so its floor must not admit an older parser.
AIOHTTP_SECURITY_FLOOR = (3, 14, 3)


def test_the_edge_imports_nothing_outside_its_own_dependencies():
    """An edge-only host installs edge/requirements.txt: the edge must not import Ansible, click, rich..."""
    blocked = ["ansible", "ansible_runner", "fabric", "rich", "click", "jinja2", "psutil", "pynvml", "cli",
               "cluster", "preflight", "devconsul", "eas_agent"]
    code = ("import sys\n"
            "class Block:\n"
            f"    blocked = {blocked!r}\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in self.blocked:\n"
            "            raise ImportError(f'edge imported {name}')\n"
            "sys.meta_path.insert(0, Block())\n"
            "import edge.main, edge.proxy, edge.feed\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
    pins = {line.split(">")[0].split("=")[0].lower(): line.strip()
            for line in (ROOT / "edge" / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {spec.split(">")[0].split("=")[0].lower(): spec for spec in project}
    assert set(pins) == {"aiohttp", "py-consul", "prometheus-client", "pyyaml", "cryptography"}
    assert all(pins[name] == declared[name] for name in pins), (pins, declared)
    floor = tuple(int(n) for n in pins["aiohttp"].split(">=")[1].split(",")[0].split("."))
    assert floor >= AIOHTTP_SECURITY_FLOOR, f"{pins['aiohttp']} admits aiohttp releases with known advisories"
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["eas-edge"] == "edge.main:main"



def test_pick_prices_the_request_and_the_ledger_in_prefill_seconds():
    from edge.pool import EdgeLedger, pick

    view = healthy_view(lambda: 100.0, {"n0": ["n0-iu0"], "n1": ["n1-iu0"]})
    fast = body_of("n0", {"n0-iu0": 0.1}, ts=100.0, prefill_tps=20000.0)
    slow = body_of("n1", {"n1-iu0": 0.1}, ts=100.0, prefill_tps=5000.0)
    view.apply_kv([{"Key": f"k/{b['node']}", "Value": json.dumps(b)} for b in (fast, slow)])
    rng, ledger = random.Random(3), EdgeLedger()
    # same score: a 10k-token prompt costs 0.5 s on one and 2 s on the other
    assert {pick(view.snapshot(), ledger, 100.0, rng, prompt_tokens=10_000).iu_id for _ in range(20)} == {"n0-iu0"}
    # 1 s of prefill this edge sent to the fast IU since its score outweighs the difference for a small prompt
    ledger.on_sent("n0-iu0", 100.0, cost_s=1.0)
    assert {pick(view.snapshot(), ledger, 100.0, rng, prompt_tokens=100).iu_id for _ in range(20)} == {"n1-iu0"}
    # without a prompt size the old rule: requests since the score at the IU's request_cost_s (0.05 s)
    ledger2 = EdgeLedger()
    ledger2.on_sent("n0-iu0", 100.0)
    assert ledger2.sent_cost_since("n0-iu0", 99.0, default_cost_s=0.05) == pytest.approx(0.05)


def test_ledger_sums_match_the_entries_as_they_age_out():
    from edge.pool import EdgeLedger

    ledger, rng = EdgeLedger(), random.Random(7)
    sent = []
    for i in range(5000):  # past the 4096 bound too
        cost = None if rng.random() < 0.3 else rng.uniform(0.001, 1.0)
        ledger.on_sent("a", float(i), cost)
        sent.append((float(i), cost))
        if i % 97 == 0:
            since = rng.uniform(0, i)
            kept = [c for t, c in sent[-4096:] if t >= since]
            expected = sum(0.2 if c is None else c for c in kept)
            assert ledger.sent_cost_since("a", since, 0.2) == pytest.approx(expected, rel=1e-9, abs=1e-9)
            assert ledger.sent_since("a", since) == len(kept)
            sent = [(t, c) for t, c in sent if t >= since]
    assert ledger.sent_cost_since("a", 1e9, 0.2) == 0.0 and ledger.sent_cost_since("b", 0.0, 0.2) == 0.0


def test_every_address_field_is_read_by_one_hostport_helper():
    # the edge's listen, the agent's listen and the Consul block: one split, IPv6 brackets dropped for bind()
    # (not: three rsplit copies, and "[::1]:8080" bound the host "[::1]", which getaddrinfo rejects)
    from consul_io.config import ConsulConfig
    from eas_wire.fields import split_hostport

    config = load_edge_config(None, {"listen": "[::1]:8081", "consul.address": "[::1]:8500"})
    assert config.listen_hostport == ("::1", 8081)
    assert (config.consul.host, config.consul.port) == ("::1", 8500)
    assert split_hostport("127.0.0.1:0") == ("127.0.0.1", 0)
    assert (ConsulConfig().host, ConsulConfig().port) == split_hostport(ConsulConfig().address)


def test_an_overdue_stream_marks_its_iu_busier_than_its_score():
    # both IUs score 0: the one holding this edge's stream past its predicted first byte is avoided until
    # that byte arrives (not: the stale score alone, so a coin toss between a held IU and a free one)
    view = healthy_view(lambda: 100.0, {"n0": ["n0-iu0", "n0-iu1"]})
    view.apply_kv([{"Key": "k/n0", "Value": json.dumps(body_of("n0", {"n0-iu0": 0.0, "n0-iu1": 0.0}, ts=100.0,
                                                               prefill_tps=8000.0))}])
    router = Router(random.Random(1))
    first = router.choose(view.snapshot(), 100.0, prompt_tokens=800)
    assert first.expected_s == pytest.approx(0.1)  # score 0 + its own 800 / 8000 tokens/s
    held, other = first.iu_id, ({"n0-iu0", "n0-iu1"} - {first.iu_id}).pop()
    router.sent(held, 100.0, first.cost_s, handle="r1", expected_s=first.expected_s)
    assert router.ledger.overdue_s(held, 100.05) == 0.0 and router.ledger.overdue_s(held, 101.1) == pytest.approx(1.0)
    # 1.1 s later its first byte is 1 s overdue: every request prefers the other IU, though both score 0
    router.sent(other, 100.0, first.cost_s)  # same prefill sent to both since the score: only the overdue differs
    picks = {router.choose(view.snapshot(), 101.1, prompt_tokens=10).iu_id for _ in range(20)}
    assert picks == {other}
    router.first_byte(held, "r1")
    assert router.ledger.overdue_s(held, 101.1) == 0.0
    router.done(held, "r1")
    assert not router.ledger.awaiting[held]


def test_a_long_prompt_still_queued_is_counted_at_its_real_cost_by_scores_newer_than_its_send():
    # The IU's score counts a waiting request at its mean request (request_cost_s 0.2 s); this edge sent a
    # 12,000-token prompt (1.5 s at 8,000 tokens/s) predicted to wait 0.5 s before its prefill. A score
    # taken 0.1 s after the send counts it at 0.2 s: the ledger adds the 1.3 s the score misses until the
    # prompt is predicted admitted (then the score's admitted-prefill term has its real tokens). Dropped at the
    # first newer score, the IU would look 1.3 s emptier than it is.
    router = Router(random.Random(1))
    router.sent("n0-iu0", 100.0, 1.5, handle="r1", expected_s=2.0, queued_as_s=0.2)
    assert router.ledger.sent_cost_since("n0-iu0", 99.9, default_cost_s=0.2) == pytest.approx(1.5)  # older score
    assert router.ledger.sent_cost_since("n0-iu0", 100.1, default_cost_s=0.2) == pytest.approx(1.3)
    assert router.ledger.sent_cost_since("n0-iu0", 100.5, default_cost_s=0.2) == pytest.approx(1.3)
    assert router.ledger.sent_cost_since("n0-iu0", 100.6, default_cost_s=0.2) == 0.0  # admitted: the score has it
    router.sent("n0-iu1", 100.0, 0.05, expected_s=0.1, queued_as_s=0.2)  # shorter than the mean: nothing kept
    assert router.ledger.sent_cost_since("n0-iu1", 100.01, default_cost_s=0.2) == 0.0

    # through choose(): both IUs score 0.1 at ts 100.1; the one holding the queued long prompt is avoided
    view = healthy_view(lambda: 100.2, {"n0": ["n0-iu0", "n0-iu1"]})
    view.apply_kv([{"Key": "k/n0", "Value": json.dumps(body_of("n0", {"n0-iu0": 0.1, "n0-iu1": 0.1}, ts=100.1,
                                                               prefill_tps=8000.0))}])
    router = Router(random.Random(2))
    first = router.choose(view.snapshot(), 100.0, prompt_tokens=12000)
    assert first.queued_as_s == view.snapshot().by_id()[first.iu_id].request_cost_s
    router.sent(first.iu_id, 100.0, first.cost_s, "r1", first.expected_s + 0.5, first.queued_as_s)
    other = ({"n0-iu0", "n0-iu1"} - {first.iu_id}).pop()
    picks = {router.choose(view.snapshot(), 100.2, prompt_tokens=10).iu_id for _ in range(20)}
    assert picks == {other}


def test_the_queued_prompt_rule_applies_to_fresh_scores_only():
    # a score 1 s old (Consul-only ages): its predicted queue wait is too rough to keep the excess on
    view = healthy_view(lambda: 101.0, {"n0": ["n0-iu0", "n0-iu1"]})
    view.apply_kv([{"Key": "k/n0", "Value": json.dumps(body_of("n0", {"n0-iu0": 0.1, "n0-iu1": 0.1}, ts=100.0,
                                                               prefill_tps=8000.0))}])
    router = Router(random.Random(2))
    assert router.choose(view.snapshot(), 101.0, prompt_tokens=12000).queued_as_s is None
    assert router.choose(view.snapshot(), 100.2, prompt_tokens=12000).queued_as_s == pytest.approx(0.05)
