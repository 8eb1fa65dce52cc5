"""A Consul agent configuration (the merged ``-config-dir`` files) read into what the dev server acts on.

Keys acted on, with Consul's meaning (https://developer.hashicorp.com/consul/docs/reference/agent/
configuration-file): ``node_name``, ``datacenter``, ``data_dir``, ``server``, ``bootstrap_expect``,
``bind_addr`` / ``advertise_addr`` (an IP or a go-sockaddr template; "bind_addr cannot be a hostname"),
``client_addr``, ``ports.http`` / ``ports.server``, ``retry_join``, ``leave_on_terminate`` (default: true on
clients, false on servers), ``encrypt`` (gossip key: base64 of 16, 24 or 32 bytes), ``acl.enabled``,
``acl.default_policy``, ``acl.enable_token_persistence``, ``acl.tokens.{initial_management, agent, default,
config_file_service_registration}``, ``tls.defaults.{ca_file, cert_file, key_file, verify_incoming,
verify_outgoing}``, ``tls.internal_rpc.verify_server_hostname``, ``auto_encrypt.{tls, allow_tls}``,
``service`` / ``services`` (file-defined services), ``check_update_interval``, ``log_level``.

What the stand-in validates but cannot use: the gossip key must decode to a valid length (and agents
holding another key are refused by the server, see ``devconsul.api_remote``), but nothing is encrypted;
TLS files must exist and load (a server's cert with its key, the CA), and the combinations Consul requires
are enforced (a CA for verify_outgoing/auto_encrypt, a server cert/key for verify_incoming or allow_tls), but
the server port speaks plain HTTP.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
import socket
import ssl
from dataclasses import dataclass, field

from devconsul.durations import duration_value

SOCKADDR_TEMPLATE = re.compile(r'^\{\{\s*GetInterfaceIP\s+"([^"]+)"\s*\}\}$')
TOKEN_NAMES = ("initial_management", "agent", "default", "config_file_service_registration", "agent_recovery")


class AgentConfigError(ValueError):
    """A configuration Consul refuses at start; the text names the key and value."""


@dataclass
class AgentSettings:
    node_name: str
    server: bool = True
    bootstrap_expect: int = 1
    bind_addr: str = "127.0.0.1"
    client_addr: str = "127.0.0.1"
    http_port: int = 8500
    server_port: int = 8300
    retry_join: list[str] = field(default_factory=list)
    leave_on_terminate: bool = False
    gossip_key: str = ""
    acl_enabled: bool = False
    default_policy: str = "allow"
    token_persistence: bool = False
    tokens: dict[str, str] = field(default_factory=dict)
    tls: dict = field(default_factory=dict)
    services: list[dict] = field(default_factory=list)
    check_update_interval: float = 300.0
    data_dir: str | None = None

    def join_addresses(self) -> list[str]:
        """Server RPC addresses (``host:port``; a retry_join entry without a port uses ports.server)."""
        out = []
        for entry in self.retry_join:
            host, sep, port = entry.rpartition(":")
            out.append(entry if sep and port.isdigit() and "." in host else f"{entry}:{self.server_port}")
        return out


def resolve_ip(value: str, key: str) -> str:
    """An IP as Consul accepts it: a literal, or ``{{ GetInterfaceIP "if" }}``; a hostname is refused."""
    match = SOCKADDR_TEMPLATE.match(value.strip())
    if match:
        return _interface_ip(match.group(1), key)
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        raise AgentConfigError(f"{key}: {value!r} is not an IP address or go-sockaddr template "
                               "(Consul does not resolve host names here)") from None


def _interface_ip(name: str, key: str) -> str:
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
        except OSError as exc:
            raise AgentConfigError(f'{key}: GetInterfaceIP "{name}": {exc.strerror}') from None
    return socket.inet_ntoa(packed[20:24])


def _bool(config: dict, key: str, default: bool) -> bool:
    value = config.get(key, default)
    if not isinstance(value, bool):
        raise AgentConfigError(f"{key}: expected true or false, found {value!r}")
    return value


def _gossip_key(value: object) -> str:
    if not value:
        return ""
    try:
        raw = base64.b64decode(str(value), validate=True)
    except (binascii.Error, ValueError):
        raise AgentConfigError("encrypt: not valid base64") from None
    if len(raw) not in (16, 24, 32):
        raise AgentConfigError(f"encrypt: the key must be 16, 24 or 32 bytes, found {len(raw)}")
    return str(value)


def _tls(config: dict, server: bool) -> dict:
    tls = config.get("tls") or {}
    defaults = dict(tls.get("defaults") or {})
    rpc = tls.get("internal_rpc") or {}
    auto = config.get("auto_encrypt") or {}
    ca, cert, key = defaults.get("ca_file"), defaults.get("cert_file"), defaults.get("key_file")
    if ca:
        try:
            ssl.create_default_context(cafile=ca)
        except (OSError, ssl.SSLError) as exc:
            raise AgentConfigError(f"tls.defaults.ca_file: {ca}: {exc}") from None
    if bool(cert) != bool(key):
        raise AgentConfigError("tls.defaults: cert_file and key_file go together")
    if cert:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key)
        except (OSError, ssl.SSLError) as exc:
            raise AgentConfigError(f"tls.defaults.cert_file/key_file: {cert}, {key}: {exc}") from None
    if (defaults.get("verify_outgoing") or auto.get("tls")) and not ca:
        raise AgentConfigError("tls.defaults.verify_outgoing / auto_encrypt.tls need tls.defaults.ca_file")
    if server and (defaults.get("verify_incoming") or auto.get("allow_tls")) and not cert:
        raise AgentConfigError("a server with verify_incoming or auto_encrypt.allow_tls needs cert_file and key_file")
    if auto.get("tls") and server:
        raise AgentConfigError("auto_encrypt.tls is for client agents; servers use cert_file/key_file")
    return {"ca_file": ca, "cert_file": cert, "verify_incoming": bool(defaults.get("verify_incoming")),
            "verify_server_hostname": bool(rpc.get("verify_server_hostname")), "auto_encrypt": dict(auto)}


def from_config(config: dict, hostname: str | None = None) -> AgentSettings:
    server = _bool(config, "server", False)
    ports = config.get("ports") or {}
    acl = config.get("acl") or {}
    tokens = {k: str(v) for k, v in (acl.get("tokens") or {}).items() if k in TOKEN_NAMES and v}
    policy = str(acl.get("default_policy", "allow"))
    if policy not in ("allow", "deny"):
        raise AgentConfigError(f"acl.default_policy: {policy!r} is not allow or deny")
    bind = resolve_ip(str(config.get("advertise_addr") or config.get("bind_addr") or "127.0.0.1"),
                      "advertise_addr" if config.get("advertise_addr") else "bind_addr")
    client = resolve_ip(str(config.get("client_addr", "127.0.0.1")).split()[0], "client_addr")
    expect = int(config.get("bootstrap_expect", 1 if server else 0))
    if server and expect > 1:
        # No Raft here: one server holds the state. More servers would each be a separate cluster.
        raise AgentConfigError(f"bootstrap_expect = {expect}: the stand-in runs exactly one server")
    services = []
    for key in ("service", "services"):
        value = config.get(key)
        services += value if isinstance(value, list) else [value] if isinstance(value, dict) else []
    settings = AgentSettings(
        node_name=str(config.get("node_name") or hostname or socket.gethostname()),
        server=server, bootstrap_expect=expect, bind_addr=bind, client_addr=client,
        http_port=int(ports.get("http", 8500)), server_port=int(ports.get("server", 8300)),
        retry_join=[str(a) for a in config.get("retry_join") or []],
        leave_on_terminate=_bool(config, "leave_on_terminate", not server),
        gossip_key=_gossip_key(config.get("encrypt")),
        acl_enabled=bool(acl.get("enabled")), default_policy=policy,
        token_persistence=bool(acl.get("enable_token_persistence")), tokens=tokens,
        tls=_tls(config, server), services=services,
        check_update_interval=duration_value(config.get("check_update_interval", "5m")),
        data_dir=config.get("data_dir"),
    )
    if not server and not settings.retry_join:
        raise AgentConfigError("a client agent needs retry_join (the servers' addresses)")
    return settings
