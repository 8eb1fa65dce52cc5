"""``DevConsulServer``: a development server that follows Consul's HTTP API. It is not Consul.

    from devconsul.server import DevConsulServer
    with DevConsulServer(addr="127.0.0.1:0", data_dir=None, acl_token=None) as server:
        server.address  # "127.0.0.1:PORT"

One node, one datacenter ("dc1"), the node is its own leader. Standard-library HTTP server with one
daemon thread per connection (HTTP/1.1 keep-alive); blocking queries park on the change feed.
``start`` returns once the socket listens; ``stop`` wakes parked queries, closes open connections,
stops the check runner and the persister, and joins their threads.

Limits (a hostile or careless client must not exhaust memory, threads or disk, or lose an acknowledged write):

- HTTP framing: request bodies bounded before they are read, the ACL decision made from the headers,
  socket timeouts and at most ``max_connections`` connections: :mod:`devconsul.http_server`;
- at most ``max_blocking_per_client`` blocking queries per client address are parked (the next is a
  429), and an anonymous query under ACLs never parks (it is answered at once, filtered to nothing);
- the KV store holds at most ``max_kv_bytes`` / ``max_kv_keys`` (a 413 beyond);
- a KV or catalog write whose state could not be written to the data directory is rolled back and
  answered 500 "not applied"; while the data directory stays unwritable every write is refused (500, not
  applied) before it is applied. (The server's own membership events are answered "not durable" and stay
  applied: the next heartbeat repeats them.)

The timing knobs default to Consul's values; tests shorten them: ``check_update_interval`` (5 min, how
long an output-only check change waits before reaching the catalog), ``check_reap_interval`` (30 s)
and ``check_deregister_interval_min`` (1 min, the floor of DeregisterCriticalServiceAfter).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from devconsul import persist
from devconsul.acl import ALLOW_ALL, AclError, AclStore
from devconsul.agent import AgentTokens, token_for
from devconsul.agentconfig import AgentSettings
from devconsul.agentlink import AgentLink
from devconsul.catalog import Catalog
from devconsul.checks import CheckRunner
from devconsul.http_server import CONNECTION_TIMEOUT_S, MAX_CONNECTIONS, Handler, HTTPServer
from devconsul.httpapi import ApiError, ReadCache
from devconsul.kvstore import DEFAULT_MAX_BYTES, DEFAULT_MAX_KEYS, KVStore
from devconsul.remote import FAILURE_TIMEOUT_S, Membership, RemoteCatalog
from devconsul.state import State
from devconsul.watch import Topic

log = logging.getLogger("devconsul")
MAX_BLOCKING_PER_CLIENT = 512


class DevConsulServer:
    def __init__(
        self,
        addr: str = "127.0.0.1:8500",
        data_dir: str | Path | None = None,
        acl_token: str | None = None,
        node_name: str | None = None,
        check_update_interval: float = 300.0,
        check_reap_interval: float = 30.0,
        check_deregister_interval_min: float = 60.0,
        max_kv_bytes: int = DEFAULT_MAX_BYTES,
        max_kv_keys: int = DEFAULT_MAX_KEYS,
        max_connections: int = MAX_CONNECTIONS,
        max_blocking_per_client: int = MAX_BLOCKING_PER_CLIENT,
        connection_timeout_s: float = CONNECTION_TIMEOUT_S,
        agent: AgentSettings | None = None,
        ae_interval: float = 60.0,
        acl_enabled: bool | None = None,
        failure_timeout: float = FAILURE_TIMEOUT_S,
    ):
        host, _, port = addr.rpartition(":")
        self._bind = (host.strip("[]") or "127.0.0.1", int(port))
        self.data_dir = Path(data_dir) if data_dir else None
        if agent is None:  # the plain dev server: one node, its own leader; --acl-token-file turns ACLs on
            # (acl_enabled=True without a token: ACLs on and not bootstrapped, for PUT /v1/acl/bootstrap)
            agent = AgentSettings(node_name or socket.gethostname(), server=True, check_update_interval=check_update_interval,
                                  acl_enabled=bool(acl_token) if acl_enabled is None else acl_enabled,
                                  default_policy="deny",
                                  tokens={"initial_management": acl_token} if acl_token else {})
            self._rpc_bind = None
        else:
            self._rpc_bind = (agent.bind_addr, agent.server_port) if agent.server else None
        self.settings = agent
        self.is_server = agent.server
        self.acls_enabled = agent.acl_enabled
        self.gossip_key = agent.gossip_key
        self.state = State()
        self.kv = KVStore(self.state, max_kv_bytes, max_kv_keys)
        self.max_connections = max_connections
        self.max_blocking_per_client = max_blocking_per_client
        self.connection_timeout_s = connection_timeout_s
        self._blocking: dict[str, int] = {}  # client address -> parked blocking queries
        self._blocking_lock = threading.Lock()
        self.catalog = Catalog(self.state, agent.node_name, agent.check_update_interval, agent.bind_addr)
        self.runner = CheckRunner(self.state, self.catalog, check_reap_interval, check_deregister_interval_min)
        self.catalog.hooks = self.runner
        self.acl = (AclStore(self.state, agent.default_policy, agent.tokens.get("initial_management"))
                    if agent.server and agent.acl_enabled else None)
        self.agent_tokens = AgentTokens(agent.tokens, self.data_dir, agent.token_persistence, self._tokens_changed)
        self.remote = RemoteCatalog(self.catalog) if agent.server else None
        self.members = Membership(self, failure_timeout) if agent.server else None
        self.link = None if agent.server else AgentLink(self, agent, ae_interval)
        self.on_reload = None  # set by the consul stand-in: re-read the configuration
        self.on_leave = None
        self.read_cache = ReadCache()
        self._persister: persist.Persister | None = None
        self._httpd: HTTPServer | None = None
        self._rpc_httpd: HTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self.address = ""
        self.started_at = ""  # RFC 3339, autopilot's StableSince of this server

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> DevConsulServer:
        self._httpd = HTTPServer(self._bind, Handler, self)  # listens; served once the state is ready
        self.address = "{}:{}".format(*self._httpd.server_address[:2])
        self.started_at = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        try:
            snap = persist.load(self.data_dir) if self.data_dir and self.data_dir.exists() else None
            if snap is not None:
                self._restore(snap)
            elif self.is_server:
                self.catalog.bootstrap()
            if self.data_dir is not None:
                self.data_dir.mkdir(parents=True, exist_ok=True)
                self._persister = persist.Persister(self.state, self.data_dir, self._snapshot)
                self._persister.start()
                self._persister.flush()
        except BaseException:
            if self._persister is not None:
                self._persister.stop()
            self._httpd.server_close()
            self._httpd = None
            raise
        self.runner.start()
        self._serve_thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, name="devconsul-http", daemon=True
        )
        self._serve_thread.start()
        if self._rpc_bind is not None and self._rpc_bind != self._bind:
            # The server port (8300 on bind_addr) that client agents reach: the same API, standing in for RPC.
            self._rpc_httpd = HTTPServer(self._rpc_bind, Handler, self)
            threading.Thread(target=self._rpc_httpd.serve_forever, kwargs={"poll_interval": 0.05},
                             name="devconsul-rpc", daemon=True).start()
        if self.members is not None:
            self.members.start()
        if self.link is not None:
            self.link.start()
        log.info("devconsul %s listening on http://%s (data dir: %s, ACLs: %s)",
                 "server" if self.is_server else "client agent", self.address,
                 self.data_dir or "in memory", "on" if self.acls_enabled else "off")
        return self

    def stop(self, leave: bool | None = None) -> None:
        """Stop serving; a client agent first leaves the cluster when ``leave`` (default leave_on_terminate)."""
        if self._httpd is None:
            return
        if self.link is not None:
            self.link.stop(self.settings.leave_on_terminate if leave is None else leave)
        if self.members is not None:
            self.members.stop()
        if self._rpc_httpd is not None:
            self._rpc_httpd.shutdown()
            self._rpc_httpd.close_connections()
            self._rpc_httpd.server_close()
            self._rpc_httpd = None
        self.state.feed.close()
        self._httpd.shutdown()
        self._httpd.close_connections()
        self._httpd.server_close()
        self._httpd.join_threads(5)
        self._serve_thread.join(5)
        self.runner.stop()
        if self._persister is not None:
            self._persister.stop()
        self._httpd = None

    def __enter__(self) -> DevConsulServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- used by the endpoint modules -----------------------------------------------------------
    def refuse_if_not_durable(self) -> None:
        """Before a write is applied: while the data directory is unwritable, refuse it (not applied)."""
        problem = self._persister.problem if self._persister is not None else None
        if problem:
            raise ApiError(500, f"state cannot be written to the data directory ({problem}); the write was not applied")

    def finish_write(self, topics, rollback: Callable[[], list[Topic]] | None = None) -> None:
        """Publish a write to blocking queries, and return only once it is durable. A write that cannot be
        made durable is undone by ``rollback`` (called with the lock held; returns the topics it changed)
        and reported not applied. Without one (the server's own membership events, which the next
        heartbeat repeats) it is reported not durable."""
        topics = list(topics)
        version = self.state.commit(topics)
        if self.state.wait_durable(version):
            return
        if rollback is None:
            raise ApiError(500, "state could not be written to the data directory; the change is not durable")
        with self.state.lock:
            restored = rollback()
            self.state.touch()
        self.state.commit(restored)
        raise ApiError(500, "state could not be written to the data directory; the write was not applied")

    def catalog_write(self, apply: Callable[[], list[Topic]]) -> None:
        """Apply a write to this node's services and checks and make it durable, or undo it (500)."""
        with self.state.lock:  # an RLock: the catalog's own locking nests
            undo = self.catalog.begin_undo()
            topics = apply()
            self.catalog.end_undo(undo)
        self.finish_write(topics, lambda: self.catalog.rollback(undo))

    def blocking_slot(self, client: str):
        """Context manager: a parked blocking query of ``client``; 429 past ``max_blocking_per_client``."""
        return _BlockingSlot(self, client)

    @property
    def acl_token(self) -> str | None:
        """The management token of a plain dev server (``--acl-token-file``)."""
        return self.settings.tokens.get("initial_management")

    def default_acl_policy(self) -> str:
        """``X-Consul-Default-ACL-Policy``: ``allow`` without ACLs, else the configured default policy."""
        return str(self.settings.default_policy) if self.acls_enabled else "allow"

    def resolve_token(self, secret: str):
        """The authorizer of a request's token; without one the agent's ``default`` token, else anonymous."""
        if not self.acls_enabled:
            return ALLOW_ALL
        secret = secret or self.agent_tokens.get("default")
        return self.acl.resolve(secret) if self.acl is not None else self.link.resolve(secret)

    def local_synced(self, svc) -> bool:
        """Whether anti-entropy may write this server's own service into the catalog (its token's rights)."""
        if not self.acls_enabled or not svc.agent_local:
            return True
        try:
            return self.acl.resolve(token_for(self.agent_tokens, svc)).allowed("service", "write", svc.name)
        except AclError:
            return False

    def _tokens_changed(self) -> None:
        with self.state.lock:
            self.state.touch()
        self.acl_changed()

    def acl_changed(self) -> None:
        self.read_cache = ReadCache()  # cached reads were filtered with the old rules

    def members_api(self) -> list[dict]:
        return self.members.api() if self.members is not None else []

    def leader_address(self) -> str:
        return f"{self.settings.bind_addr}:{self.settings.server_port}" if self.is_server else ""

    def reload(self) -> None:
        if self.on_reload is not None:
            try:
                self.on_reload()
            except (OSError, ValueError) as exc:  # the configuration files; the running one stays
                raise ApiError(500, f"Failed reloading: {exc}") from None

    def request_leave(self) -> None:
        if self.on_leave is not None:
            self.on_leave()

    # -- persistence ----------------------------------------------------------------------------
    def _snapshot(self) -> dict:
        snap = {"index": self.state.index, "kv": self.kv.snapshot(), "catalog": self.catalog.snapshot()}
        if self.acl is not None:
            snap["acl"] = self.acl.snapshot()
        if self.remote is not None:
            snap["remote"] = self.remote.snapshot()
        return snap

    def _restore(self, snap: dict) -> None:
        with self.state.lock:
            self.state.index = snap["index"]
            self.kv.restore(snap["kv"])
            self.catalog.restore(snap["catalog"])
            if self.acl is not None and "acl" in snap:
                self.acl.restore(snap["acl"])
            if self.remote is not None and "remote" in snap:
                self.remote.restore(snap["remote"])


class _BlockingSlot:
    def __init__(self, dev: DevConsulServer, client: str):
        self.dev, self.client = dev, client

    def __enter__(self):
        dev = self.dev
        with dev._blocking_lock:
            held = dev._blocking.get(self.client, 0)
            if held >= dev.max_blocking_per_client:
                raise ApiError(429, f"too many blocking queries from {self.client} ({held}, limit "
                               f"{dev.max_blocking_per_client})")
            dev._blocking[self.client] = held + 1
        return self

    def __exit__(self, *exc):
        dev = self.dev
        with dev._blocking_lock:
            left = dev._blocking.get(self.client, 1) - 1
            if left > 0:
                dev._blocking[self.client] = left
            else:
                dev._blocking.pop(self.client, None)
