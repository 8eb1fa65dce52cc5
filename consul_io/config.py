"""The ``consul:`` block of the agent's and the edge's config files (the same block in both: where Consul
answers, how to reach it, the token file and the score prefix), read with the shared field reader
(:mod:`eas_wire.fields`). It lives here, not in ``eas_wire``, because its defaults are Consul layout names
and its token follows the one token rule (:func:`consul_io.client.resolve_token`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consul_io import layout
from consul_io.client import TokenError, resolve_token
from eas_wire.fields import ConfigError, Fields, address, split_hostport

KEYS = {"address", "scheme", "token_file", "ca_file", "kv_prefix"}


@dataclass(frozen=True)
class ConsulConfig:
    address: str = layout.DEFAULT_HTTP_ADDR
    scheme: str = "http"
    token_file: str | None = None
    ca_file: str | None = None
    kv_prefix: str = layout.EAS_PREFIX

    @property
    def host(self) -> str:
        return split_hostport(self.address)[0]

    @property
    def port(self) -> int:
        return split_hostport(self.address)[1]

    def read_token(self, config_path: str | Path = "<config>") -> str | None:
        """The ACL token by the one token rule (consul_io.client.resolve_token), read at start-up and never
        logged; no ``token_file``, no token. A configured file that is missing is an error like any unusable
        one: running without a token against a Consul with ACLs on would only fail later, on every write."""
        try:
            return resolve_token(token_file=self.token_file)
        except TokenError as exc:
            raise ConfigError(config_path, "consul.token_file", str(exc)) from None


def load_consul(path: str | Path, data: Any) -> ConsulConfig:
    """The ``consul:`` mapping of the config file at ``path`` (None or absent: every default)."""
    f = Fields(path, data if data is not None else {}, "consul")
    f.unknown(KEYS)
    return ConsulConfig(
        address=address(f, "address", layout.DEFAULT_HTTP_ADDR),
        scheme=f.choice("scheme", ("http", "https"), "http"),
        token_file=f.get("token_file", str, None),
        ca_file=f.get("ca_file", str, None),
        kv_prefix=f.get("kv_prefix", str, layout.EAS_PREFIX),
    )
