"""The edge's own resource bounds (edge.limits): descriptors, client connections, request-head deadlines;
the edge's own shortage is never an IU's fault."""

from __future__ import annotations

import json
import resource
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import aiohttp
import pytest

from tests.helpers.edge import MODEL, Pool, metric, post, running_edge, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def pool(consul_addr):
    pool = Pool(consul_addr, nodes=2, ius_per_node=1)
    for node in pool.nodes:
        pool.publish_kv(node, {f"{node}-iu0": 0.01})
    yield pool
    pool.stop()


def completion() -> dict:
    return {"model": MODEL, "prompt": "hello " * 40, "max_tokens": 1}


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def test_connections_past_the_cap_get_a_quick_503_and_idle_ones_are_closed_at_the_head_deadline(pool):
    with running_edge(pool, max_connections=5, header_timeout_s=1.0) as edge:
        idle = [connect(edge.address) for _ in range(5)]
        wait_for(lambda: len(edge.edge.runner.server.connections) == 5, 5, "five connections open")
        started = time.monotonic()
        with connect(edge.address) as extra:
            answer = extra.recv(65536)
        assert time.monotonic() - started < 0.5
        assert answer.startswith(b"HTTP/1.1 503") and b"X-Edge-Reason: edge_connections" in answer, answer
        assert json.loads(answer.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "edge_connections"
        for conn in idle:  # no request head within 1 s: closed by the edge
            conn.settimeout(3)
            assert conn.recv(1) == b""
            conn.close()
        assert post(edge.url("/v1/completions"), completion())[0] == 200
        assert edge.edge.site.refused == 1 and edge.edge.site.head_timeouts == 5


class ShortOfDescriptors:
    """The edge's client session, except that connecting fails as it does when the edge is out of
    descriptors (EMFILE)."""

    def __init__(self, session):
        self.session = session

    def __getattr__(self, name):
        return getattr(self.session, name)

    async def post(self, *args, **kwargs):
        from aiohttp.client_reqrep import ConnectionKey

        key = ConnectionKey._make([None] * len(ConnectionKey._fields))
        raise aiohttp.ClientConnectorError(key, OSError(24, "Too many open files"))


def test_the_edges_own_descriptor_shortage_is_a_503_and_blames_no_iu(pool):
    with running_edge(pool) as edge:
        real = edge.state.session
        edge.state.session = ShortOfDescriptors(real)
        try:
            status, headers, body = post(edge.url("/v1/completions"), completion())
        finally:
            edge.state.session = real
        assert status == 503 and headers["X-Edge-Reason"] == "edge_resources", body
        assert json.loads(body)["error"]["type"] == "server_error"
        assert edge.state.router.ejected == {} and metric(edge, "eas_edge_retries_total") == 0
        assert metric(edge, "eas_edge_upstream_errors_total", 'iu="n0-iu0",kind="connect"') == 0
        with pytest.raises(urllib.error.HTTPError) as info:  # a load balancer sends elsewhere for a while
            urllib.request.urlopen(edge.url("/healthz"), timeout=5)
        assert json.load(info.value)["status"] == "edge_resources"
        assert post(edge.url("/v1/completions"), completion())[0] == 200


def test_an_edge_with_few_descriptors_raises_its_limit_and_survives_a_crowd_of_idle_sockets(pool, tmp_path):
    """Soft limit 256 of a hard 512: raised to 512 at start; 250 idle sockets from one host are refused
    past the cap the descriptors allow (a 503, or a reset when the client was still sending: the edge
    reads nothing from a connection it refuses), no IU is ejected, and the edge serves again at the head
    deadline."""
    config = tmp_path / "edge.yml"
    config.write_text("header_timeout_s: 4\n")

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, 512))

    edge = subprocess.Popen([sys.executable, "-m", "edge", "--config", str(config), "--consul", pool.consul_addr,
                             "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0", "--no-push"], cwd=ROOT,
                            preexec_fn=limited,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    crowd: list[socket.socket] = []
    try:
        address = edge.stdout.readline().strip().rsplit("http://", 1)[1]
        admin = edge.stdout.readline().split("http://", 1)[1].split()[0]
        limits = Path(f"/proc/{edge.pid}/limits").read_text()
        assert [line.split()[3:5] for line in limits.splitlines() if line.startswith("Max open files")] == [
            ["512", "512"]]
        opened = time.monotonic()
        for _ in range(250):
            crowd.append(connect(address))
        time.sleep(0.3)
        assert time.monotonic() - opened < 3, "the crowd took too long to connect for this test's timing"
        try:
            status, headers, _ = post(f"http://{address}/v1/completions", completion())
            assert status == 503 and headers["X-Edge-Reason"] == "edge_connections"
        except (ConnectionError, urllib.error.URLError):
            pass
        time.sleep(max(0.0, opened + 4.5 - time.monotonic()))  # past the crowd's head deadline
        for conn in crowd:
            conn.close()
        assert post(f"http://{address}/v1/completions", completion())[0] == 200
        with urllib.request.urlopen(f"http://{admin}/metrics", timeout=5) as answer:
            text = answer.read().decode()
        assert 'kind="connect"' not in text and "eas_edge_retries_total{" not in text
    finally:
        for conn in crowd:
            conn.close()
        edge.terminate()
        _out, err = edge.communicate(timeout=30)
    assert "Traceback" not in err, err[-3000:]
