"""Sessions under a traffic rollout, through three edges in front of two stable and two canary simulated IUs:
every turn of a session lands where the keyed hash of its key puts it (eas_wire/rollout.py), whichever edge
takes it; a canary session stays on the canary as the weight rises and abort takes every session to stable;
a hostile key (8 KB of bytes that are not UTF-8, or longer than aiohttp's header cap) is served or refused
like any request and moves nothing but itself; no key reaches the edges' logs. A request without a session key
that its client retries (the same body and credential, ``x-stainless-retry-count`` raised, through another
edge) meets the revision its request key puts it on every time."""

from __future__ import annotations

import json
import logging
import socket
import time
import urllib.request
from dataclasses import replace

import pytest

from consul_io import layout
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from eas_wire.rollout import (
    RolloutDoc,
    body_digest,
    request_digest,
    session_digest,
    session_on_canary,
    session_point,
)
from edge.config import AccessConfig, EdgeConfig
from edge.rollout import session_of
from sim.vllm.openai_api import MODEL_NAME
from sim.vllm.registration import IUService, register_on_catalog_node
from sim.vllm.server import SimulatedIU
from tests.helpers.edge import RunningEdge, body_of, wait_for

pytestmark = pytest.mark.integration
NET = "127.0.73"
STABLE, CANARY = "old", "new"
SALT = "5e55105e55105e55105e55105e55105e"
KEYS = [f"conversation-{n}-d1f7" for n in range(24)]


@pytest.fixture(scope="module")
def cluster():
    server = DevConsulServer(addr=f"{NET}.101:0").start()
    io, sims, revision_of = ConsulIO(server.address), [], {}
    for n, revision in enumerate((STABLE, STABLE, CANARY, CANARY)):
        node, address = f"n{n}", f"{NET}.{111 + n}"
        sims.append(SimulatedIU(address, 0, arrival_rate=0, seed=n).start())
        register_on_catalog_node(io, IUService(f"{node}-iu0", node, "r1", address,
                                               int(sims[-1].address.rsplit(":", 1)[1]), (0,), 0, revision=revision),
                                 address)
        io.kv_put(f"clusterctl/eas/dc1/{node}", json.dumps(body_of(node, {f"{node}-iu0": 0.05})))
        revision_of[f"{node}-iu0"] = revision
    put(io, 0.3)
    edges = [RunningEdge(EdgeConfig(listen=f"{NET}.{102 + k}:0", debug_headers=True, seed=1,
                                    consul=replace(EdgeConfig().consul, address=server.address),
                                    access=AccessConfig(admin_listen=f"{NET}.{102 + k}:0"))) for k in range(3)]
    try:
        for edge in edges:
            wait_for(lambda e=edge: len(e.state.view.snapshot().healthy) == 4, 10.0, "four routable IUs")
        yield io, edges, revision_of
    finally:
        for edge in edges:
            edge.close()
        for sim in sims:
            sim.stop()
        server.stop()


def put(io: ConsulIO, weight: float, state: str = "progressing", edges=()) -> RolloutDoc:
    doc = RolloutDoc("r", STABLE, CANARY, weight, state, 0, time.time(), session_salt=SALT)
    io.kv_put(layout.rollout_key("dc1"), doc.dumps())
    for edge in edges:
        wait_for(lambda e=edge: e.state.rollout.doc == doc, 2.0, f"weight {weight} applied")
    return doc


def served_by(edge: RunningEdge, headers: dict | None = None, user: str | None = None) -> str:
    body = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, **({"user": user} if user else {})}
    request = urllib.request.Request(edge.url("/v1/completions"), data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.headers["X-Eas-IU"]


def raw_request(edge: RunningEdge, header_value: bytes) -> tuple[int, bytes]:
    """A request whose X-Session-Id is ``header_value``'s bytes as they are: (status, X-Eas-IU's value)."""
    body = json.dumps({"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2}).encode()
    host, port = edge.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: edge\r\nContent-Type: application/json\r\n"
                     b"Connection: close\r\nX-Session-Id: " + header_value + b"\r\n"
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    iu = next((line.split(b":", 1)[1].strip() for line in answer.split(b"\r\n") if line.lower().startswith(b"x-eas-iu:")),
              b"")
    return status, iu


def predicted(doc: RolloutDoc, header: str | None = None, user_digest: bytes | None = None) -> str:
    point = session_point(doc.session_key(), session_of(header, user_digest))
    return CANARY if session_on_canary(point, doc.effective_weight) else STABLE


def test_every_turn_follows_the_sessions_hash_on_every_edge_and_the_weight_only_adds_sessions(cluster, caplog):
    io, edges, revision_of = cluster
    caplog.set_level(logging.DEBUG)
    canary_before = set()
    for weight in (0.3, 0.6):
        doc = put(io, weight, edges=edges)
        for n, key in enumerate(KEYS):
            turns = {revision_of[served_by(edges[(n + t) % 3], {"X-Session-Id": key})] for t in range(3)}
            assert turns == {predicted(doc, key)}, key  # one revision, the hash's, from three edges
            if weight == 0.6:
                assert key not in canary_before or turns == {CANARY}  # never back to stable as the weight rises
            elif turns == {CANARY}:
                canary_before.add(key)
    assert 0 < len(canary_before) < len(KEYS)
    put(io, 0.0, "aborted", edges=edges)
    assert {revision_of[served_by(edges[n % 3], {"X-Session-Id": key})] for n, key in enumerate(KEYS)} == {STABLE}
    assert not [key for key in KEYS if key in caplog.text]


def test_the_user_field_is_a_session_key_and_the_header_comes_first(cluster):
    io, edges, revision_of = cluster
    doc = put(io, 0.5, edges=edges)
    users = [f"user-{n}" for n in range(12)]
    for n, user in enumerate(users):
        expected = predicted(doc, None, session_digest(user.encode()))
        assert {revision_of[served_by(edges[(n + t) % 3], user=user)] for t in range(3)} == {expected}
        header_first = predicted(doc, f"other-{user}")
        assert revision_of[served_by(edges[n % 3], {"X-Session-Id": f"other-{user}"}, user=user)] == header_first


def test_a_hostile_key_is_served_on_its_own_side_or_refused_by_the_header_cap(cluster, caplog):
    io, edges, revision_of = cluster
    doc = put(io, 0.5, edges=edges)
    caplog.set_level(logging.DEBUG)
    hostile = bytes(range(0x80, 0x100)) * 31 + b"\xc3\x28\xed\xa0\x80"  # 7,941 bytes: never valid UTF-8
    # aiohttp hands a header's bytes over decoded as UTF-8 with surrogateescape
    expected = predicted(doc, hostile.decode("utf-8", "surrogateescape"))
    for edge in edges:
        status, iu = raw_request(edge, hostile)
        assert status == 200 and revision_of[iu.decode()] == expected
    status, _ = raw_request(edges[0], b"x" * 9000)  # over aiohttp's 8,190-byte header line: refused before us
    assert status == 400
    # the other sessions are where they were: nothing a key sends is kept or shared
    assert [revision_of[served_by(edges[1], {"X-Session-Id": k})] for k in KEYS] == [predicted(doc, k) for k in KEYS]
    assert hostile[:32].decode("latin-1") not in caplog.text and "xxxxxxxx" not in caplog.text


def test_a_retried_request_without_a_session_key_meets_one_revision_through_every_edge(cluster, caplog):
    io, edges, revision_of = cluster
    doc = put(io, 0.5, edges=edges)
    caplog.set_level(logging.DEBUG)
    sides = []
    for n in range(24):
        raw = json.dumps({"model": MODEL_NAME, "prompt": f"question {n}", "max_tokens": 2}).encode()
        credential = f"Bearer sk-retry-client-{n % 4}-6b1e"
        point = session_point(doc.session_key(), request_digest(credential.encode(), "/v1/completions",
                                                                body_digest(raw)))
        attempts = set()
        for retry in range(3):  # the OpenAI SDK's attempts: the same bytes, the retry count raised
            request = urllib.request.Request(edges[(n + retry) % 3].url("/v1/completions"), data=raw, headers={
                "Content-Type": "application/json", "Authorization": credential,
                "x-stainless-retry-count": str(retry)})
            with urllib.request.urlopen(request, timeout=10) as answer:
                attempts.add(revision_of[answer.headers["X-Eas-IU"]])
        assert attempts == {CANARY if session_on_canary(point, 0.5) else STABLE}, n
        sides.append(attempts.pop())
    assert STABLE in sides and CANARY in sides
    assert "sk-retry-client" not in caplog.text
