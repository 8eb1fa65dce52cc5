"""The Consul servers: the inventory group ``consul_servers``, the hosts of it that run nothing else, and the
rule on a server that also runs inference units.

A Consul server keeps the cluster's whole state in its Raft store and snapshots (``data_dir/raft``): the
catalog, the key/value entries and the ACLs, every token's SecretID included, the management token's too.
Root on a server reads them whenever it likes. A GPU node runs third-party model code (vLLM and the model's
own code), so a server on a GPU node puts every token, and with the management token the whole catalog, one
model exploit away (docs/decisions/0035-consul-servers-off-model-hosts.md, 0038-dedicated-consul-servers.md).

Two kinds of server host:

- a GPU node of ``consul_servers`` (a rack, GPUs, IUs: :mod:`cluster.model`'s node) runs the IUs *and* a server;
- a host of :data:`DEDICATED_GROUP` (also in ``consul_servers``) is a dedicated Consul server: no rack, no GPUs,
  no IUs, no agent. The model's layout variables (``gpu_model``, ``rdma_nics``... that ``group_vars/all`` gives
  every host) are not read for it; the playbooks run only the plays that apply (``site.yml``: the servers'
  play, then ``chrony`` and ``host_firewall`` one server at a time), never a GPU, network or inference role.

With ACLs on (the default), a GPU node in ``consul_servers`` is refused unless :data:`ACCEPTED_VAR` names it
with the reason: a mapping ``{host: reason}``, so a server added later is refused again until someone writes
down why it too may hold every token. A listed host that is no such server is refused too (a list that
outlives its layout would silence nothing and mislead its reader).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cluster import edges, spec
from cluster.spec import Problem

SERVERS_GROUP = "consul_servers"
DEDICATED_GROUP = "dedicated_consul_servers"
ACCEPTED_VAR = "consul_servers_running_ius"
DECISION = "docs/decisions/0038-dedicated-consul-servers.md"


def _groups(hv: Mapping[str, Any]) -> list[str]:
    return list(hv.get("group_names") or [])


def is_server(hv: Mapping[str, Any]) -> bool:
    return SERVERS_GROUP in _groups(hv)


def is_dedicated(hv: Mapping[str, Any]) -> bool:
    """A host of :data:`DEDICATED_GROUP`: a Consul server and nothing else (no GPU node)."""
    return DEDICATED_GROUP in _groups(hv)


def _acls_on(hv: Mapping[str, Any]) -> bool:
    # the consul_agent role's default is on; "off" as cluster.validate's security warnings read it
    value = hv.get("consul_agent_acl_enabled")
    return not (value is False or (isinstance(value, str) and value.strip().lower() in ("false", "no", "off", "0")))


def accepted(hv: Mapping[str, Any]) -> dict[str, str]:
    """The inventory's ``{host: reason}`` of GPU nodes that run a Consul server on purpose (typed by
    :func:`cluster.shapes.server_reasons`): an entry without a reason, or a value of another type, is that rule's
    problem and names no host here, so the server it meant is refused too."""
    raw = hv.get(ACCEPTED_VAR)
    return {str(k): v for k, v in raw.items() if isinstance(v, str) and v.strip()} if isinstance(raw, Mapping) else {}


def check_dedicated_server(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """A host of :data:`DEDICATED_GROUP`: in ``consul_servers``, in no rack group, no edge or balancer."""
    groups = _groups(hv)
    problems = []
    if SERVERS_GROUP not in groups:
        problems.append(Problem(host, "group_names", DEDICATED_GROUP,
                                f"a host of {DEDICATED_GROUP} runs a Consul server and nothing else: add it to "
                                f"{SERVERS_GROUP} too, or take it out of {DEDICATED_GROUP}"))
    racks = sorted(g for g in groups if g.startswith(spec.RACK_GROUP_PREFIX))
    if racks:
        problems.append(Problem(host, "group_names", racks,
                                f"a host of {DEDICATED_GROUP} has no GPUs and is in no rack group (rack groups "
                                "hold GPU nodes): take it out of the rack group"))
    others = [g for g in (edges.EDGES_GROUP, edges.BALANCERS_GROUP) if g in groups]
    if others:
        problems.append(Problem(host, "group_names", others,
                                f"a host of {DEDICATED_GROUP} runs only Consul (root there reads every token: "
                                f"{DECISION}): put the edges and balancers on other hosts"))
    return problems


def check_server_running_ius(host: str, hv: Mapping[str, Any]) -> list[Problem]:
    """A GPU node in ``consul_servers`` with ACLs on, not named in :data:`ACCEPTED_VAR`: refused."""
    if not is_server(hv) or is_dedicated(hv) or not _acls_on(hv) or host in accepted(hv):
        return []
    return [Problem(host, "group_names", SERVERS_GROUP,
                    "a Consul server on a GPU node that runs third-party model code: root there reads every ACL "
                    "token's secret, the management token's included, from the server's Raft data (data_dir/raft); "
                    f"move the server to a host of {DEDICATED_GROUP}, or name this host in {ACCEPTED_VAR} "
                    f"({{{host}: <why>}}) to run it there on purpose ({DECISION})")]


def check_accepted_list(hosts: Mapping[str, Mapping[str, Any]]) -> list[Problem]:
    """Across the inventory: every host :data:`ACCEPTED_VAR` names is a GPU node of ``consul_servers`` (each
    problem on the host whose variables carry the mapping, so the file that sets it is named)."""
    problems: list[Problem] = []
    for name in sorted(hosts):
        for listed, _ in accepted(hosts[name]).items():
            other = hosts.get(listed)
            if other is None:
                why = "not a host of this inventory"
            elif not is_server(other):
                why = f"not in {SERVERS_GROUP}"
            elif is_dedicated(other):
                why = f"a host of {DEDICATED_GROUP}: it runs no IUs"
            else:
                continue
            problems.append(Problem(name, f"{ACCEPTED_VAR}.{listed}", None, f"{why}: remove it from the list"))
    return problems


@dataclass(frozen=True)
class ConsulServer:
    """A host of ``consul_servers``: its address, whether it runs nothing else, and (a GPU node) why the
    inventory lets it run IUs (None: no reason given, which validation refuses with ACLs on)."""

    name: str
    address: str
    dedicated: bool
    runs_ius_because: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "dedicated": self.dedicated,
                "runs_ius_because": self.runs_ius_because}

    @property
    def kind(self) -> str:
        if self.dedicated:
            return "dedicated"
        return f"runs IUs: {ACCEPTED_VAR}" if self.runs_ius_because else "runs IUs"


def summary(found: tuple[ConsulServer, ...]) -> str:
    """``consul01, consul02 (dedicated)``: the servers, grouped by kind in their order; "none" without any."""
    kinds: dict[str, list[str]] = {}
    for server in found:
        kinds.setdefault(server.kind, []).append(server.name)
    return "; ".join(f"{', '.join(names)} ({kind})" for kind, names in kinds.items()) or "none"


def servers_of(hosts: Mapping[str, Mapping[str, Any]], order: list[str] | None = None) -> tuple[ConsulServer, ...]:
    """The Consul servers among ``hosts``, in ``order`` (the group's, as Ansible runs it) else by name."""
    names = [n for n in (order or sorted(hosts)) if n in hosts and is_server(hosts[n])]
    return tuple(ConsulServer(name, str(hosts[name].get("ansible_host") or name), is_dedicated(hosts[name]),
                              None if is_dedicated(hosts[name]) else accepted(hosts[name]).get(name))
                 for name in names)
