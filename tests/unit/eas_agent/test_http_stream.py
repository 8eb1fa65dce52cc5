"""The agent's ``GET /scores?stream=1``: every body as one line over one answer, heartbeats, ends; its backlog."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.request

import pytest

from eas_agent.http import MAX_CONNECTIONS, AgentHttpServer, AgentMetrics
from eas_wire.placed import Placement
from eas_wire.scorebody import IUScore, ScoreBody
from eas_wire.stream import STREAM_CONTENT_TYPE

pytestmark = pytest.mark.unit


def body(seq: int) -> ScoreBody:
    return ScoreBody(node="n", ts=float(seq), ius={}, seq=seq)


def started() -> AgentHttpServer:
    server = AgentHttpServer("127.0.0.1", 0, AgentMetrics())
    server.start()
    return server


def test_a_stream_carries_every_body_as_a_line_over_one_answer_from_the_first_cycle_on():
    server = started()
    try:
        with urllib.request.urlopen(f"http://{server.address}/scores?stream=1", timeout=5) as answer:
            assert answer.headers["Content-Type"] == STREAM_CONTENT_TYPE
            # no cycle yet: nothing is written (never the "{}" of an agent without a body), until the first
            threading.Timer(0.3, server.set_scores, args=(body(1),)).start()
            waited = time.monotonic()
            assert json.loads(answer.readline()) == body(1).to_json()
            assert time.monotonic() - waited >= 0.25
            for seq in (2, 3):  # each later body, in order, on the same answer
                threading.Timer(0.05, server.set_scores, args=(body(seq),)).start()
                assert json.loads(answer.readline())["seq"] == seq
        # a stream opened after a cycle starts with the current body at once
        with urllib.request.urlopen(f"http://{server.address}/scores?stream=1", timeout=5) as answer:
            assert json.loads(answer.readline())["seq"] == 3
    finally:
        server.stop()


def test_a_stream_line_carries_each_placement_once_and_a_blocking_answer_the_whole_window():
    """With 16 edges, decoding the placements every body of the relay window repeated was most of the relay's
    CPU at each edge: a stream writes each placement once."""
    server = AgentHttpServer("127.0.71.1", 0, AgentMetrics())
    server.start()  # stream_bodies is called here, as the handler of an edge's stream does
    lines: list[bytes] = []
    windows = ((1, 2), (1, 2, 3), (2, 3), (3, 4, 5))  # what NodeAnnouncements.body gives, cycle after cycle
    ius = {"n-iu0": IUScore(0.1, "passing")}
    writer = threading.Thread(target=server.stream_bodies, args=(lines.append,), kwargs={"heartbeat_s": 60.0})
    try:
        writer.start()
        for k, window in enumerate(windows, 1):
            placed = tuple(Placement(seq, "n-iu0", ((8, seq),)) for seq in window)
            scores = ScoreBody(node="n", ts=float(k), ius=ius, seq=k, placed=placed)
            server.set_scores(scores)
            assert server.scores_json == scores.dumps().encode()  # a blocking query's answer: the whole window
            deadline = time.monotonic() + 5
            while len(lines) < k and time.monotonic() < deadline:
                time.sleep(0.005)
    finally:
        server.stop()
        writer.join(5)
    read = [ScoreBody.from_json(json.loads(line))[0] for line in lines]
    assert [body.seq for body in read] == [1, 2, 3, 4]
    assert [[p.seq for p in body.placed] for body in read] == [[1, 2], [3], [], [4, 5]]
    assert "placed" not in json.loads(lines[2])  # nothing new: the line is the body alone
    assert read[3].placed[0] == Placement(4, "n-iu0", ((8, 4),))


def test_a_quiet_stream_gets_heartbeats_and_ends_after_its_time_and_when_the_agent_stops():
    server = started()
    lines: list[bytes] = []
    try:
        server.set_scores(body(1))
        ended = time.monotonic()
        server.stream_bodies(lines.append, heartbeat_s=0.05, max_s=0.3)
        assert 0.25 <= time.monotonic() - ended < 2.0
        assert lines[0] == body(1).dumps().encode() + b"\n" and len(lines) >= 4 and set(lines[1:]) == {b"\n"}

        with urllib.request.urlopen(f"http://{server.address}/scores?stream=1", timeout=5) as answer:
            assert json.loads(answer.readline())["seq"] == 1
            threading.Timer(0.2, server.stop).start()
            stopped = time.monotonic()
            assert answer.read() == b""  # the agent's stop ends the stream (not: threads kept waiting)
            assert time.monotonic() - stopped < 2.0
    finally:
        server.stop()


def test_a_stream_whose_reader_is_gone_ends_at_the_first_write_that_fails():
    server = started()
    try:
        server.set_scores(body(1))

        def gone(_line: bytes) -> None:
            raise BrokenPipeError

        # it propagates to the handler (QuietHTTPServer logs nothing for it) and frees the thread at once
        with pytest.raises(BrokenPipeError):
            server.stream_bodies(gone)
    finally:
        server.stop()


def test_edges_reconnecting_at_once_are_all_accepted_without_a_syn_retransmission():
    """socketserver's listen backlog of 5 dropped the 7th of 16 edges reconnecting at once (an agent
    restart): they waited out a 1 s SYN retransmission, the edges' connect timeout."""
    server = AgentHttpServer("127.0.0.1", 0, AgentMetrics())  # not serving yet: nothing is accepted
    host, port = server.server.server_address[:2]
    clients = []
    try:
        for _ in range(32):
            client = socket.socket()
            client.settimeout(0.5)
            client.connect((host, port))  # the kernel completes it while the backlog has room
            clients.append(client)
        assert len(clients) == 32 <= MAX_CONNECTIONS
    finally:
        for client in clients:
            client.close()
        server.server.server_close()
