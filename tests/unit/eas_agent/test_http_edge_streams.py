"""The agent's publisher learns whether edges read its bodies on their signed ``/scores`` streams."""

from __future__ import annotations

import http.client
import time

import pytest

from eas_wire.signing import SIGNATURE_HEADER, request_message, sign
from tests.unit.eas_agent.test_http_announce import KEY, T0, keys_file, make_agent  # noqa: F401 (a fixture)

pytestmark = pytest.mark.unit

STREAM = "/scores?stream=1"


def open_stream(agent, signed: bool) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
    host, port = agent.http.server.server_address[:2]
    conn = http.client.HTTPConnection(host, port, timeout=5)
    headers = {SIGNATURE_HEADER: sign(KEY, request_message("GET", STREAM), T0)} if signed else {}
    conn.request("GET", STREAM, headers=headers)
    response = conn.getresponse()
    assert response.status == 200
    response.readline()  # the first body: the stream is being served
    return conn, response


def wait_for(predicate, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_a_signed_stream_counts_as_an_edge_reading_an_anonymous_one_does_not(tmp_path, make_agent):  # noqa: F811
    agent = make_agent(keys_file(tmp_path), listen="127.0.74.1:0")
    agent.cycle(T0)
    assert agent.publisher.streamed() is False
    anonymous = open_stream(agent, signed=False)
    try:
        assert agent.http.edge_streams == 0 and agent.publisher.streamed() is False
        edge = open_stream(agent, signed=True)
        assert wait_for(lambda: agent.http.edge_streams == 1) and agent.publisher.streamed() is True
        for closing in edge:
            closing.close()
        cycles = iter(range(1, 1000))

        def gone() -> bool:  # new bodies: the server's writes to the closed stream end it
            agent.cycle(T0 + 0.2 * next(cycles))
            return agent.http.edge_streams == 0

        assert wait_for(gone) and agent.publisher.streamed() is False
    finally:
        for closing in anonymous:
            closing.close()
