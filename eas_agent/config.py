"""Load and validate the agent config file (``/etc/eas-agent/config.yml``, rendered by the eas_agent role).

Every problem names the file and the field (``ius[1].gpus``) so the operator can fix it without reading code.
The schema is the contract in docs/contracts/agent-config.md; optional tuning fields have defaults here.
"""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from consul_io import layout
from consul_io.config import ConsulConfig, load_consul
from eas_agent.announce import DEFAULT_MAX_PROMPT_TOKENS, DEFAULT_NODE_RATE_PER_S, DEFAULT_RATE_PER_S
from eas_agent.announce_keys import EdgeKeys
from eas_wire.fields import ConfigError, Fields, address, read_yaml, split_hostport

__all__ = ["AgentConfig", "ConfigError", "ConsulConfig", "IUConfig", "load_config", "parse_config"]

PROFILES = ("drain", "seed")
GPU_BACKENDS = ("nvml",)


@dataclass(frozen=True)
class IUConfig:
    id: str
    gpus: tuple[int, ...]
    numa_node: int | None
    metrics_url: str
    rdma_devices: tuple[str, ...] = ()
    netdevs: tuple[str, ...] = ()
    rdma_port: int = 1
    # KV-cache pool size for the seed profile's "KV-cache GB" term; None = estimate from NVML memory used.
    kv_cache_gb: float | None = None
    # What the scorer takes the IU's prefill and decode rates to be (tokens/s) before it has measured them
    # (eas_agent/score.py Capacity: the measured peak, decaying toward at least a quarter of this). The
    # defaults are DrainParams'. A value far above what the engine does makes its score read idle while it
    # queues: `clusterctl edge calibrate` flags such a unit.
    prefill_tps_prior: float = 8000.0
    decode_tps_prior: float = 2000.0


@dataclass(frozen=True)
class AgentConfig:
    node: str
    rack: str
    datacenter: str
    ius: tuple[IUConfig, ...]
    interval_s: float = 0.2
    heartbeat_s: float = 2.0
    profile: str = "drain"
    listen: str = "127.0.0.1:9105"
    consul: ConsulConfig = field(default_factory=ConsulConfig)
    gpu_backend: str = "nvml"
    sysfs_root: str = "/sys"
    scrape_timeout_s: float = 0.15
    # Smallest gap between two KV writes of this node (level changes inside it wait for the next slot;
    # an urgent rise does not). eas_agent/publisher.py explains the three write settings.
    min_write_interval_s: float = 1.0
    # Token bucket every KV write draws from: at most write_burst + 1 + write_rate_per_s x T writes in T s.
    # It binds before min_write_interval_s does when that is below 1 / write_rate_per_s: raise both.
    write_rate_per_s: float = 0.95
    write_burst: float = 2.0
    # A score this far above the one last written is written at once (None: the profile's default).
    urgent_rise_s: float | None = None
    # Token counters still this long while requests run -> the IU's status is warning (hung engine).
    frozen_after_s: float = 10.0
    # A catalogued XID that takes a unit out (eas_agent/xid_verdict.py) keeps it critical this long after it.
    xid_hold_s: float = 600.0
    # Read the kernel log (/dev/kmsg: the XIDs logged while the agent was down, NVSwitch SXIDs;
    # eas_agent/collectors/kernel_log.py). Off: XIDs come from NVML's events only, SXIDs are not seen.
    kernel_log: bool = True
    # The announce channel (eas_agent/announce.py, POST /announce): the file holding the edges' public keys
    # (None: the channel is off), each announced prompt's token cap (the served model's context), each
    # edge's announcements per second and the node's, all edges together.
    announce_keys_file: str | None = None
    announce_max_prompt_tokens: int = DEFAULT_MAX_PROMPT_TOKENS
    announce_rate_per_s: float = DEFAULT_RATE_PER_S
    announce_node_rate_per_s: float = DEFAULT_NODE_RATE_PER_S
    source: str = "<config>"  # the file it was loaded from, for error messages

    @property
    def kv_key(self) -> str:
        return layout.score_key(self.datacenter, self.node, self.consul.kv_prefix)

    def read_edge_keys(self) -> EdgeKeys | None:
        """The edges' public keys, read once at start-up (no secret: the agent can check a batch, never make
        one); no ``announce_keys_file``, no keys (the channel is off)."""
        if self.announce_keys_file is None:
            return None
        try:
            return EdgeKeys.from_file(self.announce_keys_file)
        except (OSError, ValueError) as exc:
            raise ConfigError(self.source, "announce_keys_file", str(exc)) from None

    @property
    def listen_host(self) -> str:
        return split_hostport(self.listen)[0]

    @property
    def listen_port(self) -> int:
        return split_hostport(self.listen)[1]


def _finite(f: Fields, key: str, default: float) -> float:
    value = f.positive(key, default)
    if not math.isfinite(value):
        raise f.fail(key, f"must be a finite number > 0, got {value}")
    return value


def _load_iu(path: str | Path, data: Any, index: int, node: str) -> IUConfig:
    f = Fields(path, data, f"ius[{index}]")
    f.unknown(
        {"id", "gpus", "numa_node", "metrics_url", "rdma_devices", "netdevs", "rdma_port", "kv_cache_gb",
         "prefill_tps_prior", "decode_tps_prior"}
    )
    iu_id = f.get("id", str, required=True)
    if not iu_id.startswith(layout.iu_id(node, "")):
        raise f.fail("id", f"expected '<node>-iu<N>' for node {node!r}, got {iu_id!r}")
    gpus = f.get("gpus", list, required=True)
    if not gpus:
        raise f.fail("gpus", "an IU needs at least one GPU")
    for i, gpu in enumerate(gpus):
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise ConfigError(path, f"{f.name('gpus')}[{i}]", f"expected a GPU index >= 0, got {gpu!r}")
    url = f.get("metrics_url", str, required=True)
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname or parsed.port is None:
        raise f.fail("metrics_url", f"expected http://HOST:PORT/metrics, got {url!r}")
    numa = f.get("numa_node", int, None)
    kv_gb = f.get("kv_cache_gb", float, None)
    if kv_gb is not None and kv_gb <= 0:
        raise f.fail("kv_cache_gb", f"must be > 0, got {kv_gb}")
    return IUConfig(
        id=iu_id,
        gpus=tuple(gpus),
        numa_node=numa,
        metrics_url=url,
        rdma_devices=f.str_list("rdma_devices"),
        netdevs=f.str_list("netdevs"),
        rdma_port=f.get("rdma_port", int, 1),
        kv_cache_gb=kv_gb,
        prefill_tps_prior=_finite(f, "prefill_tps_prior", 8000.0),
        decode_tps_prior=_finite(f, "decode_tps_prior", 2000.0),
    )


TOP_LEVEL = {
    "node",
    "rack",
    "datacenter",
    "interval_s",
    "heartbeat_s",
    "profile",
    "listen",
    "consul",
    "gpu_backend",
    "sysfs_root",
    "ius",
    "scrape_timeout_s",
    "min_write_interval_s",
    "write_rate_per_s",
    "write_burst",
    "urgent_rise_s",
    "frozen_after_s",
    "xid_hold_s",
    "kernel_log",
    "announce_keys_file",
    "announce_max_prompt_tokens",
    "announce_rate_per_s",
    "announce_node_rate_per_s",
}


def _announce_fields(f: Fields) -> dict[str, Any]:
    keys_file = f.get("announce_keys_file", str, None)
    if keys_file is not None and not keys_file.strip():
        raise f.fail("announce_keys_file", f"expected a file path or null, got {keys_file!r}")
    max_tokens = f.get("announce_max_prompt_tokens", int, DEFAULT_MAX_PROMPT_TOKENS)
    if max_tokens < 1:
        raise f.fail("announce_max_prompt_tokens", f"must be >= 1, got {max_tokens}")
    rates = {}
    for key, default in (("announce_rate_per_s", DEFAULT_RATE_PER_S),
                         ("announce_node_rate_per_s", DEFAULT_NODE_RATE_PER_S)):
        rates[key] = f.positive(key, default)
        if not math.isfinite(rates[key]):
            raise f.fail(key, f"must be a finite number > 0, got {rates[key]}")
    return {"announce_keys_file": keys_file, "announce_max_prompt_tokens": max_tokens, **rates}


def parse_config(data: Any, path: str | Path = "<config>") -> AgentConfig:
    f = Fields(path, data, "")
    f.unknown(TOP_LEVEL)
    node = f.get("node", str, required=True)
    interval = f.positive("interval_s", 0.2)
    heartbeat = f.positive("heartbeat_s", 2.0)
    if heartbeat < interval:
        raise f.fail("heartbeat_s", f"must be >= interval_s ({interval}), got {heartbeat}")
    backend = f.choice("gpu_backend", GPU_BACKENDS, "nvml")
    listen = address(f, "listen", "127.0.0.1:9105")
    try:
        ipaddress.ip_address(listen.rsplit(":", 1)[0])
    except ValueError as exc:
        raise f.fail("listen", f"expected an IP address and port, got {listen!r}") from exc
    raw_ius = f.get("ius", list, required=True)
    if not raw_ius:
        raise f.fail("ius", "at least one IU is required")
    ius = tuple(_load_iu(path, raw, i, node) for i, raw in enumerate(raw_ius))
    seen: set[str] = set()
    for i, iu in enumerate(ius):
        if iu.id in seen:
            raise ConfigError(path, f"ius[{i}].id", f"duplicate IU id {iu.id!r}")
        seen.add(iu.id)
    timeout = f.positive("scrape_timeout_s", 0.15)
    burst = f.positive("write_burst", 2.0)
    if burst < 1:
        raise f.fail("write_burst", f"must be >= 1 (a write takes one token), got {burst}")
    if timeout >= interval * 5:
        raise f.fail("scrape_timeout_s", f"must be well under the cycle ({interval} s), got {timeout}")
    return AgentConfig(
        node=node,
        rack=f.get("rack", str, required=True),
        datacenter=f.get("datacenter", str, layout.DEFAULT_DATACENTER),
        ius=ius,
        interval_s=interval,
        heartbeat_s=heartbeat,
        profile=f.choice("profile", PROFILES, "drain"),
        listen=listen,
        consul=load_consul(path, data.get("consul")),
        gpu_backend=backend,
        sysfs_root=f.get("sysfs_root", str, "/sys"),
        scrape_timeout_s=timeout,
        min_write_interval_s=f.get("min_write_interval_s", float, 1.0),
        write_rate_per_s=f.positive("write_rate_per_s", 0.95),
        write_burst=burst,
        urgent_rise_s=None if data.get("urgent_rise_s") is None else f.positive("urgent_rise_s", 0.5),
        frozen_after_s=f.positive("frozen_after_s", 10.0),
        xid_hold_s=f.positive("xid_hold_s", 600.0),
        kernel_log=f.get("kernel_log", bool, True),
        **_announce_fields(f),
        source=str(path),
    )


def load_config(path: str | Path) -> AgentConfig:
    return parse_config(read_yaml(path), path)
