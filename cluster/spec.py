"""Every host variable clusterctl's Python reads: its default, what it must be, in one table.

The inventory loader (:mod:`cluster.ansible.inventory`) templates and decrypts exactly these variables
(:data:`NAMES`) while the vault secrets are in effect, :mod:`cluster.validate` checks them (every problem
at once, naming host, variable and value), and :func:`cluster.model.build_node` /
:func:`cluster.settings.node_settings` coerce them into the model's frozen dataclasses. No other module
applies a default: a reader that needs a variable's value asks :func:`value`.

Variables of the layout are documented in :mod:`cluster.model`'s table; those of the per-node settings
(connection, Consul, preflight, version pins, agent) in :mod:`cluster.settings`'.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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


@dataclass(frozen=True)
class Problem:
    host: str
    variable: str
    value: Any
    message: str

    def __str__(self) -> str:
        return f"{self.host}: {self.variable}={self.value!r}: {self.message}"


@dataclass(frozen=True)
class Var:
    name: str
    default: Any = None


LAYOUT = (
    Var("ansible_host"), Var("rack"), Var("gpu_model"), Var("gpu_count", DEFAULT_GPU_COUNT),
    Var("iu_size", DEFAULT_IU_SIZE), Var("iu_layout"), Var("gpu_numa_nodes"),
    Var("numa_node_count", DEFAULT_NUMA_NODE_COUNT), Var("iu_port_base", DEFAULT_IU_PORT_BASE), Var("iu_ports"),
    Var("rdma_nics"), Var("nccl_socket_ifname"), Var("cpu_cstates_redfish"),
)
SETTINGS = (
    Var("ansible_connection", "ssh"), Var("ansible_port"), Var("ansible_user"),
    Var("ansible_ssh_private_key_file"), Var("ansible_private_key_file"),
    Var("ansible_ssh_common_args", ""), Var("ansible_ssh_extra_args", ""),
    Var("consul_http_addr"), Var("consul_scheme", "http"), Var("consul_datacenter"),
    Var("consul_token"), Var("consul_token_file"),
    Var("preflight_profile"), Var("preflight_overrides"), Var("preflight_version_pins"),
    Var("roce_gid_index", 3),
    *(Var(name) for name in dict.fromkeys(PIN_VARS.values())),
    Var("eas_agent_listen"), Var("eas_agent_fake_gpu_file"),
)
# Secrets among the settings: decrypted at load when the vault secrets can, else kept as Undecryptable, so a
# command that never sends them (inventory show/validate) runs without the vault password, and one that does
# says which variable it could not decrypt.
SECRETS = ("consul_token",)


@dataclass(frozen=True)
class Undecryptable:
    variable: str
    why: str

    def __str__(self) -> str:
        return f"{self.variable} is vault-encrypted and cannot be decrypted ({self.why}): pass --vault-password-file"


VARIABLES = LAYOUT + SETTINGS
NAMES = tuple(v.name for v in VARIABLES)
DEFAULTS: dict[str, Any] = {v.name: v.default for v in VARIABLES}


def value(hostvars: Mapping[str, Any], name: str) -> Any:
    """The variable as the host has it, else its default (a variable set to null stays null: the checks
    name it rather than silently using the default)."""
    return hostvars.get(name, DEFAULTS[name])


def integer(raw: Any) -> int | None:
    """An int, or None for anything that is not one (a bool is not a number of GPUs)."""
    if isinstance(raw, bool):
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


def check_settings(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """The settings variables' types (their use is checked where they are used: profiles, transport)."""
    problems = []
    port = hv.get("ansible_port")
    if port is not None and (integer(port) is None or not 1 <= integer(port) <= 65535):
        problems.append(Problem(host, "ansible_port", port, "not a TCP port number"))
    gid = value(hv, "roce_gid_index")
    if integer(gid) is None or integer(gid) < 0:
        problems.append(Problem(host, "roce_gid_index", gid, "must be a GID table index (an integer >= 0)"))
    scheme = value(hv, "consul_scheme")
    if str(scheme) not in ("http", "https"):
        problems.append(Problem(host, "consul_scheme", scheme, "must be http or https"))
    for name in ("consul_http_addr", "consul_datacenter"):
        if name in hv and (not isinstance(hv[name], str) or not hv[name].strip()):
            problems.append(Problem(host, name, hv[name], "must be a non-empty string"))
    # preflight_overrides: preflight.profiles validates it against the profile schema, before any host
    if hv.get("preflight_version_pins") is not None and not isinstance(hv["preflight_version_pins"], Mapping):
        problems.append(Problem(host, "preflight_version_pins", hv["preflight_version_pins"], "must be a mapping"))
    pins = hv.get("preflight_version_pins")
    if isinstance(pins, Mapping):
        for component in pins:
            if component not in COMPONENTS:
                problems.append(Problem(host, f"preflight_version_pins.{component}", pins[component],
                                        f"unknown component; expected one of {', '.join(COMPONENTS)}"))
    for name in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        args = value(hv, name)
        try:
            shlex.split(args or "") if isinstance(args or "", str) else None
        except ValueError as exc:
            problems.append(Problem(host, name, args, f"not shell words: {exc}"))
            continue
        if not isinstance(args or "", str):
            problems.append(Problem(host, name, args, "must be a string of ssh options"))
    return problems
