"""Every host variable clusterctl's Python reads, declared once: its type, its default and its rule.

:class:`HostVars` is the declaration: one field per variable, each made by :func:`var` with its default
(used when the inventory does not set it), its type (a function turning the raw value into the field's
type, or saying in one line why it cannot) and its rule (what a typed value must satisfy, in one line).
:func:`coerce` ``(hostvars, where) -> HostVars`` applies them to one host's resolved variables and
raises :class:`SpecError` listing every problem at once, each naming host, variable and value (the CLI
prefixes the inventory path). A variable with a prefix only clusterctl reads (:data:`OWN_PREFIXES`:
``preflight_``) that is not declared is a problem too, with the near miss (``preflight_overides``: did
you mean ``preflight_overrides``?): a misspelt setting would otherwise be ignored without a word.
So is a variable clusterctl no longer reads (:data:`RETIRED`), named with what to do instead. That is
the check on a play's variables (the roles' filter); an inventory's every variable, whatever its prefix,
is checked against everything that reads one by :mod:`cluster.variables`, which names its file.

Who applies what: validation (:mod:`cluster.validate`, and through it the roles' ``cluster_node``
filter) applies types and rules (:func:`check_layout_variables` first, :func:`check_settings` last) and
adds the rules that relate variables to each other (an ``iu_layout`` against ``gpu_count``, ``iu_ports``
against the IUs, rack groups, Redfish against the BMC variables), which is why ``iu_layout``,
``gpu_numa_nodes``, ``iu_ports`` and ``iu_port_base`` are declared with their defaults but kept as given.
:func:`cluster.model.build_node` and :func:`cluster.settings.node_settings` read the typed record
(``rules=False``: they run on variables validation passed). The inventory loader
(:mod:`cluster.ansible.inventory`) templates and decrypts exactly these variables (:data:`NAMES`) while
the vault secrets are in effect. No other module applies a default.

Variables of the layout are documented in :mod:`cluster.model`'s table; those of the per-node settings
(connection, Consul, preflight, version pins, agent) in :mod:`cluster.settings`'.

Consul's address and scheme are two variables: ``consul_http_addr`` is ``HOST:PORT`` and ``consul_scheme``
is ``http`` or ``https``. A scheme inside the address (``https://h:8501``) is refused by its type (so even a
node built without validation cannot have one) with a line saying to set ``consul_scheme``: the roles
template the address into the agent's ``client_addr`` and ``ports.http``, and a prefix that was dropped sent
the operator token over plain HTTP. :class:`cluster.settings.Consul` is the one reading of the pair.
``cpu_cstates_extra_kernel_args`` is declared for its rule only (the cpu_cstates role's ``kernel_args``
filter applies it too): update-grub sources it as shell, as root.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# The string types and rules (and Invalid, what every type raises); HOSTNAME etc. re-exported for their readers.
from cluster.shapes import (  # noqa: F401
    HOSTNAME,
    IBDEV,
    IFNAME,
    MAX_HOSTNAME,
    Invalid,
    consul_address,
    ifname_rule,
    is_host_name,
    kernel_args,
    server_reasons,
    shell_words,
)
from common.text import suggest
from consul_io import layout

GPU_MODELS = ("h100-sxm", "h200-sxm", "a100-sxm")
VALID_IU_SIZES = (1, 2, 4, 8)
RACK_GROUP_PREFIX = "rack_"
DEFAULT_GPU_COUNT = 8
DEFAULT_IU_SIZE = 4
DEFAULT_NUMA_NODE_COUNT = 2
DEFAULT_IU_PORT_BASE = 8000
# NCCL_SOCKET_IFNAME when the inventory sets no nccl_socket_ifname: NCCL's own exclusion pattern (every
# interface but loopback and docker*), not an interface name, so it is only a default and never an
# inventory value (the rule reads set values).
DEFAULT_NCCL_SOCKET_IFNAME = "^lo,docker"
# An rdma_nics entry's defaults: port 1 of an InfiniBand HCA.
NIC_DEFAULTS = {"port": 1, "link_layer": "infiniband"}
# Consul's own defaults (the agent's HTTP port on loopback, datacenter dc1): used where the inventory
# sets neither, so readers can still tell "set" from "defaulted" (``clusterctl scores`` ranks the
# inventory above CONSUL_HTTP_ADDR).
DEFAULT_CONSUL_HTTP_ADDR = layout.DEFAULT_HTTP_ADDR
DEFAULT_CONSUL_DATACENTER = layout.DEFAULT_DATACENTER

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
# Variables clusterctl read once and no longer reads, with what to do instead. A role ignores a variable its
# argument spec does not declare, so one left in an inventory would otherwise be dropped without a word.
RETIRED = {
    "eas_agent_announce_token": "no longer read: agents hold only the edges' public keys (eas_edge_public_keys, "
                                "a list of {name, key}); each edge signs with its own private key "
                                "(docs/contracts/announce.md); remove it",
    "eas_agent_fake_gpu_file": "no longer read: the agent reads its GPUs through NVML only (the virtual "
                               "cluster's machines install a stand-in nvidia-ml-py from their package index); "
                               "remove it",
}


@dataclass(frozen=True)
class Problem:
    host: str
    variable: str
    value: Any
    message: str
    place_kind: str = "host"  # what ``host`` names: a host, or a file (a variable nothing reads)
    origin: str | None = None  # FILE:LINE of the inventory that sets the variable, where known

    @property
    def subject(self) -> str:
        """``variable=value``, or the bare name for a variable that is not set ("rack=None" read as a rack
        named None)."""
        return self.variable if self.value is None else f"{self.variable}={self.value!r}"

    def __str__(self) -> str:
        return f"{self.host}: {self.subject}: {self.message}"


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
        return f"{self.variable}: {self.why}"


def integer(raw: Any) -> int | None:
    """An int, or None for anything that is not one (a bool is not a number of GPUs)."""
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


# -- types: raw value (as the inventory set it, null included) -> typed value, or Invalid when the value
# cannot be of that type. Every reader gets them (cluster.model.build_node, node settings).

def as_given(raw: Any) -> Any:
    return raw


def text(raw: Any) -> str | None:
    """A string setting; null or empty is "not set"."""
    return None if raw is None or raw == "" else str(raw)


def strict_bool(raw: Any) -> bool:
    """true or false (YAML booleans) only: a "yes" string is no consent to a drill."""
    if not isinstance(raw, bool):
        raise Invalid("must be true or false")
    return raw


def optional_str(raw: Any) -> str | None:
    return None if raw is None else str(raw)


def string(message: str) -> Callable[[Any], str]:
    def to_str(raw: Any) -> str:
        if not isinstance(raw, str):
            raise Invalid(message)
        return raw
    return to_str


def secret_text(raw: Any) -> Any:
    """A secret: its text, or the :class:`Undecryptable` the loader left (its reader says so)."""
    return raw if isinstance(raw, Undecryptable) else text(raw)


def whole(message: str, optional: bool = False) -> Callable[[Any], int | None]:
    """An integer (``optional``: or null), else Invalid(message): the rule's message, so that a value
    of the wrong type and one out of range read the same."""
    def to_int(raw: Any) -> int | None:
        number = None if optional and raw is None else integer(raw)
        if number is None and not (optional and raw is None):
            raise Invalid(message)
        return number
    return to_int


def version_pins(raw: Any) -> dict[str, str]:
    """component -> version (null: no pins)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise Invalid("must be a mapping")
    return {str(c): str(v) for c, v in raw.items() if v is not None}


# rdma_nics entry numbers and their least value (port numbers start at 1; NUMA nodes and GPUs at 0)
_NIC_NUMBERS = (("port", 1), ("rate_gbps", 1), ("numa_node", 0), ("gpu", 0))


def rdma_nics(raw: Any) -> tuple[dict[str, Any], ...]:
    """The NIC entries with their defaults applied and numbers as ints (cluster.model.Nic's fields)."""
    if raw is None:
        return ()
    if not isinstance(raw, list | tuple):  # a tuple: entries typed already (the record's)
        raise Invalid("must be a list of {device, netdev, ...}")
    parts: list[tuple[str, Any, str]] = []
    nics = []
    for i, nic in enumerate(raw):
        if not isinstance(nic, dict) or "device" not in nic:
            parts.append((f"[{i}]", nic, "must be a mapping with at least 'device'"))
            continue
        link_layer = str(nic.get("link_layer", NIC_DEFAULTS["link_layer"])).lower()
        if link_layer not in ("infiniband", "ethernet"):
            parts.append((f"[{i}].link_layer", nic.get("link_layer"), "must be infiniband or ethernet"))
        numbers = {}
        for key, least in _NIC_NUMBERS:
            given = nic.get(key, NIC_DEFAULTS.get(key))
            numbers[key] = None if given is None else integer(given)
            if given is not None and numbers[key] is None:
                parts.append((f"[{i}].{key}", given, f"must be an integer >= {least}"))
        nics.append({"device": str(nic["device"]), "netdev": optional_str(nic.get("netdev")),
                     "link_layer": link_layer, **numbers})
    if parts:
        raise Invalid(parts=parts)
    return tuple(nics)


# -- rules: typed value -> None, or Invalid naming what the inventory must change. Validation applies
# them (cluster.validate, the roles' filter plugin); a node built from validated variables need not.

def at_least(least: int, message: str) -> Callable[[Any], None]:
    def rule(number: int | None) -> None:
        if number is not None and number < least:
            raise Invalid(message)
    return rule


def in_range(low: int, high: int, message: str) -> Callable[[Any], None]:
    def rule(number: int | None) -> None:
        if number is not None and not low <= number <= high:
            raise Invalid(message)
    return rule


def one_of(choices: tuple[Any, ...], message: str) -> Callable[[Any], None]:
    def rule(value: Any) -> None:
        if value not in choices:
            raise Invalid(message)
    return rule


def nonempty(value: str) -> None:
    if not value.strip():
        raise Invalid("must be a non-empty string")


def gpu_model_rule(value: Any) -> None:
    if value is None:
        raise Invalid(f"missing required variable (one of {', '.join(GPU_MODELS)})")
    if value not in GPU_MODELS:
        raise Invalid(f"unknown GPU model; expected one of {', '.join(GPU_MODELS)}")


def pin_components(pins: dict[str, str]) -> None:
    unknown = [(f".{c}", v, f"unknown component; expected one of {', '.join(COMPONENTS)}")
               for c, v in pins.items() if c not in COMPONENTS]
    if unknown:
        raise Invalid(parts=unknown)


def nic_rules(nics: tuple[dict[str, Any], ...]) -> None:
    parts: list[tuple[str, Any, str]] = []
    for i, nic in enumerate(nics):
        if not IBDEV.fullmatch(nic["device"]):
            parts.append((f"[{i}].device", nic["device"], "not a valid RDMA device name"))
        if nic["netdev"] is not None and not IFNAME.fullmatch(nic["netdev"]):
            parts.append((f"[{i}].netdev", nic["netdev"],
                          "not a valid Linux interface name (1-15 chars, no '/', ':' or spaces)"))
        parts += [(f"[{i}].{key}", nic[key], f"must be an integer >= {least}") for key, least in _NIC_NUMBERS
                  if nic[key] is not None and nic[key] < least]
    if parts:
        raise Invalid(parts=parts)


def var(default: Any = None, coerce: Callable[[Any], Any] = as_given, rule: Callable[[Any], None] | None = None,
        secret: bool = False, required: bool = False, layout: bool = False) -> Any:
    """One variable's declaration: its default (when not set), its type (``coerce``, when set) and its
    ``rule`` (a required variable's rule also sees an unset one, as null, and names it). ``layout``: one
    of the model's (cluster.model's table), else a per-node setting (cluster.settings')."""
    metadata = {"coerce": coerce, "rule": rule, "secret": secret, "required": required, "layout": layout}
    if isinstance(default, dict | list):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


_POSITIVE = "must be a positive integer"
_IU_SIZES = f"must be one of {'/'.join(map(str, VALID_IU_SIZES))}"
_PORT = "not a TCP port number"
_NONEMPTY = "must be a non-empty string"
_GID = "must be a GID table index (an integer >= 0)"


@dataclass(frozen=True)
class HostVars:
    """One host's variables, coerced. Layout variables whose rules relate them to others are as given (see
    the module docstring); the rest typed."""

    # -- layout (cluster.model's table; the rules relating variables are cluster.validate's)
    ansible_host: Any = var(layout=True)
    rack: Any = var(layout=True)
    gpu_model: str = var(None, optional_str, gpu_model_rule, required=True, layout=True)
    gpu_count: int = var(DEFAULT_GPU_COUNT, whole(_POSITIVE), at_least(1, _POSITIVE), layout=True)
    iu_size: int = var(DEFAULT_IU_SIZE, whole(_IU_SIZES), one_of(VALID_IU_SIZES, _IU_SIZES), layout=True)
    iu_layout: Any = var(layout=True)  # against gpu_count and iu_size
    gpu_numa_nodes: Any = var(layout=True)  # against gpu_count and the layout
    numa_node_count: Any = var(DEFAULT_NUMA_NODE_COUNT, layout=True)
    iu_port_base: Any = var(DEFAULT_IU_PORT_BASE, layout=True)  # checked where used: without iu_ports
    iu_ports: Any = var(layout=True)  # against the number of IUs
    rdma_nics: tuple[dict[str, Any], ...] = var((), rdma_nics, nic_rules, layout=True)
    nccl_socket_ifname: str | None = var(DEFAULT_NCCL_SOCKET_IFNAME, optional_str, ifname_rule, layout=True)
    cpu_cstates_redfish: Any = var(layout=True)  # with the BMC variables
    # -- connection (cluster.settings' table)
    ansible_connection: str = var("ssh", lambda raw: str(raw or "ssh"))
    ansible_port: int | None = var(None, whole(_PORT, optional=True), in_range(1, 65535, _PORT))
    ansible_user: str | None = var(None, text)
    ansible_ssh_private_key_file: str | None = var(None, text)
    ansible_private_key_file: str | None = var(None, text)
    ansible_ssh_common_args: tuple[str, ...] = var((), shell_words)
    ansible_ssh_extra_args: tuple[str, ...] = var((), shell_words)
    # -- Consul
    consul_http_addr: str | None = var(None, consul_address)  # no scheme: the module docstring says why
    consul_scheme: str = var("http", str, one_of(("http", "https"), "must be http or https"))
    consul_datacenter: str | None = var(None, string(_NONEMPTY), nonempty)
    # Secret: decrypted at load when the vault secrets can, else kept as Undecryptable, so a command that
    # never sends it (inventory show/validate) runs without the vault password, and one that does says
    # which variable it could not decrypt.
    consul_token: Any = var(None, secret_text, secret=True)
    consul_token_file: str | None = var(None, text)
    consul_servers_running_ius: dict[str, str] = var({}, server_reasons)  # cluster.servers: the reasons
    # -- preflight (preflight_overrides is validated against the profile schema by preflight.profiles)
    preflight_profile: str | None = var(None, text)
    preflight_overrides: Any = var()
    preflight_version_pins: dict[str, str] = var({}, version_pins, pin_components)
    roce_gid_index: int = var(3, whole(_GID), at_least(0, _GID))
    # -- the nvidia_stack role's pins (PIN_VARS), read as preflight's pins too
    nvidia_stack_driver_version: str | None = var(None, optional_str)
    nvidia_stack_nccl_version: str | None = var(None, optional_str)
    # -- clusterctl drill: a host that may have its units killed, frozen and stopped under load (operate/drill.py)
    drills_allowed: bool = var(False, strict_bool)
    # -- the agent
    eas_agent_listen: str | None = var(None, text)
    # -- the edges and their balancers (cluster.edges: their shapes and the rules relating them)
    eas_edge_listen: str | None = var(None, text)
    eas_edge_admin_listen: str | None = var(None, text)
    edge_balancer_listen: str | None = var(None, text)
    edge_balancer_stats_socket: str | None = var(None, text)
    # -- checked for a role, never read by Python (the module docstring says why)
    cpu_cstates_extra_kernel_args: tuple[str, ...] = var((), kernel_args)


FIELDS = dataclasses.fields(HostVars)
NAMES = tuple(f.name for f in FIELDS)
LAYOUT_NAMES = tuple(f.name for f in FIELDS if f.metadata["layout"])
SETTING_NAMES = tuple(f.name for f in FIELDS if not f.metadata["layout"])
SECRETS = tuple(f.name for f in FIELDS if f.metadata["secret"])
DEFAULTS: dict[str, Any] = {
    f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in FIELDS
}
assert set(PIN_VARS.values()) <= set(NAMES)  # a pin variable the loader would not template is no pin


def value(hostvars: Mapping[str, Any], name: str) -> Any:
    """The variable as the host has it, else its default (a variable set to null stays null: the checks
    name it rather than silently using the default)."""
    return hostvars.get(name, DEFAULTS[name])


def _coerced(hostvars: Mapping[str, Any], where: str, names: tuple[str, ...],
             rules: bool = True) -> tuple[dict[str, Any], list[Problem]]:
    """The typed values of ``names`` that the host sets and the problems (``rules``: also each
    variable's rule, and a required variable that is not set)."""
    values: dict[str, Any] = {}
    problems: list[Problem] = []
    for f in FIELDS:
        if f.name not in names or (f.name not in hostvars and not (rules and f.metadata["required"])):
            continue  # the declared default
        raw = hostvars.get(f.name)
        try:
            if f.name in hostvars:
                values[f.name] = f.metadata["coerce"](raw)
            if rules and f.metadata["rule"] is not None:
                f.metadata["rule"](values.get(f.name))
        except Invalid as exc:
            parts = exc.parts or [("", raw, str(exc))]
            problems += [Problem(where, f.name + suffix, part, message) for suffix, part, message in parts]
    return values, problems


def unknown_own(hostvars: Mapping[str, Any], where: str) -> list[Problem]:
    """Variables with a prefix only clusterctl reads that it does not declare (a misspelling), and
    :data:`RETIRED` ones."""
    own = [name for name in NAMES if name.startswith(OWN_PREFIXES)]
    return [Problem(where, str(name), hostvars[name], f"unknown variable (clusterctl reads {', '.join(own)})"
                    + suggest(str(name), own))
            for name in hostvars if str(name).startswith(OWN_PREFIXES) and name not in NAMES] + [
        Problem(where, str(name), hostvars[name], RETIRED[name]) for name in hostvars if name in RETIRED]


def coerce(hostvars: Mapping[str, Any], where: str, names: tuple[str, ...] = NAMES, rules: bool = True) -> HostVars:
    """One host's variables (``where``: the host, as problems name it) as the typed record; SpecError
    listing every variable that is not of its type or breaks its rule and every undeclared variable
    with a prefix of ours. ``names``: coerce only these (the others keep their defaults), e.g.
    :data:`SETTING_NAMES` for settings built by hand without a layout. ``rules=False``: types only (a
    node built from variables validation passed; tests build hostile ones to test quoting)."""
    values, problems = _coerced(hostvars, where, names, rules)
    if rules:
        problems += unknown_own(hostvars, where)
    if problems:
        raise SpecError(problems)
    return HostVars(**values)


# Two rules of cluster.validate.HOST_RULES: the layout variables' own first, the settings' last (the
# rules relating layout variables to each other run between them).
def check_layout_variables(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    return _coerced(hv, host, LAYOUT_NAMES)[1]


def check_settings(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """The settings' types and rules, and misspelt ``preflight_`` variables: the roles' filter's check, on
    a play's variables (an inventory's every variable is named with its file by
    :func:`cluster.variables.unknown_variables`)."""
    return check_setting_types(host, hv) + unknown_own(hv, host)


def check_setting_types(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    return _coerced(hv, host, SETTING_NAMES)[1]
