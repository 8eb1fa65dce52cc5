"""Every host variable clusterctl's Python reads, declared once: its type, its default and its validation.

:class:`HostVars` is the declaration: one field per variable, each made by :func:`var` with the default
(used when the inventory does not set it) and the coercer that turns the raw value into the field's type
or says, in one line, why it cannot. :func:`coerce` ``(hostvars, where) -> HostVars`` applies every
declaration to one host's resolved variables and raises :class:`SpecError` listing every problem at once,
each naming host, variable and value (the CLI prefixes the inventory path). A variable with a prefix only
clusterctl reads (:data:`OWN_PREFIXES`: ``preflight_``) that is not declared is a problem too, with the
near miss (``preflight_overides``: did you mean ``preflight_overrides``?): a misspelt setting would
otherwise be silently ignored.

The inventory loader (:mod:`cluster.ansible.inventory`) templates and decrypts exactly these variables
(:data:`NAMES`) while the vault secrets are in effect; :func:`cluster.settings.node_settings` builds the
typed per-node settings from the coerced record, never from raw variables. The layout variables
(``gpu_count``, ``iu_layout``, ``rdma_nics``, ...) are declared here with their defaults and kept as given:
their rules relate variables to each other (a layout against a GPU count, ports against IUs) and are
:mod:`cluster.validate`'s, which reads defaults through :func:`value`; :func:`cluster.model.build_node`
builds the layout after those rules passed. No other module applies a default.

Variables of the layout are documented in :mod:`cluster.model`'s table; those of the per-node settings
(connection, Consul, preflight, version pins, agent) in :mod:`cluster.settings`'.
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cluster.text import suggest

GPU_MODELS = ("h100-sxm", "h200-sxm", "a100-sxm")
VALID_IU_SIZES = (1, 2, 4, 8)
RACK_GROUP_PREFIX = "rack_"
DEFAULT_GPU_COUNT = 8
DEFAULT_IU_SIZE = 4
DEFAULT_NUMA_NODE_COUNT = 2
DEFAULT_IU_PORT_BASE = 8000
# An rdma_nics entry's defaults: port 1 of an InfiniBand HCA.
NIC_DEFAULTS = {"port": 1, "link_layer": "infiniband"}
# Consul's own defaults (the agent's HTTP port on loopback, datacenter dc1): used where the inventory
# sets neither, so readers can still tell "set" from "defaulted" (``clusterctl scores`` ranks the
# inventory above CONSUL_HTTP_ADDR).
DEFAULT_CONSUL_HTTP_ADDR = "127.0.0.1:8500"
DEFAULT_CONSUL_DATACENTER = "dc1"

# Version pins: component -> the nvidia_stack role variable that installs it (roles/nvidia_stack/defaults).
# The versions check reads the same variables, so a pin set for the role is the pin preflight checks
# (Fabric Manager is installed at exactly the driver version). CUDA and OFED have no role variable: pin
# them with preflight_version_pins.
COMPONENTS = ("driver", "cuda", "fabric_manager", "nccl", "ofed")
PIN_VARS = {
    "driver": "nvidia_stack_driver_version",
    "fabric_manager": "nvidia_stack_driver_version",
    "nccl": "nvidia_stack_nccl_version",
}
# Prefixes of variables that only clusterctl's Python reads: an undeclared one is a misspelling (the
# roles' prefixes are not here: a role's variables are the role's, checked by its argument spec).
OWN_PREFIXES = ("preflight_",)


@dataclass(frozen=True)
class Problem:
    host: str
    variable: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.host}: {self.variable}={self.value!r}: {self.message}"


class Invalid(ValueError):
    """What a coercer raises: the message, or ``parts`` ``(suffix, value, message)`` naming parts of the
    variable (``preflight_version_pins.drivr``)."""

    def __init__(self, message: str = "", parts: list[tuple[str, Any, str]] | None = None):
        super().__init__(message)
        self.parts = parts


class SpecError(ValueError):
    """Host variables that do not coerce: every problem, one line each."""

    def __init__(self, problems: list[Problem]):
        super().__init__("\n".join(map(str, problems)))
        self.problems = problems


@dataclass(frozen=True)
class Undecryptable:
    variable: str
    why: str

    def __str__(self) -> str:
        return f"{self.variable} is vault-encrypted and cannot be decrypted ({self.why}): pass --vault-password-file"


def integer(raw: Any) -> int | None:
    """An int, or None for anything that is not one (a bool is not a number of GPUs)."""
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


# -- coercers: raw value (as the inventory set it, null included) -> typed value, or Invalid ------------

def as_given(raw: Any) -> Any:
    return raw


def text(raw: Any) -> str | None:
    """A string setting; null or empty is "not set"."""
    return None if raw is None or raw == "" else str(raw)


def optional_str(raw: Any) -> str | None:
    return None if raw is None else str(raw)


def nonempty_text(raw: Any) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise Invalid("must be a non-empty string")
    return raw


def secret_text(raw: Any) -> Any:
    """A secret: its text, or the :class:`Undecryptable` the loader left (its reader says so)."""
    return raw if isinstance(raw, Undecryptable) else text(raw)


def tcp_port(raw: Any) -> int | None:
    if raw is None:
        return None
    port = integer(raw)
    if port is None or not 1 <= port <= 65535:
        raise Invalid("not a TCP port number")
    return port


def gid_index(raw: Any) -> int:
    index = integer(raw)
    if index is None or index < 0:
        raise Invalid("must be a GID table index (an integer >= 0)")
    return index


def one_of(*choices: str) -> Callable[[Any], str]:
    def coerce_choice(raw: Any) -> str:
        if str(raw) not in choices:
            raise Invalid(f"must be {' or '.join(choices)}")
        return str(raw)
    return coerce_choice


def shell_words(raw: Any) -> tuple[str, ...]:
    """ssh options as one string of shell words (Ansible's ``ansible_ssh_*_args``); null is none."""
    if raw is None or raw == "":
        return ()
    if not isinstance(raw, str):
        raise Invalid("must be a string of ssh options")
    try:
        return tuple(shlex.split(raw))
    except ValueError as exc:
        raise Invalid(f"not shell words: {exc}") from None


def version_pins(raw: Any) -> dict[str, str]:
    """component -> version (null: no pins); an unknown component is named with its value."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise Invalid("must be a mapping")
    unknown = [(f".{c}", raw[c], f"unknown component; expected one of {', '.join(COMPONENTS)}")
               for c in raw if c not in COMPONENTS]
    if unknown:
        raise Invalid(parts=unknown)
    return {str(c): str(v) for c, v in raw.items() if v is not None}


def var(default: Any = None, coerce: Callable[[Any], Any] = as_given, secret: bool = False) -> Any:
    """One variable's declaration: its default (when not set) and its coercer (when set)."""
    metadata = {"coerce": coerce, "secret": secret}
    if isinstance(default, dict | list):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class HostVars:
    """One host's variables, coerced. Layout variables as given (see the module docstring), settings typed."""

    # -- layout (cluster.model's table; rules in cluster.validate)
    ansible_host: Any = var()
    rack: Any = var()
    gpu_model: Any = var()
    gpu_count: Any = var(DEFAULT_GPU_COUNT)
    iu_size: Any = var(DEFAULT_IU_SIZE)
    iu_layout: Any = var()
    gpu_numa_nodes: Any = var()
    numa_node_count: Any = var(DEFAULT_NUMA_NODE_COUNT)
    iu_port_base: Any = var(DEFAULT_IU_PORT_BASE)
    iu_ports: Any = var()
    rdma_nics: Any = var()
    nccl_socket_ifname: Any = var()
    cpu_cstates_redfish: Any = var()
    # -- connection (cluster.settings' table)
    ansible_connection: str = var("ssh", lambda raw: str(raw or "ssh"))
    ansible_port: int | None = var(None, tcp_port)
    ansible_user: str | None = var(None, text)
    ansible_ssh_private_key_file: str | None = var(None, text)
    ansible_private_key_file: str | None = var(None, text)
    ansible_ssh_common_args: tuple[str, ...] = var((), shell_words)
    ansible_ssh_extra_args: tuple[str, ...] = var((), shell_words)
    # -- Consul
    consul_http_addr: str | None = var(None, nonempty_text)
    consul_scheme: str = var("http", one_of("http", "https"))
    consul_datacenter: str | None = var(None, nonempty_text)
    # Secret: decrypted at load when the vault secrets can, else kept as Undecryptable, so a command that
    # never sends it (inventory show/validate) runs without the vault password, and one that does says
    # which variable it could not decrypt.
    consul_token: Any = var(None, secret_text, secret=True)
    consul_token_file: str | None = var(None, text)
    # -- preflight (preflight_overrides is validated against the profile schema by preflight.profiles)
    preflight_profile: str | None = var(None, text)
    preflight_overrides: Any = var()
    preflight_version_pins: dict[str, str] = var({}, version_pins)
    roce_gid_index: int = var(3, gid_index)
    # -- the nvidia_stack role's pins (PIN_VARS), read as preflight's pins too
    nvidia_stack_driver_version: str | None = var(None, optional_str)
    nvidia_stack_nccl_version: str | None = var(None, optional_str)
    # -- the agent
    eas_agent_listen: str | None = var(None, text)
    eas_agent_fake_gpu_file: str | None = var(None, text)


FIELDS = dataclasses.fields(HostVars)
NAMES = tuple(f.name for f in FIELDS)
SECRETS = tuple(f.name for f in FIELDS if f.metadata["secret"])
DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in FIELDS
}
assert set(PIN_VARS.values()) <= set(NAMES)  # a pin variable the loader would not template is no pin


def value(hostvars: Mapping[str, Any], name: str) -> Any:
    """The variable as the host has it, else its default (a variable set to null stays null: the checks
    name it rather than silently using the default)."""
    return hostvars.get(name, DEFAULTS[name])


def coerce(hostvars: Mapping[str, Any], where: str) -> HostVars:
    """One host's variables (``where``: the host, as problems name it) as the typed record; SpecError
    listing every variable that does not coerce and every undeclared variable with a prefix of ours."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for f in FIELDS:
        if f.name not in hostvars:
            continue  # the declared default
        raw = hostvars[f.name]
        try:
            values[f.name] = f.metadata["coerce"](raw)
        except Invalid as exc:
            parts = exc.parts or [("", raw, str(exc))]
            problems += [Problem(where, f.name + suffix, part, message) for suffix, part, message in parts]
    own = [name for name in NAMES if name.startswith(OWN_PREFIXES)]
    problems += [Problem(where, str(name), hostvars[name], f"unknown variable (clusterctl reads {', '.join(own)})"
                         + suggest(str(name), own))
                 for name in hostvars if str(name).startswith(OWN_PREFIXES) and name not in NAMES]
    if problems:
        raise SpecError(problems)
    return HostVars(**values)


def check_settings(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """:func:`coerce`'s problems for one host (a rule of :data:`cluster.validate.HOST_RULES`)."""
    try:
        coerce(hv, host)
    except SpecError as exc:
        return exc.problems
    return []
