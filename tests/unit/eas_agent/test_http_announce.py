"""POST /announce on a real agent's HTTP server (eas_agent/http.py, eas_agent/agent.py): the signature,
every status, what a good batch does to /scores (at once, waking a blocking query), keep-alive, metrics,
and the config fields."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from eas_agent.agent import Agent, IUPipeline
from eas_agent.announce import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_NODE_RATE_PER_S, DEFAULT_RATE_PER_S
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import ConfigError, load_config, parse_config
from eas_wire.announce import ANNOUNCE_PATH, MAX_BATCH_BYTES
from eas_wire.signing import (
    SIGNATURE_HEADER,
    Ed25519PrivateKey,
    generate_key_pair,
    key_id,
    load_private,
    sign,
)
from sim.memstore import MemoryStore

pytestmark = pytest.mark.unit

GOOD = (Path(__file__).parents[2] / "fixtures" / "vllm" / "v1_single_engine.txt").read_text()
PRIVATE, PUBLIC = generate_key_pair()
KEY = load_private(PRIVATE)
OTHER = load_private(generate_key_pair()[0])  # an edge key this agent does not hold
EDGE = f"edge-a.{key_id(KEY.public_key())}.3f9c2b1d"
T0 = 1_764_780_000.0


class NoGpus:
    def read(self, indices):
        return []

    def close(self):
        pass


def config_dict(**extra) -> dict:
    return {
        "node": "n1",
        "rack": "r1",
        "listen": "127.0.0.1:0",
        "kernel_log": False,  # the host's own /dev/kmsg is no input of these tests
        "ius": [{"id": f"n1-iu{i}", "gpus": [i], "metrics_url": f"http://127.0.0.1:1/m{i}"} for i in range(2)],
        **extra,
    }


def keys_file(tmp_path: Path, text: str = PUBLIC + " edge-a\n") -> Path:
    path = tmp_path / "edge-keys.pub"
    path.write_text(text)
    return path


class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def make_agent():
    agents: list[Agent] = []

    def make(keys: Path | None, **extra) -> Agent:
        cfg = parse_config(config_dict(**({"announce_keys_file": str(keys)} if keys else {}), **extra))
        pipelines = [IUPipeline(cfg, i, VllmCollector(lambda: GOOD)) for i in range(len(cfg.ius))]
        agent = Agent(cfg, store=MemoryStore(), gpu_backend=NoGpus(), pipelines=pipelines, clock=Clock(T0))
        agent.http.start()
        agents.append(agent)
        return agent

    yield make
    for agent in agents:
        agent.http.stop()


@pytest.fixture
def agent(tmp_path, make_agent) -> Agent:
    """An agent with the channel on, one cycle scored at T0 (its body served), its clock 50 ms later."""
    agent = make_agent(keys_file(tmp_path))
    agent.cycle(T0)
    agent.clock.t = T0 + 0.05
    return agent


def connect(agent: Agent) -> http.client.HTTPConnection:
    host, port = agent.http.server.server_address[:2]
    return http.client.HTTPConnection(host, port, timeout=5)


def post(conn: http.client.HTTPConnection, body, key: Ed25519PrivateKey | None = KEY, path: str = ANNOUNCE_PATH,
         headers: dict | None = None, at: float = T0 + 0.05) -> tuple[int, dict, http.client.HTTPResponse]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    h = {"Content-Type": "application/json", **(headers or {})}
    if key is not None:
        h[SIGNATURE_HEADER] = sign(key, data, at)
    conn.request("POST", path, body=data, headers=h)
    response = conn.getresponse()
    raw = response.read()
    assert response.getheader("Content-Length") == str(len(raw))
    return response.status, json.loads(raw), response


def raw_request(agent: Agent, data: bytes) -> tuple[int, dict, http.client.HTTPResponse]:
    """Bytes as sent (headers the client library would fix), answered within 2 s."""
    sock = socket.create_connection(agent.http.server.server_address[:2], timeout=2)
    try:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read()), response
    finally:
        sock.close()


def scores(agent: Agent, query: str = "") -> tuple[int, dict]:
    conn = connect(agent)
    try:
        conn.request("GET", "/scores" + query)
        response = conn.getresponse()
        return int(response.getheader("X-Eas-Index")), json.loads(response.read())
    finally:
        conn.close()


def announcement(seq: int, tokens: int = 16_000, iu: str = "n1-iu0", sent: float = T0 + 0.04) -> dict:
    return {"iu": iu, "tokens": tokens, "seq": seq, "sent": sent}


def good_batch(*seqs: int, edge: str = EDGE, **kw) -> dict:
    return {"edge": edge, "announcements": [announcement(s, **kw) for s in seqs]}


def metric(agent: Agent, name: str, **labels) -> float:
    value = agent.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


# ------------------------------------------------------------------------------------------ good batches


def test_a_good_batch_raises_that_ius_score_by_its_prefill_and_acknowledges_it(agent):
    index, before = scores(agent)
    iu0 = before["ius"]["n1-iu0"]
    prefill_tps = iu0["components"]["prefill_tps"]
    assert "announced" in before and before["announced"] == {}
    conn = connect(agent)
    status, answer, _ = post(conn, good_batch(1, 2, tokens=16_000))
    assert (status, answer) == (200, {"accepted": 2, "ignored": {}, "ignored_seqs": []})
    new_index, after = scores(agent)
    assert new_index == index + 1  # served at once, not at the next cycle
    assert after["announced"] == {EDGE: 2}
    added = 2 * 16_000 / prefill_tps
    assert after["ius"]["n1-iu0"]["score"] == pytest.approx(iu0["score"] + added, abs=1e-3)
    assert after["ius"]["n1-iu0"]["components"]["announced_s"] == pytest.approx(added, abs=1e-3)
    assert after["ius"]["n1-iu1"] == before["ius"]["n1-iu1"]  # the other IU: as scraped
    assert metric(agent, "eas_agent_announcements_total", result="accepted") == 2
    assert metric(agent, "eas_agent_announce_batches_total", code="200") == 1
    # the next scrape sees the requests itself: what announcements added ends, the acknowledgement stays
    agent.cycle(T0 + 0.2)
    _, cycled = scores(agent)
    assert "announced_s" not in cycled["ius"]["n1-iu0"]["components"] and cycled["announced"] == {EDGE: 2}


def test_ignored_announcements_are_counted_by_reason_and_serve_no_new_body(agent):
    index, _ = scores(agent)
    batch = {"edge": EDGE, "announcements": [announcement(1, iu="n9-iu0"), announcement(2, tokens=0),
                                             announcement(3, sent=T0 + 60)]}
    status, answer, _ = post(connect(agent), batch)
    assert (status, answer) == (200, {"accepted": 0,
                                      "ignored": {"unknown_iu": 1, "tokens_invalid": 1, "sent_out_of_range": 1},
                                      "ignored_seqs": [1, 2, 3]})
    assert scores(agent)[0] == index  # nothing changed: the edges' waiting queries keep waiting
    assert metric(agent, "eas_agent_announcements_total", result="unknown_iu") == 1
    status, answer, _ = post(connect(agent), good_batch(4, 4, tokens=10**9))
    # the second 4 is not counted, but its number is the first's: the edge cannot tell them apart
    assert answer == {"accepted": 1, "ignored": {"tokens_capped": 1, "seq_invalid": 1}, "ignored_seqs": []}
    status, answer, _ = post(connect(agent), good_batch(4))
    assert answer == {"accepted": 0, "ignored": {"replayed": 1}, "ignored_seqs": [4]}


def test_a_waiting_blocking_query_is_answered_within_100ms_of_the_post(agent):
    index, _ = scores(agent)
    answered: list[tuple[float, int, dict]] = []

    def wait():
        new_index, body = scores(agent, f"?index={index}&wait_s=5")
        answered.append((time.monotonic(), new_index, body))

    waiter = threading.Thread(target=wait)
    waiter.start()
    time.sleep(0.3)
    assert not answered  # it is waiting (no cycle runs in this test)
    posted = time.monotonic()
    assert post(connect(agent), good_batch(1))[0] == 200
    waiter.join(5)
    (at, new_index, body), = answered
    assert at - posted < 0.1, f"answered {at - posted:.3f} s after the POST"
    assert new_index == index + 1 and body["announced"] == {EDGE: 1}


def test_two_posts_on_one_keep_alive_connection_are_both_answered(agent):
    conn = connect(agent)
    first = post(conn, good_batch(1))
    sock = conn.sock
    assert sock is not None and first[2].getheader("Connection") is None  # http.client keeps it open
    second = post(conn, good_batch(2, 3))
    assert conn.sock is sock  # the same connection carried both
    assert (first[0], first[1]["accepted"], second[0], second[1]["accepted"]) == (200, 1, 200, 2)
    # a 400 whose body was read keeps the connection too
    assert post(conn, b"{not json")[0] == 400 and conn.sock is sock
    assert post(conn, good_batch(4))[1] == {"accepted": 1, "ignored": {}, "ignored_seqs": []} and conn.sock is sock
    assert scores(agent)[1]["announced"] == {EDGE: 4}


def test_a_batch_before_the_first_cycle_is_counted_and_served_by_the_first_body(tmp_path, make_agent):
    agent = make_agent(keys_file(tmp_path))
    agent.clock.t = T0
    assert post(connect(agent), good_batch(1, sent=T0))[1] == {"accepted": 1, "ignored": {}, "ignored_seqs": []}
    assert agent.http.index == 0  # no body to build on yet
    agent.cycle(T0 + 0.01)
    assert scores(agent)[1]["announced"] == {EDGE: 1}


def test_a_batch_during_a_cycle_never_replaces_its_body_with_an_older_base(agent):
    """announce() builds its body under the lock the cycle holds from scoring to serving its body: a batch
    counted meanwhile is served on the new base (or by the cycle's own body), never on the previous one."""
    release, scoring = threading.Event(), threading.Event()
    pipeline = agent.pipelines[0]
    original = pipeline.run

    def slow_run(now, metrics, scraped=None, kernel=None):
        result = original(now, metrics, scraped, kernel)  # this IU's announced prompts are reconciled
        scoring.set()
        assert release.wait(5)
        return result

    pipeline.run = slow_run
    served: list[tuple[float, dict | None]] = []
    set_scores = agent.http.set_scores
    agent.http.set_scores = lambda body: (served.append((body.ts, body.announced)), set_scores(body))
    cycler = threading.Thread(target=agent.cycle, args=(T0 + 0.2,))
    cycler.start()
    assert scoring.wait(5)
    agent.clock.t = T0 + 0.25
    posted: list = []
    poster = threading.Thread(target=lambda: posted.append(post(connect(agent), good_batch(1, sent=T0 + 0.24))))
    poster.start()
    poster.join(0.3)
    release.set()
    cycler.join(5)
    poster.join(5)
    assert posted[0][1] == {"accepted": 1, "ignored": {}, "ignored_seqs": []}
    # the batch waited for the cycle's body, then served its own on that base (not: a body on
    # the previous scrape's base, whose additions the cycle had just ended, served in the middle of it)
    assert [ts for ts, _ in served] == [T0 + 0.2, T0 + 0.2]
    _, body = scores(agent)
    assert body["ts"] == T0 + 0.2 and body["announced"] == {EDGE: 1}
    assert body["ius"]["n1-iu0"]["components"]["announced_s"] > 0


# ------------------------------------------------------------------------------------------ refusals


def test_without_a_keys_file_the_channel_is_off_404(make_agent):
    agent = make_agent(None)
    agent.cycle(T0)
    status, answer, response = post(connect(agent), good_batch(1))
    assert status == 404 and "announce channel is off" in answer["error"]
    assert "announce_keys_file" in answer["error"]
    assert response.getheader("Connection") == "close"
    assert "announced" in scores(agent)[1]  # /scores itself is unchanged by the channel being off
    assert metric(agent, "eas_agent_announce_batches_total", code="404") == 1


def unchanged(agent, index: int) -> bool:
    return agent.announcements.acked == {} and not agent.announcements.counts and scores(agent)[0] == index


@pytest.mark.parametrize("how, words", [
    ("no header", f"missing {SIGNATURE_HEADER}"),
    ("a key the agent does not hold", "not by a key of this agent's edges"),
    ("a garbled header", f"missing {SIGNATURE_HEADER}"),
])
def test_a_batch_not_signed_by_a_known_key_is_401_unread_and_nothing_is_counted(agent, how, words):
    index, _ = scores(agent)
    key, headers = {"no header": (None, {}), "a key the agent does not hold": (OTHER, {}),
                    "a garbled header": (None, {SIGNATURE_HEADER: "key=zz,sig=1"})}[how]
    status, answer, response = post(connect(agent), good_batch(1), key=key, headers=headers)
    assert status == 401 and words in answer["error"] and response.getheader("Connection") == "close"
    assert unchanged(agent, index)
    assert metric(agent, "eas_agent_announce_batches_total", code="401") == 1


def test_a_changed_body_a_stale_signature_and_a_replayed_one_are_401(agent):
    index, _ = scores(agent)
    data = json.dumps(good_batch(1)).encode()
    signature = sign(KEY, data, T0 + 0.05)
    tampered = data.replace(b'"tokens": 16000', b'"tokens": 99999')
    status, answer, response = post(connect(agent), tampered, key=None, headers={SIGNATURE_HEADER: signature})
    assert status == 401 and "does not verify" in answer["error"]
    assert response.getheader("Connection") == "close"  # a forger keeps no connection from the edges' reserve
    status, answer, _ = post(connect(agent), good_batch(1), at=T0 - 60)
    assert status == 401 and "from the agent's clock" in answer["error"]
    assert unchanged(agent, index)
    assert post(connect(agent), data, key=None, headers={SIGNATURE_HEADER: signature})[0] == 200
    status, answer, _ = post(connect(agent), data, key=None, headers={SIGNATURE_HEADER: signature})
    assert status == 401 and "replayed" in answer["error"]


def test_a_batch_for_another_edge_id_than_its_key_s_is_403_and_that_edge_keeps_its_channel(tmp_path, make_agent):
    """Two edges' keys on one agent: Y signs a batch claiming X's id with a huge number; refused, and X's
    next real batch is counted."""
    other_private, other_public = generate_key_pair()
    agent = make_agent(keys_file(tmp_path, f"{PUBLIC} edge-x\n{other_public} edge-y\n"))
    agent.cycle(T0)
    agent.clock.t = T0 + 0.05
    forged = good_batch(2**53 - 1)  # X's id (EDGE names KEY), signed with Y's key
    status, answer, _ = post(connect(agent), forged, key=load_private(other_private))
    assert status == 403 and "does not name the key" in answer["error"]
    assert agent.announcements.acked == {}
    assert post(connect(agent), good_batch(1))[1] == {"accepted": 1, "ignored": {}, "ignored_seqs": []}
    assert scores(agent)[1]["announced"] == {EDGE: 1}


def test_no_content_length_is_411_and_a_bad_one_400(agent):
    head = f"POST {ANNOUNCE_PATH} HTTP/1.1\r\nHost: x\r\n{SIGNATURE_HEADER}: {sign(KEY, b'', T0)}\r\n"
    status, answer, response = raw_request(agent, (head + "Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n").encode())
    assert status == 411 and "Content-Length" in answer["error"] and response.getheader("Connection") == "close"
    for bad in ("abc", "-1", "1e3", "²"):
        status, answer, _ = raw_request(agent, (head + f"Content-Length: {bad}\r\n\r\n").encode("latin-1"))
        assert status == 400 and "Content-Length" in answer["error"], bad
    assert agent.announcements.counts == {}


def test_a_body_over_the_limit_is_413_without_reading_it(agent):
    head = (f"POST {ANNOUNCE_PATH} HTTP/1.1\r\nHost: x\r\n{SIGNATURE_HEADER}: {sign(KEY, b'', T0)}\r\n"
            f"Content-Length: {MAX_BATCH_BYTES + 1}\r\n\r\n")
    started = time.monotonic()
    status, answer, response = raw_request(agent, head.encode())  # no body sent: the answer must not wait for it
    assert status == 413 and str(MAX_BATCH_BYTES) in answer["error"] and time.monotonic() - started < 1.0
    assert response.getheader("Connection") == "close"
    conn = connect(agent)
    status, _, _ = post(conn, b"{" + b" " * MAX_BATCH_BYTES + b"}")  # one byte over, sent whole
    assert status == 413
    empty = len(json.dumps({"edge": EDGE, "announcements": [], "pad": ""}))
    status, answer, _ = post(connect(agent), {"edge": EDGE, "announcements": [], "pad": "x" * (MAX_BATCH_BYTES - empty)})
    assert status == 200  # at the limit, fine


@pytest.mark.parametrize("body, words", [
    (b"{not json", "body is not JSON"),
    (b"", "body is not JSON"),
    (b"\xff\xfe", "body is not JSON"),
    (b"[" * 50_000, "body is not JSON"),
])
def test_a_body_that_is_not_json_is_400_with_the_parse_error(agent, body, words):
    status, answer, _ = post(connect(agent), body)
    assert status == 400 and answer["error"].startswith(words)


@pytest.mark.parametrize("body, words", [
    ([], "body is list, not an object"),
    ({"edge": "bad edge", "announcements": []}, "is not an edge id"),
    ({"edge": EDGE, "announcements": [{}] * 513}, "has 513 entries"),
])
def test_a_malformed_batch_is_400_with_its_message(agent, body, words):
    status, answer, _ = post(connect(agent), body)
    assert status == 400 and words in answer["error"]
    assert agent.announcements.acked == {}
    assert metric(agent, "eas_agent_announce_batches_total", code="400") == 1


def test_another_post_path_is_404_and_get_announce_too(agent):
    status, answer, _ = post(connect(agent), good_batch(1), path="/scores")
    assert status == 404 and "/announce" in answer["error"]
    conn = connect(agent)
    conn.request("GET", ANNOUNCE_PATH)
    assert conn.getresponse().status == 404
    assert agent.announcements.acked == {}


def test_metrics_are_served(agent):
    post(connect(agent), good_batch(1))
    post(connect(agent), good_batch(2), key=OTHER)
    conn = connect(agent)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    assert 'eas_agent_announcements_total{result="accepted"} 1.0' in text
    assert 'eas_agent_announce_batches_total{code="200"} 1.0' in text
    assert 'eas_agent_announce_batches_total{code="401"} 1.0' in text


# ------------------------------------------------------------------------------------------ the config


def test_the_fields_default(tmp_path):
    cfg = parse_config(config_dict())
    assert (cfg.announce_keys_file, cfg.announce_max_prompt_tokens, cfg.announce_rate_per_s,
            cfg.announce_node_rate_per_s) == (None, DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_RATE_PER_S,
                                              DEFAULT_NODE_RATE_PER_S)
    assert cfg.read_edge_keys() is None


def test_the_fields_reach_the_agent(tmp_path, make_agent):
    agent = make_agent(keys_file(tmp_path), announce_max_prompt_tokens=1_000, announce_rate_per_s=5,
                       announce_node_rate_per_s=50)
    node = agent.announcements
    assert (node.max_prompt_tokens, node.rate_per_s, node.burst, node.node_rate_per_s) == (1_000, 5.0, 10.0, 50.0)
    assert set(agent.http.edge_keys.keys) == {key_id(KEY.public_key())}


@pytest.mark.parametrize("field, value, words", [
    ("announce_keys_file", 7, "expected a string, got int 7"),
    ("announce_keys_file", "", "expected a file path or null, got ''"),
    ("announce_keys_file", ["a"], "expected a string, got list ['a']"),
    ("announce_node_rate_per_s", 0, "must be > 0, got 0.0"),
    ("announce_max_prompt_tokens", 0, "must be >= 1, got 0"),
    ("announce_max_prompt_tokens", -5, "must be >= 1, got -5"),
    ("announce_max_prompt_tokens", 1.5, "expected an integer, got float 1.5"),
    ("announce_max_prompt_tokens", True, "expected an integer, got a boolean"),
    ("announce_max_prompt_tokens", "32k", "expected an integer, got str '32k'"),
    ("announce_rate_per_s", 0, "must be > 0, got 0.0"),
    ("announce_rate_per_s", -1.5, "must be > 0, got -1.5"),
    ("announce_rate_per_s", float("nan"), "must be a finite number > 0, got nan"),
    ("announce_rate_per_s", float("inf"), "must be a finite number > 0, got inf"),
    ("announce_rate_per_s", "fast", "expected a number, got str 'fast'"),
])
def test_a_bad_field_is_named_with_its_value(field, value, words):
    with pytest.raises(ConfigError) as info:
        parse_config(config_dict(**{field: value}), "/etc/eas-agent/config.yml")
    assert str(info.value) == f"/etc/eas-agent/config.yml: {field}: {words}"


def test_the_fields_load_from_yaml(tmp_path):
    path = tmp_path / "config.yml"
    keys = keys_file(tmp_path)
    path.write_text(json.dumps(config_dict(announce_keys_file=str(keys), announce_max_prompt_tokens=32768,
                                           announce_rate_per_s=500)))
    cfg = load_config(path)
    assert (cfg.announce_max_prompt_tokens, cfg.announce_rate_per_s) == (32_768, 500.0)
    assert set(cfg.read_edge_keys().keys) == {key_id(KEY.public_key())}


@pytest.mark.parametrize("text, words", [
    ("", "holds no edge public key"),
    ("# only a comment\n", "holds no edge public key"),
    ("not-base64!\n", "line 1: an edge public key is not base64"),
    (f"{PUBLIC}\nAAAA\n", "line 2: an edge public key is 3 bytes, not 32"),
], ids=["empty", "comment-only", "not-base64", "short-second-key"])  # the key is drawn per run: no key in ids
def test_an_unusable_keys_file_stops_the_agent_naming_the_field(tmp_path, text, words):
    path = keys_file(tmp_path, text)
    cfg = parse_config(config_dict(announce_keys_file=str(path)), "/etc/eas-agent/config.yml")
    with pytest.raises(ConfigError) as info:
        Agent(cfg, store=MemoryStore(), gpu_backend=NoGpus(), serve_http=False)
    assert info.value.field == "announce_keys_file"
    assert str(info.value) == f"/etc/eas-agent/config.yml: announce_keys_file: {path}: {words}"


def test_a_missing_keys_file_stops_the_agent(tmp_path):
    missing = tmp_path / "edge-keys.pub"
    cfg = parse_config(config_dict(announce_keys_file=str(missing)), "c.yml")
    with pytest.raises(ConfigError, match=r"^c.yml: announce_keys_file: .*No such file"):
        cfg.read_edge_keys()
