"""A small pool on loopback for the edge's tests: simulated IUs, their Consul services, fake agents, the edge.

Each node gets its own loopback address (127.0.200.N: away from the virtual cluster's 127.0.R.N) so that
the edge can find its agent at ``<IU service address>:<agent_port>`` as in production; ports are random.
"""

from __future__ import annotations

import asyncio
import functools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import replace

from aiohttp import web

from consul_io import layout
from consul_io.client import ConsulIO
from eas_agent.http import AgentHttpServer, AgentMetrics
from eas_wire.scorebody import IUScore, ScoreBody
from edge.access_config import DEFAULT_ADMIN_LISTEN
from edge.config import AccessConfig, EdgeConfig, PushConfig
from edge.main import Edge
from sim.vllm.registration import IUService, register_on_catalog_node
from sim.vllm.server import SimulatedIU
from tests.helpers import wait_for as shared_wait_for

MODEL = "meta-llama/Meta-Llama-3-70B-Instruct"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def body_of(node: str, scores: dict[str, float | None], ts: float | None = None, heartbeat_s: float = 2.0,
            prefill_tps: float = 12000.0) -> dict:
    return {"node": node, "rack": "r1", "profile": "drain", "seq": 1, "ts": time.time() if ts is None else ts,
            "clock_offset_s": None, "heartbeat_s": heartbeat_s,
            "ius": {iu: {"score": s, "level": 0, "status": "passing", "reason": "",
                         "components": {"prefill_tps": prefill_tps, "request_cost_s": 0.05}}
                    for iu, s in scores.items()}}


def typed(body: dict) -> ScoreBody:
    """``body`` as an agent hands it to its HTTP server: typed, but without the reader's checks (the tests
    push nonsense scores on purpose)."""
    ius = {iu: IUScore(score=e["score"], status=e["status"], reason=e["reason"], level=e["level"],
                       components=e["components"]) for iu, e in body["ius"].items()}
    return ScoreBody(**{**body, "ius": ius})


class Pool:
    """``nodes`` x ``ius_per_node`` simulated IUs registered in Consul; an AgentHttpServer per node."""

    def __init__(self, consul_addr: str, nodes: int = 2, ius_per_node: int = 1, agents: bool = True,
                 iu_api_key: str | None = None):
        self.io = ConsulIO(consul_addr)
        self.consul_addr = consul_addr
        self.agent_port = free_port()
        self.nodes: dict[str, str] = {}  # node -> address
        self.ius: dict[str, SimulatedIU] = {}
        self.agents: dict[str, AgentHttpServer] = {}
        for n in range(nodes):
            node, address = f"n{n}", f"127.0.200.{n + 1}"
            self.nodes[node] = address
            for i in range(ius_per_node):
                sim = SimulatedIU(address, 0, arrival_rate=0, api_key=iu_api_key).start()
                iu_id = f"{node}-iu{i}"
                self.ius[iu_id] = sim
                self.register(IUService(iu_id, node, "r1", address, int(sim.address.rsplit(":", 1)[1]), (i,), 0))
            if agents:
                self.agents[node] = AgentHttpServer(address, self.agent_port, AgentMetrics())
                self.agents[node].start()

    def node_of(self, iu_id: str) -> str:
        return iu_id.split("-", 1)[0]

    def register(self, service: IUService) -> None:
        """The IU on its own catalog node (one Consul stands in for every node's agent here)."""
        register_on_catalog_node(self.io, service, self.nodes.get(service.node, service.address))

    def maintenance(self, iu_id: str, reason: str) -> None:
        """Consul's maintenance mode as the IU's node agent syncs it: the critical check
        ``_service_maintenance:<id>`` on the service."""
        check = {"CheckID": layout.maintenance_check(iu_id), "Name": "Service Maintenance Mode", "Status": "critical",
                 "Notes": reason, "ServiceID": iu_id}
        node = self.node_of(iu_id)
        assert self.io.client.catalog.register(node, self.nodes[node], check=check, token=self.io.token)

    def publish_kv(self, node: str, scores: dict, **kwargs) -> None:
        key = f"clusterctl/eas/dc1/{node}"
        index, _ = self.io.kv_read(key)
        assert self.io.kv_cas_write(key, json.dumps(body_of(node, scores, **kwargs)), index) is not None

    def push(self, node: str, scores: dict, **kwargs) -> None:
        self.agents[node].set_scores(typed(body_of(node, scores, **kwargs)))

    def stop(self) -> None:
        for sim in self.ius.values():
            sim.stop()
        for agent in self.agents.values():
            agent.stop()


class RunningEdge:
    """The edge on its own event loop thread (as ``eas-edge`` runs it), for synchronous tests."""

    def __init__(self, config: EdgeConfig):
        if config.access.admin_listen == DEFAULT_ADMIN_LISTEN:  # one fixed port: two tests at once collide
            host = config.listen.rsplit(":", 1)[0]
            config = replace(config, access=replace(config.access, admin_listen=f"{host}:0"))
        self.edge = Edge(config)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-edge", daemon=True)
        self.thread.start()
        self.address = self.call(self.edge.start())

    def call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def state(self):
        return self.edge.state

    def url(self, path: str) -> str:
        scheme = "https" if self.edge.config.access.tls else "http"
        return f"{scheme}://{self.address}{path}"

    def admin_url(self, path: str) -> str:
        return f"http://{self.edge.admin_address}{path}"

    def drain(self) -> None:
        self.call(self.edge.drain(), timeout=60)

    def close(self) -> None:
        if not self.edge.stopped.is_set():
            self.call(self.edge.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def edge_config(pool: Pool, **overrides) -> EdgeConfig:
    base = EdgeConfig(listen="127.0.0.1:0", consul=replace(EdgeConfig().consul, address=pool.consul_addr),
                      push=PushConfig(agent_port=pool.agent_port, wait_s=2.0, apply_interval_s=0.01),
                      queue_timeout_s=2.0, seed=1, access=AccessConfig(admin_listen="127.0.0.1:0"),
                      debug_headers=True)
    push = overrides.pop("push", None)
    return replace(base, **overrides, **({"push": push} if push is not None else {}))


@contextmanager
def running_edge(pool: Pool, **overrides):
    edge = RunningEdge(edge_config(pool, **overrides))
    try:
        yield edge
    finally:
        edge.close()


def post(url: str, body, timeout: float = 30.0, headers: dict | None = None,
         context=None) -> tuple[int, dict, bytes]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def stream(url: str, body: dict, timeout: float = 30.0) -> tuple[int, dict, list[tuple[float, bytes]]]:
    """POST a streaming request; (status, headers, [(arrival time, line)]) read line by line as it comes."""
    data = json.dumps({**body, "stream": True}).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    lines = []
    try:
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            for line in answer:
                if line.strip():
                    lines.append((time.monotonic(), line.strip()))
            return answer.status, dict(answer.headers), lines
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), [(time.monotonic(), exc.read())]


# the edge's loops run every 20 ms: poll at that pace
wait_for = functools.partial(shared_wait_for, interval=0.02)


def metric(edge: RunningEdge, name: str, labels: str = "") -> float:
    """One sample of the edge's /metrics (0 when absent)."""
    with urllib.request.urlopen(edge.admin_url("/metrics"), timeout=5) as answer:
        text = answer.read().decode()
    prefix = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(prefix + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


class ScriptedIU:
    """An IU stand-in (aiohttp, its own loop thread) answering ``POST /v1/*`` with ``handler``; registered
    in Consul as ``iu_id`` on ``address``. ``seen`` holds (monotonic time, body) per request received,
    ``cancelled`` the times a request's connection closed before its answer was complete."""

    def __init__(self, pool: Pool, iu_id: str, address: str, handler, model: str | None = None):
        self.seen: list[tuple[float, dict]] = []
        self.cancelled: list[float] = []
        self.healthy = True  # GET /health: 200, else 503

        async def entry(request):
            self.seen.append((time.monotonic(), json.loads(await request.read())))
            try:
                return await handler(request)
            except asyncio.CancelledError:
                self.cancelled.append(time.monotonic())
                raise

        async def health(request):
            return web.Response(status=200 if self.healthy else 503)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_post("/v1/completions", entry)
        app.router.add_post("/v1/chat/completions", entry)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"scripted-{iu_id}", daemon=True)
        self.thread.start()
        self.runner = web.AppRunner(app, handler_cancellation=True)

        async def start():
            await self.runner.setup()
            site = web.TCPSite(self.runner, address, 0)
            await site.start()
            return site._server.sockets[0].getsockname()[1]

        self.port = asyncio.run_coroutine_threadsafe(start(), self.loop).result(10)
        declared = {"model": model} if model else {}
        pool.register(IUService(iu_id, iu_id.split("-")[0], "r1", address, self.port, (0,), 0, **declared))

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def sse_chunks(count: int, every_s: float, stall_after: int | None = None, stall_s: float = 0.0):
    """A stand-in IU handler streaming ``count`` SSE events ``every_s`` apart (silent for ``stall_s`` after
    ``stall_after`` of them), then ``[DONE]``."""

    async def handler(request):
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for n in range(count):
            if n == stall_after:
                await asyncio.sleep(stall_s)
            await response.write(b'data: {"choices": [{"text": "tok"}]}\n\n')
            await asyncio.sleep(every_s)
        await response.write(b"data: [DONE]\n\n")
        return response

    return handler


@contextmanager
def scripted_pool(consul_addr, *scripts):
    """A pool of only the stand-ins ``(iu_id, handler[, model])``, on 127.0.200.9 and up."""
    pool = Pool(consul_addr, nodes=0, agents=False)
    ius = [ScriptedIU(pool, script[0], f"127.0.200.{9 + n}", *script[1:]) for n, script in enumerate(scripts)]
    try:
        yield pool, ius
    finally:
        for iu in ius:
            iu.stop()
        pool.stop()
