"""The edge's config file (YAML) and command-line overrides.

    listen: 0.0.0.0:8080          # where clients connect (OpenAI-compatible API, /healthz); not loopback:
                                  # needs auth (edge/access_config.py: auth, tls, admin_listen,
                                  # upstream_api_key_file)
    datacenter: dc1
    consul:                       # same block as the agent's config (consul_io.config)
      address: 127.0.0.1:8500
      scheme: http                # or https with ca_file
      token_file: /etc/eas-edge/consul.token   # 0600; the token never goes on a command line
      kv_prefix: clusterctl/eas
    push:                         # fresh scores: one stream per node from the agent's /scores?stream=1
      enabled: true
      agent_port: 9105            # eas_agent_listen's port; the agent must listen on the node's address
      wait_s: 10                  # a stream silent this long past the agent's 5 s heartbeat is reopened;
                                  # agents without streams: how long one blocking query waits
      apply_interval_s: 0.02      # pushed bodies are folded into the view at most this often
    announce:                     # tell each request to its IU's node agent (edge/announce.py); needs push
      key_file: null              # this edge's Ed25519 private key (0600, one word: base64 of the 32-byte
                                  # seed; the vault's eas_edge_announce_private_key, its public key in the
                                  # inventory's eas_edge_public_keys); null: announcing off
      batch_ms: 10                # a node's announcements leave at the edge's next tick of this (1-1000)
      edge_name: null             # this edge's id is <edge_name>.<key id>.<8 hex drawn at each start>
                                  # (null: host name)
    max_inflight_per_iu: 64       # this edge's requests in flight per IU; more wait in the queue
    max_queue: 512                # requests waiting for a slot (oldest first); beyond: 429 + Retry-After
    queue_timeout_s: 5            # a longer wait: 429 + Retry-After (the predicted wait)
    retry_after_s: 1              # the Retry-After of a 503 (no routable IU)
    connect_timeout_s: 1          # to an IU
    max_attempts: 3               # IUs tried for a request failing before its first byte (edge/upstream.py)
    stream_stall_s: 3             # a resumable stream silent this long is resumed on another IU
    upstream_timeout_s: 600       # a whole non-streamed answer (its first byte comes at its end)
    stream_idle_timeout_s: 60     # a stream silent this long is cut and its IU ejected (no total limit)
    max_connections: 4096         # open client connections; beyond: 503 and closed (lowered to fit the
                                  # descriptor limit, whose soft value is raised to the hard one at start)
    header_timeout_s: 10          # a new connection's first request head must arrive within this
    keepalive_timeout_s: 75       # an idle kept-alive client connection is closed after this
    max_body_bytes: 8388608       # request bodies; beyond: 413 (a 128k-token prompt as token ids ~1 MiB)
    eject_s: 2                    # an ejected IU's backoff, doubled once by a failed probe (edge/ejection.py)
    prefix_routing: true          # cost a request's prompt prefix cached on an IU as no prefill there
                                  # (edge/pool/prefix.py); false: every prompt costs its full prefill
    drain_timeout_s: 30           # on SIGTERM: stop accepting, let streams finish this long
    seed: null                    # RNG of pick()'s sampling (null: from the OS)
    event_loop: asyncio           # or uvloop (pip install uvloop; exit 2 without it);
                                  # docs/decisions/0005-uvloop-optional.md
    debug_headers: false          # true: answers carry X-Eas-IU (the internal IU id that served them)
    rollout_request_key: signalled  # under a rollout, which requests without a session key are placed by
                                  # their own key (credential, endpoint, Idempotency-Key or body), so a
                                  # client's retry meets the same revision: signalled (those that carry
                                  # Idempotency-Key or x-stainless-retry-count), always, or never (the
                                  # credit counter for all: an exact share); edge/rollout.py

Every field is optional. Errors name the file and the field (``edge.yml: push.agent_port: ...``); the field
reader (eas_wire.fields) and the Consul block (consul_io.config) are the agent config's too, so both files
read and fail alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# The field reader and Consul block the agent's config uses too: one reading of these fields, not a copy.
from consul_io import layout
from consul_io.client import TokenError, read_token_file
from consul_io.config import ConsulConfig, load_consul
from eas_wire.fields import ConfigError, Fields, address, read_yaml, split_hostport
from eas_wire.signing import Ed25519PrivateKey, load_private
from edge.access_config import ACCESS_FIELDS, AccessConfig, load_access

EVENT_LOOPS = ("asyncio", "uvloop")  # the edge's event loop (edge.main.loop_factory)
REQUEST_KEY_USES = ("signalled", "always", "never")  # rollout_request_key (edge.rollout.placement_of)
__all__ = ["AccessConfig", "AnnounceConfig", "ConfigError", "EVENT_LOOPS", "EdgeConfig", "PushConfig", "load_edge_config",
           "parse_edge_config"]


@dataclass(frozen=True)
class PushConfig:
    enabled: bool = True
    agent_port: int = 9105
    wait_s: float = 10.0
    apply_interval_s: float = 0.02


@dataclass(frozen=True)
class AnnounceConfig:
    key_file: str | None = None  # None: announcing off
    batch_ms: float = 10.0
    edge_name: str | None = None  # None: the host name

    @property
    def enabled(self) -> bool:
        return self.key_file is not None

    def read_key(self, config_path: str | Path = "<config>") -> Ed25519PrivateKey:
        """This edge's signing key, read at start-up by the token file rules (consul_io.client.read_token_file:
        0600, one word) and never logged."""
        try:
            return load_private(read_token_file(self.key_file, kind="announce key"))
        except (TokenError, ValueError) as exc:
            raise ConfigError(config_path, "announce.key_file", str(exc)) from None


@dataclass(frozen=True)
class EdgeConfig:
    listen: str = "127.0.0.1:8080"
    datacenter: str = layout.DEFAULT_DATACENTER
    consul: ConsulConfig = field(default_factory=ConsulConfig)
    push: PushConfig = field(default_factory=PushConfig)
    announce: AnnounceConfig = field(default_factory=AnnounceConfig)
    access: AccessConfig = field(default_factory=AccessConfig)
    max_inflight_per_iu: int = 64
    max_queue: int = 512
    queue_timeout_s: float = 5.0
    retry_after_s: float = 1.0
    connect_timeout_s: float = 1.0
    max_attempts: int = 3
    stream_stall_s: float = 3.0
    upstream_timeout_s: float = 600.0
    stream_idle_timeout_s: float = 60.0
    max_connections: int = 4096
    header_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    max_body_bytes: int = 8 * 1024 * 1024
    # 2 s, not longer: an IU comes back only after the edge's own GET /health probe answers
    # (edge/ejection.py), so a short backoff costs a still-dead IU one probe, not a client request, and a
    # restarted engine is back in rotation within 2 x eject_s (docs/decisions/0018-edge-eject-backoff.md)
    eject_s: float = 2.0
    prefix_routing: bool = True
    drain_timeout_s: float = 30.0
    seed: int | None = None
    event_loop: str = "asyncio"
    debug_headers: bool = False  # X-Eas-IU names internal IU ids: for an operator, not for clients
    rollout_request_key: str = "signalled"  # which requests without a session key their own key places
    source: str = "<flags>"

    def __post_init__(self):
        # One check for every way a config is made (a file, flags, code): acknowledgements come in pushed
        # bodies only, so announcing without the push feed would only double count.
        if self.announce.enabled and not self.push.enabled:
            raise ConfigError(self.source, "announce.key_file", "announcing needs the push feed "
                              "(push.enabled: true): the agents acknowledge announcements in their pushed "
                              "bodies only")
        self.access.check_listen(self.listen, self.source)

    @property
    def listen_hostport(self) -> tuple[str, int]:
        return split_hostport(self.listen)


def _count(f: Fields, key: str, default: int, minimum: int) -> int:
    value = f.get(key, int, default)
    if value < minimum:
        raise f.fail(key, f"must be >= {minimum}, got {value}")
    return value


def _port(f: Fields, key: str, default: int) -> int:
    value = f.get(key, int, default)
    if not 1 <= value <= 65535:
        raise f.fail(key, f"expected a TCP port 1-65535, got {value}")
    return value


def _load_push(path: str | Path, data: Any) -> PushConfig:
    f = Fields(path, data if data is not None else {}, "push")
    f.unknown({"enabled", "agent_port", "wait_s", "apply_interval_s"})
    return PushConfig(
        enabled=f.get("enabled", bool, True),
        agent_port=_port(f, "agent_port", 9105),
        wait_s=f.positive("wait_s", 10.0),
        apply_interval_s=f.positive("apply_interval_s", 0.02),
    )


def _load_announce(path: str | Path, data: Any) -> AnnounceConfig:
    f = Fields(path, data if data is not None else {}, "announce")
    f.unknown({"key_file", "batch_ms", "edge_name"})
    key_file = f.get("key_file", str, None)
    if key_file == "":
        raise f.fail("key_file", "empty path (null turns announcing off)")
    batch_ms = f.get("batch_ms", float, 10.0)
    if not 1.0 <= batch_ms <= 1000.0:
        raise f.fail("batch_ms", f"must be 1-1000 (milliseconds), got {batch_ms:g}")
    return AnnounceConfig(key_file=key_file, batch_ms=batch_ms, edge_name=f.get("edge_name", str, None))


def parse_edge_config(data: Any, path: str | Path = "<config>") -> EdgeConfig:
    f = Fields(path, data if data is not None else {}, "")
    f.unknown({"listen", "datacenter", "consul", "push", "announce", "max_inflight_per_iu", "max_queue", "queue_timeout_s",
               "retry_after_s", "connect_timeout_s", "upstream_timeout_s", "eject_s", "drain_timeout_s", "seed",
               "event_loop", "stream_idle_timeout_s", "max_connections", "header_timeout_s", "keepalive_timeout_s",
               "max_body_bytes", "debug_headers", "prefix_routing", "max_attempts", "stream_stall_s",
               "rollout_request_key"}
              | ACCESS_FIELDS)
    return EdgeConfig(
        listen=address(f, "listen", "127.0.0.1:8080"),
        datacenter=f.get("datacenter", str, layout.DEFAULT_DATACENTER),
        consul=load_consul(path, f.data.get("consul")),
        push=_load_push(path, f.data.get("push")),
        announce=_load_announce(path, f.data.get("announce")),
        access=load_access(f),
        max_inflight_per_iu=_count(f, "max_inflight_per_iu", 64, 1),
        max_queue=_count(f, "max_queue", 512, 0),
        queue_timeout_s=f.positive("queue_timeout_s", 5.0),
        retry_after_s=f.positive("retry_after_s", 1.0),
        connect_timeout_s=f.positive("connect_timeout_s", 1.0),
        max_attempts=_count(f, "max_attempts", 3, 1),
        stream_stall_s=f.positive("stream_stall_s", 3.0),
        upstream_timeout_s=f.positive("upstream_timeout_s", 600.0),
        stream_idle_timeout_s=f.positive("stream_idle_timeout_s", 60.0),
        max_connections=_count(f, "max_connections", 4096, 1),
        header_timeout_s=f.positive("header_timeout_s", 10.0),
        keepalive_timeout_s=f.positive("keepalive_timeout_s", 75.0),
        max_body_bytes=_count(f, "max_body_bytes", 8 * 1024 * 1024, 1024),
        eject_s=f.positive("eject_s", 2.0),
        prefix_routing=f.get("prefix_routing", bool, True),
        drain_timeout_s=f.positive("drain_timeout_s", 30.0),
        seed=f.get("seed", int, None),
        event_loop=f.choice("event_loop", EVENT_LOOPS, "asyncio"),
        debug_headers=f.get("debug_headers", bool, False),
        rollout_request_key=f.choice("rollout_request_key", REQUEST_KEY_USES, "signalled"),
        source=str(path),
    )


def load_edge_config(path: str | Path | None, overrides: dict | None = None) -> EdgeConfig:
    """The file (or the defaults without one), then the flags that were given (``None`` = not given).

    Overrides use the file's field names (``push.agent_port``) and go through the same validation."""
    data: dict = {}
    if path is not None:
        data = read_yaml(path) or {}
        if not isinstance(data, dict):
            raise ConfigError(path, "(top level)", f"expected a mapping, got {type(data).__name__}")
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, leaf = dotted.split(".")
        for parent in parents:
            target = target.setdefault(parent, {}) if isinstance(target.get(parent, {}), dict) else {}
        target[leaf] = value
    config = parse_edge_config(data, path if path is not None else "<flags>")
    return replace(config, source=str(path) if path is not None else "<flags>")
