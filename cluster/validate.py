"""Inventory validation: every problem at once, each naming host, variable and value.

Runs on resolved host variables before anything contacts a host. Each variable's own type and rule is
declared in :class:`cluster.spec.HostVars` and applied by the first and last rules
(:func:`cluster.spec.check_layout_variables`, :func:`cluster.spec.check_setting_types`); the rules here relate
variables to each other (a layout against the GPU count, ports against the IUs, a host's rack groups,
Redfish against the BMC variables; the edges and balancers groups in :mod:`cluster.edges`, the Consul servers in
:mod:`cluster.servers`). A dedicated Consul server has no layout: :func:`host_rules` gives it
:data:`DEDICATED_SERVER_RULES`, every other host :data:`HOST_RULES`. Rules are small functions
``check_<what>(host, hostvars) -> problems`` so that each can be read (and tested) on its own.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from cluster import edges, model, servers, spec
from cluster.spec import Problem
from common.text import plural

BMC_VARS = ("bmc_address", "bmc_username", "bmc_password")
# Role variables the host rules read besides cluster.spec's (the roles' filter passes them too).
ROLE_VARS_READ = (*BMC_VARS, "consul_agent_acl_enabled")


_int = spec.integer


def check_gpu_layout(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    gpu_count = _int(spec.value(hv, "gpu_count"))
    iu_size = _int(spec.value(hv, "iu_size"))
    if gpu_count is None or gpu_count <= 0 or iu_size not in model.VALID_IU_SIZES:
        return problems  # spec.check_layout_variables names them; nothing here can be related to them
    if gpu_count % iu_size:
        problems.append(
            Problem(host, "gpu_count", gpu_count, f"not divisible by iu_size={iu_size}: {plural(gpu_count % iu_size, 'GPU')} left over")
        )
    layout = hv.get("iu_layout")
    if layout is not None:
        problems += _check_explicit_layout(host, layout, gpu_count, iu_size)
    numa = hv.get("gpu_numa_nodes")
    if numa is not None:
        if not isinstance(numa, list) or len(numa) != gpu_count or any(_int(n) is None or _int(n) < 0 for n in numa):
            problems.append(Problem(host, "gpu_numa_nodes", numa, f"must list a NUMA node (>= 0) for each of {gpu_count} GPUs"))
        elif not problems:
            for index, gpus in enumerate(model.iu_layout(hv)):
                spanned = sorted({int(numa[g]) for g in gpus})
                if len(spanned) > 1:
                    problems.append(
                        Problem(host, "iu_layout", gpus, f"IU {index} spans NUMA nodes {spanned} (gpu_numa_nodes={numa})")
                    )
    return problems


def _check_explicit_layout(host: str, layout: Any, gpu_count: int, iu_size: int) -> list[Problem]:
    if not isinstance(layout, list) or not all(isinstance(iu, list) for iu in layout):
        return [Problem(host, "iu_layout", layout, "must be a list of GPU-index lists, one per IU")]
    problems = []
    seen: set[int] = set()
    for index, gpus in enumerate(layout):
        if len(gpus) != iu_size:
            problems.append(Problem(host, "iu_layout", gpus, f"IU {index} has {len(gpus)} GPUs, iu_size is {iu_size}"))
        for gpu in gpus:
            g = _int(gpu)
            # the whole layout as the value: "iu_layout=3" read as if the variable were 3
            if g is None or not 0 <= g < gpu_count:
                problems.append(Problem(host, "iu_layout", layout,
                                        f"IU {index}: GPU {gpu!r} is out of range 0..{gpu_count - 1}"))
            elif g in seen:
                problems.append(Problem(host, "iu_layout", layout, f"IU {index}: GPU {g} is already in another IU"))
            else:
                seen.add(g)
    return problems


def check_ports(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    ports = hv.get("iu_ports")
    if ports is None:
        base = _int(spec.value(hv, "iu_port_base"))
        if base is None or not 1024 <= base <= 65000:
            return [Problem(host, "iu_port_base", hv.get("iu_port_base"), "must be an integer in 1024..65000")]
        return []
    problems = []
    seen = set()
    for port in ports if isinstance(ports, list) else [ports]:
        p = _int(port)
        if p is None or not 1 <= p <= 65535:
            problems.append(Problem(host, "iu_ports", port, "not a TCP port number"))
        elif p in seen:
            problems.append(Problem(host, "iu_ports", p, "duplicate IU port on this node"))
        seen.add(p)
    if not problems and _int(spec.value(hv, "gpu_count")) and _int(spec.value(hv, "iu_size")):
        expected = len(model.iu_layout(hv)) if hv.get("iu_layout") is not None else (
            int(spec.value(hv, "gpu_count")) // int(spec.value(hv, "iu_size"))
        )
        if len(ports) != expected:
            problems.append(Problem(host, "iu_ports", ports, f"lists {len(ports)} ports for {expected} IUs"))
    return problems


def check_redfish(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    if not hv.get("cpu_cstates_redfish"):
        return []
    # Only presence is checked: the password is usually an inline vault value, which is never decrypted
    # here (comparing one to "" would decrypt it): it is set, whether or not a vault password was given.
    return [
        Problem(host, var, None, "cpu_cstates_redfish is on but this BMC variable is missing")
        for var in BMC_VARS
        if hv.get(var) is None or (isinstance(hv[var], str) and hv[var] == "")
    ]


def check_rack(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    groups = model.rack_groups(list(hv.get("group_names", [])))
    rack_var = hv.get("rack")
    racks = set(groups) | ({str(rack_var)} if rack_var is not None else set())
    if not racks:
        return [Problem(host, "rack", None, "host is in no rack: add it to a rack_<name> group or set 'rack'")]
    if len(racks) > 1:
        return [Problem(host, "rack", sorted(racks), "host is in more than one rack")]
    return []


def check_host_name(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    if spec.is_host_name(host):
        return []
    return [Problem(host, "inventory_hostname", host,
                    "not a valid host name (letters, digits and '-' in '.'-separated labels of at most 63, "
                    f"{spec.MAX_HOSTNAME} in all): it becomes IU ids, Consul names and file names on the node")]


CANONICAL_UUID = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def check_management_token(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """The consul_agent role bootstraps Consul's ACLs with the management token as the bootstrap token's
    SecretID (``PUT /v1/acl/bootstrap``), which Consul takes only as a UUID. A plain value is checked here
    (never printed); an inline vault value is never decrypted here, and a template is the inventory's own."""
    from cluster.ansible import vault  # the one module that knows Ansible's vault types

    value = hv.get("consul_agent_acl_management_token")
    if _off(hv.get("consul_agent_acl_enabled")) or vault.ciphertext(value) is not None or not isinstance(value, str):
        return []
    if value == "" or "{{" in value or CANONICAL_UUID.fullmatch(value):
        return []
    return [Problem(host, "consul_agent_acl_management_token", None,
                    "not a UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx): the consul_agent role bootstraps Consul's "
                    "ACLs with it (PUT /v1/acl/bootstrap), which takes only a UUID; `uuidgen` makes one")]


HOST_RULES: tuple[Callable[[str, Mapping[str, Any]], list[Problem]], ...] = (
    check_host_name,
    spec.check_layout_variables,
    check_rack,
    check_gpu_layout,
    check_ports,
    check_redfish,
    edges.check_edge_host,
    servers.check_server_running_ius,
    check_management_token,
    spec.check_setting_types,
)
# A dedicated Consul server: no rack, GPUs, IUs or edge, so none of the layout's rules (cluster.servers).
DEDICATED_SERVER_RULES: tuple[Callable[[str, Mapping[str, Any]], list[Problem]], ...] = (
    check_host_name,
    servers.check_dedicated_server,
    check_management_token,
    spec.check_setting_types,
)


def host_rules(hv: Mapping[str, Any]) -> tuple[Callable[[str, Mapping[str, Any]], list[Problem]], ...]:
    return DEDICATED_SERVER_RULES if servers.is_dedicated(hv) else HOST_RULES


def _shared(hosts: Mapping[str, Mapping[str, Any]], key: Callable[[str, Mapping[str, Any]], str | None]) -> dict[str, list[str]]:
    """``key(host, hostvars)`` -> the hosts that share it, for the keys two or more hosts share (None: no key)."""
    owners: dict[str, list[str]] = {}
    for name, hv in hosts.items():
        if (value := key(name, hv)) is not None:
            owners.setdefault(value, []).append(name)
    return {value: names for value, names in owners.items() if len(names) > 1}


def check_duplicate_addresses(hosts: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    return [
        Problem(host, "ansible_host", address, f"address also used by {', '.join(h for h in names if h != host)}")
        for address, names in _shared(hosts, lambda name, hv: str(hv.get("ansible_host") or name)).items()
        for host in names
    ]


# Tokens Consul links to ONE node's policy (consul_agent's acl.yml, consul_io.acl.node_policies): node:write
# for the Consul agent, that node's own IU service for its file-service registrations, that node's score
# keys for its eas-agent. Shared between nodes, each node's run
# re-links the token to its own policy, and every other node's agent is refused (403).
NODE_TOKENS = ("consul_agent_acl_agent_token", "consul_agent_acl_registration_token", "eas_agent_consul_token")


def _secret_identity(value: Any) -> str | None:
    """What makes two values of a secret the same, never printed: an inline ``!vault`` value's ciphertext (a
    group_vars value every host inherits is one ciphertext; two encryptions of one secret differ and are not
    caught here), a plain value's text; None for unset or templated values (a template such as the virtual
    inventory's ``... inventory_hostname ... | to_uuid`` is per host by construction)."""
    from cluster.ansible import vault  # the one module that knows Ansible's vault types

    if (sealed := vault.ciphertext(value)) is not None:  # first: comparing an EncryptedString decrypts it
        return "vault:" + sealed
    if value is None or not isinstance(value, str | int) or str(value) == "":
        return None
    text = str(value)
    return None if "{{" in text or "{%" in text else "plain:" + text


def check_shared_node_tokens(hosts: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    problems: list[Problem] = []
    for variable in NODE_TOKENS:
        for names in _shared(hosts, lambda _, hv, v=variable: _secret_identity(hv.get(v))).values():
            shown = ", ".join(names[:4]) + (f", ... (+{len(names) - 4})" if len(names) > 4 else "")
            problems += [Problem(host, variable, None, (
                f"the same token on {len(names)} hosts ({shown}): Consul links it to one node's policy, so "
                "each node's run re-links it and the other nodes' agents are refused (403); give each node "
                "its own (host_vars, ansible-vault)")) for host in names]
    return problems


def validate(selected: Mapping[str, Mapping[str, Any]], everyone: Mapping[str, Mapping[str, Any]] | None = None) -> list[Problem]:
    """Per-host rules over ``selected``; cluster-wide uniqueness over ``everyone`` (default: selected)."""
    problems: list[Problem] = []
    if not selected:
        problems.append(Problem("-", "hosts", None, "the inventory (or --limit) selects no hosts"))
    for name in sorted(selected):
        for rule in host_rules(selected[name]):
            problems += rule(name, selected[name])
    problems += [p for p in check_duplicate_addresses(everyone or selected) if p.host in selected]
    problems += [p for p in check_shared_node_tokens(everyone or selected) if p.host in selected]
    problems += [p for p in edges.check_groups(everyone or selected) if p.host in selected]
    problems += [p for p in servers.check_accepted_list(everyone or selected) if p.host in selected]
    return problems


def problem_lines(problems: Iterable[Problem], hosts_shown: int = 3) -> list[str]:
    """One line per distinct problem: the same variable, value and message on several hosts (a group_vars
    mistake seen by every host of the group) is one line naming the hosts and how many, not one per host.
    A line ends with the file that sets the variable when its problems share one (``(group_vars/all.yml:3)``)."""
    groups: dict[tuple[str, str, str], list[Problem]] = {}
    for p in problems:
        groups.setdefault((p.subject, p.message, p.place_kind), []).append(p)
    lines = []
    for (subject, message, kind), group in groups.items():
        hosts = [p.host for p in group]
        if len(hosts) == 1:
            who = hosts[0]
        else:
            names = ", ".join(hosts[:hosts_shown]) + (f", ... (+{len(hosts) - hosts_shown})" if len(hosts) > hosts_shown else "")
            who = f"{names} ({plural(len(hosts), kind)})"
        origins = {p.origin for p in group}
        place = f" ({origins.pop()})" if len(origins) == 1 and None not in origins else ""
        lines.append(f"{who}: {subject}: {message}{place}")
    return lines


def format_problems(problems: Iterable[Problem]) -> str:
    return "\n".join(problem_lines(problems))


# -- Consul security: warnings (an inventory may turn these off on purpose; it is told what that means) --

_CONSUL_SWITCHES = (
    ("consul_agent_acl_enabled", "ACLs are off: any host that reaches an agent can change the catalog and KV "
                                 "(and so steer traffic)"),
    ("consul_agent_gossip_encryption", "gossip is unencrypted: any host that reaches port 8301 can join the cluster"),
    ("consul_agent_tls_enabled", "RPC is not TLS-protected: tokens and KV values cross the network in clear text"),
    ("consul_agent_tls_verify_incoming", "servers accept RPC from clients without a certificate"),
    ("consul_agent_tls_verify_server_hostname", "agents do not check that a server is server.<dc>.consul"),
)
_CONSUL_SECRETS = (
    ("consul_agent_acl_enabled", ("consul_agent_acl_management_token", "consul_agent_acl_agent_token",
                                  "consul_agent_acl_registration_token", "consul_token")),
    ("consul_agent_gossip_encryption", ("consul_agent_gossip_key",)),
    ("consul_agent_tls_enabled", ("consul_agent_tls_ca_pem",)),
)


# What only a host with IUs needs: a dedicated Consul server registers no IU service.
_IU_SECRETS = ("consul_agent_acl_registration_token",)


def _off(value: Any) -> bool:
    return value is False or (isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0"))


def _unset(hv: Mapping[str, Any], var: str) -> bool:
    # presence only: an inline vault value is never decrypted here (see check_redfish)
    return hv.get(var) is None or (isinstance(hv[var], str) and hv[var] == "")


def check_consul_security(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """What weakens the Consul cluster's default security on this host (warnings, not errors)."""
    found = [Problem(host, var, hv[var], message) for var, message in _CONSUL_SWITCHES if _off(hv.get(var))]
    if str(hv.get("consul_agent_acl_default_policy", "deny")) == "allow" and not _off(hv.get("consul_agent_acl_enabled")):
        found.append(Problem(host, "consul_agent_acl_default_policy", "allow",
                             "requests without a token may do everything"))
    for switch, secrets in _CONSUL_SECRETS:
        if not _off(hv.get(switch)):
            found += [Problem(host, var, None, f"{switch} is on (the default) but this secret is not set: the "
                                               "consul_agent role will stop on this host") for var in secrets
                      if _unset(hv, var) and not (var in _IU_SECRETS and servers.is_dedicated(hv))
                      and not (var == "consul_token" and not (
                          _unset(hv, "consul_token_file") and _unset(hv, "consul_agent_acl_operator_token")))]
    return found


def security_warnings(selected: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Consul security warnings, one line per (variable, value, message) with the hosts it concerns."""
    grouped: dict[tuple[str, str], list[str]] = {}
    for name in sorted(selected):
        for p in check_consul_security(name, selected[name]):
            grouped.setdefault((p.subject, p.message), []).append(name)
    lines = []
    for (subject, message), hosts in grouped.items():
        shown = ", ".join(hosts[:8]) + (f", ... (+{len(hosts) - 8})" if len(hosts) > 8 else "")
        lines.append(f"{subject}: {message} (hosts: {shown})")
    return lines
