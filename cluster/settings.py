"""Typed per-node settings, resolved once when the inventory loads and carried by the model's ``Node``.

Production code reads ``node.settings.<group>.<field>``, never raw host variables: the defaults are
:mod:`cluster.spec`'s, the values were templated (and inline ``!vault`` values decrypted) by the loader
while the vault secrets were in effect, and :func:`cluster.spec.coerce` typed and checked them once
(each variable's type, default and rule are declared in :class:`cluster.spec.HostVars`).

Host variables read here:

==================================  =====================================================================
``ansible_connection``              ``ssh`` (default) or ``local``: how preflight reaches the host
``ansible_port``, ``ansible_user``  ssh port and user (default: ssh's own)
``ansible_ssh_private_key_file``    key file (``ansible_private_key_file`` as a fallback, as in Ansible)
``ansible_ssh_common_args``,        ssh options; their ``UserKnownHostsFile`` files verify host keys
``ansible_ssh_extra_args``
``consul_http_addr``                the node's Consul agent, ``HOST:PORT`` without a scheme (default ``127.0.0.1:8500``)
``consul_scheme``                   ``http`` (default) or ``https``: the scheme of every call to that agent
``consul_datacenter``               default ``dc1``
``consul_token``                    the operator's Consul token (maintenance, release markers), a vault value; else
``consul_token_file``               a 0600 file on the controller holding it (roles/consul_agent/README.md)
``preflight_profile``               preflight profile name (default: ``gpu_model``)
``preflight_overrides``             per-host profile overrides (validated by preflight.profiles)
``preflight_version_pins``          component -> version; wins over the role variables below
``nvidia_stack_driver_version``     the driver (and Fabric Manager) pin, as the nvidia_stack role has it
``nvidia_stack_nccl_version``       the libnccl2 pin, as the nvidia_stack role has it
``roce_gid_index``                  RoCEv2 GID index for perftest on ethernet ports (default 3)
``eas_agent_listen``                the agent's ``IP:PORT``
==================================  =====================================================================

Version pins come from one mapping, :data:`cluster.spec.PIN_VARS`: the role installs what its variables
say; the versions check pins what the inventory sets for those same variables (a role default alone is
not a pin: a host not yet provisioned is not expected to be on it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster import spec


@dataclass(frozen=True)
class Connection:
    kind: str = "ssh"  # ansible_connection: ssh | local
    port: int | None = None
    user: str | None = None
    key_file: str | None = None
    ssh_common_args: tuple[str, ...] = ()  # ansible_ssh_common_args as shell words
    ssh_extra_args: tuple[str, ...] = ()  # ansible_ssh_extra_args as shell words


@dataclass(frozen=True)
class Consul:
    http_addr: str | None = None  # consul_http_addr as the inventory sets it (None: not set)
    scheme: str = spec.DEFAULTS["consul_scheme"]
    dc: str | None = None  # consul_datacenter as the inventory sets it (None: not set)
    # never in a repr; an spec.Undecryptable when no vault password decrypted it (the reader says so)
    token: Any = field(default=None, repr=False)
    token_file: str | None = None

    def operator_token(self) -> str | None:
        """The operator token by the one token rule (:func:`consul_io.client.resolve_token`): ``consul_token``
        when set, else the 0600 ``consul_token_file``'s, else none. Raises consul_io.client.TokenError naming
        the variable."""
        from consul_io.client import TokenError, resolve_token

        if isinstance(self.token, spec.Undecryptable):
            raise TokenError(str(self.token))
        try:
            return resolve_token(self.token, self.token_file)
        except TokenError as exc:
            # the value is used when set, so a refused value is consul_token's, else the file is consul_token_file's
            raise TokenError(f"consul_token: {exc}" if self.token else f"consul_token_file {exc}") from None

    @property
    def address(self) -> str:
        """``HOST:PORT`` (never with a scheme: its type refuses one, cluster/spec.py says why)."""
        return self.http_addr or spec.DEFAULT_CONSUL_HTTP_ADDR

    @property
    def url(self) -> str:
        """The agent's HTTP API as every caller reaches it, ``<consul_scheme>://<HOST:PORT>`` (the roles get it
        from the ``cluster_node`` filter, ``clusterctl scores`` from here when the inventory sets the address)."""
        return f"{self.scheme}://{self.address}"

    @property
    def datacenter(self) -> str:
        return self.dc or spec.DEFAULT_CONSUL_DATACENTER


@dataclass(frozen=True)
class Preflight:
    profile: str = ""  # preflight_profile, else gpu_model
    overrides: Any = None  # preflight_overrides as given: preflight.profiles validates it
    roce_gid_index: int = spec.DEFAULTS["roce_gid_index"]


@dataclass(frozen=True)
class Agent:
    listen: str | None = None


@dataclass(frozen=True)
class NodeSettings:
    connection: Connection = field(default_factory=Connection)
    consul: Consul = field(default_factory=Consul)
    preflight: Preflight = field(default_factory=Preflight)
    agent: Agent = field(default_factory=Agent)
    version_pins: Mapping[str, str] = field(default_factory=dict)  # component -> version


def version_pins(record: spec.HostVars) -> dict[str, str]:
    """component -> pinned version: ``preflight_version_pins`` first, then the role variable
    (:data:`cluster.spec.PIN_VARS`) when the inventory sets it."""
    pins = {}
    for component in spec.COMPONENTS:
        pinned = record.preflight_version_pins.get(component)
        if pinned is None and component in spec.PIN_VARS:
            pinned = getattr(record, spec.PIN_VARS[component])
        if pinned is not None:
            pins[component] = pinned
    return pins


def node_settings(hostvars: Mapping[str, Any] | spec.HostVars, where: str = "-") -> NodeSettings:
    """Typed settings from one host's coerced variables (:func:`cluster.spec.coerce`, which raises
    SpecError naming ``where`` for a value that is not of its variable's type; the rules are
    validation's, which runs first)."""
    # From a mapping: the settings alone (a node built by hand, a transport test, has no layout to coerce).
    r = hostvars if isinstance(hostvars, spec.HostVars) else spec.coerce(hostvars, where, spec.SETTING_NAMES, rules=False)
    return NodeSettings(
        connection=Connection(
            kind=r.ansible_connection,
            port=r.ansible_port,
            user=r.ansible_user,
            key_file=r.ansible_ssh_private_key_file or r.ansible_private_key_file,
            ssh_common_args=r.ansible_ssh_common_args,
            ssh_extra_args=r.ansible_ssh_extra_args,
        ),
        consul=Consul(
            http_addr=r.consul_http_addr or None,
            scheme=r.consul_scheme,
            dc=r.consul_datacenter or None,
            token=r.consul_token,
            token_file=r.consul_token_file,
        ),
        preflight=Preflight(
            profile=str(r.preflight_profile or r.gpu_model or ""),
            overrides=r.preflight_overrides,
            roce_gid_index=r.roce_gid_index,
        ),
        agent=Agent(listen=r.eas_agent_listen),
        version_pins=version_pins(r),
    )
