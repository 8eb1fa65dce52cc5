"""Who may reach the edge and how the edge reaches the IUs: the config fields of client authentication, TLS,
the admin listener and the IUs' API key (top-level fields of the edge's config file)::

    auth:                         # client API keys (edge/auth.py); or `auth: none`, spelled out
      keys_file: /etc/eas-edge/api-keys        # 0600; '<tenant> sha256:<hex>' lines
    tls:                          # serve clients over TLS (both or neither)
      cert_file: /etc/eas-edge/tls/edge.crt    # the certificate chain (PEM)
      key_file: /etc/eas-edge/tls/edge.key     # its private key (PEM, 0600)
    admin_listen: 127.0.0.1:9180  # /metrics (and /healthz) for the operator's scraper; never the client port
    upstream_api_key_file: /etc/eas-edge/iu-api-key   # 0600, one word: the IUs' vLLM key (VLLM_API_KEY)

Without ``auth`` the edge checks no keys, and then it refuses a client ``listen`` address that is not
loopback: anyone who reaches it would use the GPUs. ``auth: none`` says deliberately that something in front
(a gateway) authenticates.
"""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass

from consul_io.client import TokenError, read_token_file
from eas_wire.fields import ConfigError, Fields, address, split_hostport
from eas_wire.private_file import PrivateFileError, read_private_text
from edge.auth import KeysFileError, KeyTable, read_keys_file

DEFAULT_ADMIN_LISTEN = "127.0.0.1:9180"
ACCESS_FIELDS = frozenset({"auth", "tls", "admin_listen", "upstream_api_key_file"})


@dataclass(frozen=True)
class AccessConfig:
    keys_file: str | None = None  # client API keys; None: no check
    auth_none: bool = False  # `auth: none`: no check, deliberately (a gateway in front authenticates)
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    admin_listen: str = DEFAULT_ADMIN_LISTEN
    upstream_api_key_file: str | None = None  # None: the IUs take requests without a key

    @property
    def auth_decided(self) -> bool:
        return self.keys_file is not None or self.auth_none

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None

    def check_listen(self, listen: str, source: str) -> None:
        """A client address others can reach needs keys, or ``auth: none`` said out loud."""
        if not self.auth_decided and not is_loopback(split_hostport(listen)[0]):
            raise ConfigError(source, "auth", f"listen {listen} is reachable from other hosts and no client keys "
                              "are configured: set auth.keys_file, or write 'auth: none' if a gateway in front "
                              "authenticates clients")

    def read_keys(self, source: str) -> KeyTable | None:
        if self.keys_file is None:
            return None
        try:
            return read_keys_file(self.keys_file)
        except KeysFileError as exc:
            raise ConfigError(source, "auth.keys_file", str(exc)) from None

    def read_upstream_key(self, source: str) -> str | None:
        if self.upstream_api_key_file is None:
            return None
        try:
            return read_token_file(self.upstream_api_key_file, kind="IU API key")
        except TokenError as exc:
            raise ConfigError(source, "upstream_api_key_file", str(exc)) from None

    def ssl_context(self, source: str) -> ssl.SSLContext | None:
        """The server's TLS context (TLS 1.2 and newer), or None without ``tls``."""
        if not self.tls:
            return None
        try:
            read_private_text(self.tls_key_file, "the TLS key file", "the edge's TLS private key")
        except PrivateFileError as exc:
            raise ConfigError(source, "tls.key_file", str(exc)) from None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(source, "tls", f"cannot load {self.tls_cert_file} with {self.tls_key_file}: "
                              f"{getattr(exc, 'strerror', None) or exc}") from None
        return context


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def load_access(f: Fields) -> AccessConfig:
    """The access fields of the top-level reader ``f``."""
    auth = f.data.get("auth")
    keys_file, auth_none = None, False
    if auth == "none":
        auth_none = True
    elif isinstance(auth, dict):
        a = Fields(f.path, auth, "auth")
        a.unknown({"keys_file"})
        keys_file = a.get("keys_file", str, None)
        if not keys_file:
            raise a.fail("keys_file", "expected the path of the API keys file (or write 'auth: none')")
    elif auth is not None:
        raise f.fail("auth", f"expected 'none' or a mapping with keys_file, got {auth!r}")
    tls = f.data.get("tls")
    cert = key = None
    if tls is not None:
        t = Fields(f.path, tls, "tls")
        t.unknown({"cert_file", "key_file"})
        cert, key = t.get("cert_file", str, None), t.get("key_file", str, None)
        if not cert or not key:
            raise t.fail("cert_file" if not cert else "key_file", "tls needs both cert_file and key_file")
    upstream = f.get("upstream_api_key_file", str, None)
    if upstream == "":
        raise f.fail("upstream_api_key_file", "empty path (null: the IUs take requests without a key)")
    return AccessConfig(keys_file=keys_file, auth_none=auth_none, tls_cert_file=cert, tls_key_file=key,
                        admin_listen=address(f, "admin_listen", DEFAULT_ADMIN_LISTEN),
                        upstream_api_key_file=upstream)
