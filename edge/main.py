"""``eas-edge``: run the edge until SIGTERM/SIGINT, then drain.

    eas-edge --config /etc/eas-edge/edge.yml
    eas-edge --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 --agent-port 9105
    eas-edge --config /etc/eas-edge/edge.yml --announce-key-file /etc/eas-edge/announce.key

Flags override the file's fields. Start-up reads Consul once: if it cannot be reached the edge exits 2
with one line naming the address (an edge that starts blind would only answer 503); an unusable announce
key file is one line naming ``announce.key_file`` and exit 2 too. Later Consul outages
keep the last view (and pushed scores) and fail open once scores are stale. Shutdown (SIGTERM, systemd's
stop): the listener closes (``/healthz`` says draining first, so a load balancer stops sending) and kept-alive
client connections end (idle ones at once, busy ones after their answer: a balancer's next request then opens
a connection, which goes to another edge), in-flight requests and streams get ``drain_timeout_s`` to finish,
then the rest is cut; the announcements still queued are sent (waiting at most a second) before the
connections close.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import signal
import sys
import time

import aiohttp
from aiohttp import web

from consul_io.client import ConsulIO, ConsulUnavailable
from eas_wire.fields import split_hostport
from edge.access_config import is_loopback
from edge.admin import make_admin_app
from edge.announce import AnnounceSender, edge_id
from edge.auth import Authenticator
from edge.config import EVENT_LOOPS, ConfigError, EdgeConfig, load_edge_config
from edge.feed import AgentFeed, EdgeView
from edge.limits import CappedSite, connection_cap, quiet_malformed_heads, raise_fd_limit
from edge.metrics import EdgeMetrics
from edge.pool import ConsulWatcher
from edge.pool.prefix import PrefixIndex
from edge.proxy import EdgeState, make_app
from edge.rollout import RolloutFollower
from edge.routing import Router

log = logging.getLogger("edge")
HEAD_LINE_BYTES = 8190  # the longest request line and header field (aiohttp's defaults, stated here)


class StartupError(Exception):
    pass


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="eas-edge", description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Examples:\n  eas-edge --config /etc/eas-edge/edge.yml\n"
               "  eas-edge --listen 127.0.0.1:8080 --consul 127.0.0.1:8500 --agent-port 9105")
    parser.add_argument("--config", help="YAML config file (edge/config.py lists every field)")
    parser.add_argument("--listen", help="HOST:PORT for clients (default 127.0.0.1:8080)")
    parser.add_argument("--admin-listen", help="HOST:PORT for /metrics (default 127.0.0.1:9180)")
    parser.add_argument("--consul", dest="consul_address", help="Consul HOST:PORT (default 127.0.0.1:8500)")
    parser.add_argument("--datacenter", help="Consul datacenter of the score keys (default dc1)")
    parser.add_argument("--agent-port", type=int, help="port of eas-agent's /scores on every node (9105)")
    parser.add_argument("--no-push", action="store_true", help="scores from Consul only (no agent feeds)")
    parser.add_argument("--announce-key-file", metavar="PATH",
                        help="announce each request to its node agent, signed with the private key in PATH "
                             "(0600; needs push)")
    parser.add_argument("--max-inflight-per-iu", type=int, metavar="N",
                        help="this edge's requests in flight per IU; more wait in the queue (default 64)")
    parser.add_argument("--max-queue", type=int, metavar="N",
                        help="requests waiting for a slot, oldest first; beyond it 429 with Retry-After (default 512)")
    parser.add_argument("--drain-timeout-s", type=float, metavar="SECONDS",
                        help="on SIGTERM: stop accepting and let streams finish this long (default 30)")
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, help="asyncio (default) or uvloop (if installed)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"),
                        help="the journal's level (default info)")
    return parser.parse_args(argv)


def config_from(args: argparse.Namespace) -> EdgeConfig:
    return load_edge_config(args.config, {
        "listen": args.listen, "admin_listen": args.admin_listen, "consul.address": args.consul_address, "datacenter": args.datacenter,
        "push.agent_port": args.agent_port, "push.enabled": False if args.no_push else None,
        "announce.key_file": args.announce_key_file,
        "max_inflight_per_iu": args.max_inflight_per_iu, "max_queue": args.max_queue,
        "drain_timeout_s": args.drain_timeout_s, "event_loop": args.event_loop,
    })


class Edge:
    """The running edge: Consul watcher threads, the agent feeds and the HTTP server on one event loop."""

    def __init__(self, config: EdgeConfig):
        self.config = config
        view = EdgeView()
        rng = random.Random(config.seed)
        prefix = PrefixIndex() if config.prefix_routing else None
        router = Router(rng, config.max_inflight_per_iu, config.eject_s, announcing=config.announce.enabled,
                        prefix=prefix)
        self.state = EdgeState(config, view, router, EdgeMetrics())
        self.state.rollout = RolloutFollower(config.datacenter, self.state.metrics.registry)
        self.state.metrics.watch(self.state)
        self.runner: web.AppRunner | None = None
        self.site: CappedSite | None = None
        self.admin_runner: web.AppRunner | None = None
        self.admin_address: str | None = None
        self.stopped = asyncio.Event()
        self.busy: set = set()  # client connections with a request in progress (aiohttp RequestHandler)

    def connect_consul(self) -> None:
        c = self.config.consul
        token = c.read_token(self.config.source)
        try:
            io = ConsulIO(c.address, token=token, scheme=c.scheme, ca_file=c.ca_file)
        except ConsulUnavailable as exc:  # nothing is contacted here: the address contradicts the scheme
            raise ConfigError(self.config.source, "consul.address", str(exc)) from None
        watcher = ConsulWatcher(self.state.view, io, kv_prefix=c.kv_prefix, dc=self.config.datacenter)
        rollout = self.state.rollout
        try:
            watcher.refresh_once()
            # the split is known before the first request: an edge that may not read it does not serve
            rollout.apply_kv(io.kv_entry(rollout.key)[1])
        except ConsulUnavailable as exc:
            raise StartupError(f"cannot reach Consul at {c.address} (consul.address): {exc}") from exc
        self.state.watcher = watcher.start()
        watcher.follow(lambda i: io.kv_entry(rollout.key, index=i, wait_s=watcher.wait_s), rollout.apply_kv,
                       "eas-watch-rollout")

    async def start(self) -> str:
        """Connect, start feeds and listen; returns the listening HOST:PORT."""
        announce, access, source = self.config.announce, self.config.access, self.config.source
        key = announce.read_key(source) if announce.enabled else None
        # every secret and the certificate are read before anything connects: a bad file is exit 2 at once
        keys = access.read_keys(source)
        upstream_key = access.read_upstream_key(source)
        tls = access.ssl_context(source)
        if keys is not None:
            self.state.auth = Authenticator(keys, self.state.metrics.registry)
        if upstream_key is not None:
            self.state.upstream_headers = {"Authorization": f"Bearer {upstream_key}"}
        self.connect_consul()
        timeout = aiohttp.ClientTimeout(total=self.config.upstream_timeout_s,
                                        sock_connect=self.config.connect_timeout_s)
        # no per-host limit: the per-IU cap is the edge's own (max_inflight_per_iu), enforced before connecting;
        # no cookie jar: a proxy must not keep one client's Set-Cookie and send it on other clients' requests
        self.state.session = aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0),
                                                   auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar())
        if self.config.push.enabled:
            push = self.config.push
            self.state.feed = AgentFeed(self.state.view, self.state.session, push.agent_port, wait_s=push.wait_s,
                                        apply_interval_s=push.apply_interval_s, key=key).start()
        if key is not None:  # a new id per start: a restarted edge never matches an old acknowledgement
            self.state.view.edge_id = edge_id(key, announce.edge_name)
            self.state.announcer = AnnounceSender(self.state.session, self.state.router.ledger,
                                                  self.state.view.edge_id, key, batch_s=announce.batch_ms / 1000,
                                                  rtt=self.state.metrics.announce_rtt.observe)
        # a client that leaves cancels its handler: the IU's connection closes (the engine aborts the
        # request) or the request leaves the queue unsent; request heads are bounded by aiohttp's line and
        # field sizes, idle kept-alive connections by keepalive_timeout; a refused head's bytes stay out of the log
        quiet_malformed_heads()
        app = make_app(self.state)
        app.middlewares.insert(0, self._track_busy)
        self.runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                                    shutdown_timeout=self.config.drain_timeout_s,
                                    keepalive_timeout=self.config.keepalive_timeout_s,
                                    max_line_size=HEAD_LINE_BYTES, max_field_size=HEAD_LINE_BYTES)
        await self.runner.setup()
        self.state.bodies.start()
        cap = connection_cap(self.config.max_connections, raise_fd_limit())
        self.site = CappedSite(self.runner, *self.config.listen_hostport, max_connections=cap,
                               header_timeout_s=self.config.header_timeout_s, awaiting_head=self.state.awaiting_head,
                               ssl_context=tls)
        try:
            await self.site.start()
            self.admin_address = await self._start_admin()
        except OSError as exc:
            await self.close()
            raise StartupError(f"cannot listen on {self.config.listen} (listen) or {access.admin_listen} "
                               f"(admin_listen): {exc.strerror or exc}") from exc
        host, port = self.runner.addresses[0][:2]
        return f"{host}:{port}"

    async def _start_admin(self) -> str:
        """/metrics on its own listener (edge.admin); returns its HOST:PORT."""
        self.admin_runner = web.AppRunner(make_admin_app(self.state.metrics.registry), access_log=None)
        await self.admin_runner.setup()
        host, port = split_hostport(self.config.access.admin_listen)
        await web.TCPSite(self.admin_runner, host, port).start()
        admin_host, admin_port = self.admin_runner.addresses[0][:2]
        return f"{admin_host}:{admin_port}"

    async def drain(self) -> None:
        """Stop accepting, let in-flight requests finish (up to drain_timeout_s), then close everything."""
        state = self.state
        state.draining = True
        if self.site is not None:
            await self.site.stop()  # the listener closes; accepted connections keep being served
        self._end_keepalive()
        deadline = time.monotonic() + self.config.drain_timeout_s
        while state.active and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if state.active:
            log.warning("drain timeout: cutting %d requests still in flight", state.active)
        await self.close()

    def _end_keepalive(self) -> None:
        """Kept-alive client connections end: idle ones now, busy ones after their answer (``_track_busy``).
        A load balancer reuses its connections to an edge, and a request it sent on one to this draining edge
        would be answered 503 ("draining"); on a connection of its own it goes to another edge. A busy one is
        not closed now: a closing connection reads no more bytes, and a request whose body is still arriving
        would never get it. (A request whose head arrived in the instant before, not yet handled, sees its
        connection close unanswered, which a balancer retries elsewhere: HAProxy's retry-on empty-response.)"""
        server = self.runner.server if self.runner is not None else None
        for connection in list(server.connections if server is not None else ()):
            if connection not in self.busy:
                connection.force_close()

    @web.middleware
    async def _track_busy(self, request: web.Request, handler):
        """The connections with a request in progress (outermost middleware: from the request's head on);
        during a drain each is closed once its answer is done."""
        connection = request.protocol
        self.busy.add(connection)
        try:
            return await handler(request)
        finally:
            self.busy.discard(connection)
            if self.state.draining:
                connection.close()

    async def close(self) -> None:
        if self.state.feed is not None:
            await self.state.feed.stop()
        if self.state.announcer is not None:  # before the session closes: its queued batches use it
            await self.state.announcer.close()
        if self.state.watcher is not None:
            self.state.watcher.stop()
        if self.runner is not None:
            await self.runner.cleanup()
        if self.admin_runner is not None:
            await self.admin_runner.cleanup()
        if self.state.session is not None:
            await self.state.session.close()
        self.state.bodies.close()
        self.stopped.set()


async def serve(config: EdgeConfig, ready=None) -> None:
    edge = Edge(config)
    address = await edge.start()
    # handlers before the announcement: a SIGTERM right after "listening" drains instead of killing
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    announcing = f", announcing as {edge.state.view.edge_id}" if edge.state.announcer is not None else ""
    scheme = "https" if config.access.tls else "http"
    auth = "keys" if edge.state.auth is not None else "none (auth: none)" if config.access.auth_none else "none"
    log.info("eas-edge listening on %s://%s (client keys %s, push %s%s, event loop %s); admin on http://%s",
             scheme, address, auth, "on" if config.push.enabled else "off", announcing,
             type(loop).__module__.split(".")[0], edge.admin_address)
    if not config.access.tls and not is_loopback(config.listen_hostport[0]):
        log.warning("clients reach %s over plain HTTP: their API keys and prompts cross the network in clear "
                    "(set tls.cert_file and tls.key_file)", config.listen)
    print(f"eas-edge listening on {scheme}://{address}", flush=True)
    print(f"eas-edge admin on http://{edge.admin_address} (/metrics)", flush=True)
    if ready is not None:
        ready(edge, address)
    await stop.wait()
    log.info("draining (up to %.0f s)", config.drain_timeout_s)
    await edge.drain()


def loop_factory(config: EdgeConfig):
    """The event loop ``event_loop`` names: asyncio's own (the default) or uvloop, which is not a dependency
    of the edge. Measured side by side (docs/decisions/0005-uvloop-optional.md), uvloop takes 12-20% less CPU
    per stream in a bare aiohttp hop but changed neither the edge's CPU nor its added first-byte p99 beyond
    the run-to-run noise on the 2-core bench host: an option to measure on real hardware, not a default."""
    if config.event_loop == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        raise ConfigError(config.source, "event_loop", "uvloop is not installed (pip install uvloop, "
                          "or set event_loop: asyncio)") from None
    return uvloop.new_event_loop


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config = config_from(args)
        with asyncio.Runner(loop_factory=loop_factory(config)) as runner:
            runner.run(serve(config))
    except (ConfigError, StartupError) as exc:
        print(f"eas-edge: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
