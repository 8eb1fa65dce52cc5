"""``--consul`` for the operate commands that also take an inventory (``loadtest``, ``edge calibrate``,
``drill``): the address given, else the inventory's, as the cluster model reads it (each node's
``consul_http_addr`` with its ``consul_scheme``, the token by the one token rule: ``consul_token`` /
``consul_token_file``), else ``CONSUL_HTTP_ADDR`` where any agent will do.

An agent of a named node is asked for when the command acts on that node's services (``--breaker-unit``'s
maintenance, a drill's target): Consul's maintenance is agent-local, so no other agent and no environment
variable stands in for it. Reading the agents' score bodies (``loadtest``) asks any agent: the first node
(host-name order) that sets ``consul_http_addr``.

An inventory that cannot say is one error naming the file, the node and ``consul_http_addr`` (exit 2):
``consul_http_addr``'s own default is the node's loopback address, which reaches no agent from the controller.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from common.errors import UsageError

HINT = "pass --consul HOST:PORT"


@dataclass(frozen=True)
class ConsulTarget:
    address: str  # HOST:PORT, or SCHEME://HOST:PORT as --consul gave it
    origin: str  # where it came from, for the operator's log line
    scheme: str | None = None  # the inventory's consul_scheme (None: the address's own, else http)
    token: str | None = field(default=None, repr=False)
    dc: str | None = None  # the inventory's consul_datacenter (None: not set)

    def io(self, timeout_s: float):
        from consul_io.client import ConsulIO, ConsulUnavailable

        try:
            return ConsulIO(self.address, token=self.token, scheme=self.scheme, dc=self.dc, timeout_s=timeout_s)
        except ConsulUnavailable as exc:
            raise UsageError(f"{self.origin}: {exc}") from None


def _environment_token() -> str | None:
    return os.environ.get("CONSUL_HTTP_TOKEN") or None


def resolve_consul(consul_addr: str | None, loaded=None, *, node=None, optional: bool = False) -> ConsulTarget | None:
    """Where the command's Consul calls go, or None when nothing names an agent.

    ``loaded``: the command's validated :class:`cluster.ansible.inventory.LoadedInventory` (None: no ``-i``);
    ``node``: the :class:`cluster.model.Node` whose own agent is needed (None: any agent). UsageError (exit 2)
    when the inventory is given and does not name the agent needed; with ``optional`` (a command that runs
    without Consul, less what it reads there) ``CONSUL_HTTP_ADDR``, else None, instead.
    """
    if consul_addr:
        return ConsulTarget(consul_addr, "--consul", token=_environment_token())
    if loaded is None:
        env = os.environ.get("CONSUL_HTTP_ADDR")
        return ConsulTarget(env, "CONSUL_HTTP_ADDR", token=_environment_token()) if env else None
    from cluster.ansible import inventory as inventories
    from consul_io.client import TokenError

    nodes = [node] if node is not None else sorted(inventories.cluster_of(loaded).nodes(), key=lambda n: n.name)
    chosen = next((n for n in nodes if n.settings.consul.http_addr), None)
    if chosen is None:
        env = os.environ.get("CONSUL_HTTP_ADDR")
        if optional:
            return ConsulTarget(env, "CONSUL_HTTP_ADDR", token=_environment_token()) if env else None
        if node is not None:
            raise UsageError(f"{loaded.path}: {node.name}: consul_http_addr is not set, so its Consul agent (which "
                             f"holds its services' maintenance) cannot be reached from here: set it (HOST:PORT), or "
                             f"{HINT}")
        if env:
            return ConsulTarget(env, f"CONSUL_HTTP_ADDR (no host of {loaded.path} sets consul_http_addr)",
                                token=_environment_token())
        raise UsageError(f"{loaded.path}: no host sets consul_http_addr, so no Consul agent can be reached from "
                         f"here: set it (HOST:PORT) in the inventory, or {HINT}")
    settings = chosen.settings.consul
    try:
        token = settings.operator_token() or _environment_token()
    except TokenError as exc:
        raise UsageError(f"{loaded.path}: {chosen.name}: {exc}") from None
    return ConsulTarget(settings.address, f"consul_http_addr of {chosen.name} in {loaded.path}",
                        scheme=settings.scheme, token=token, dc=settings.dc)


def node_of_unit(loaded, unit: str):
    """The model's :class:`cluster.model.Node` running IU ``unit``; UsageError naming the inventory and its IUs
    when none does."""
    from cluster.ansible import inventory as inventories

    cluster = inventories.cluster_of(loaded)
    for node in cluster.nodes():
        if any(iu.id == unit for iu in node.ius):
            return node
    known = sorted(iu.id for iu in cluster.ius())
    shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
    raise UsageError(f"{loaded.path}: no IU {unit!r} in the inventory (its IUs: {shown or 'none'}): name one of them, "
                     f"or {HINT}")


def announce(target: ConsulTarget | None) -> None:
    """One line on stderr saying which Consul agent is read when the operator did not type it."""
    from cli import app

    if target is not None and target.origin != "--consul":
        app.current().err_console.print(f"consul: {target.address} ({target.origin})", highlight=False)
