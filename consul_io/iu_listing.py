"""Every IU instance with its checks, kept current at a cost that does not grow with the number of nodes.

Each node's IUs are instances of its own service ``vllm-iu-<node>`` (decision 0021), and Consul's HTTP API
lists instances with their address, meta and checks one service name at a time
(``GET /v1/health/service/:service``). Reading every name on every refresh would cost a reader 2 + (number
of nodes) requests. :class:`IUListing` keeps each service's last listing and reads again only what Consul says
changed, from two requests that list the whole cluster:

- ``GET /v1/health/state/any`` (filtered to node checks and IU checks): every check with its node, service
  and ``ModifyIndex``, which Consul raises on each change of the check (status, output, definition). A service
  whose checks differ from the last refresh (one added, removed or modified), or that has an instance on a
  node whose node checks (``serfHealth``, node maintenance) differ, is read again.
- ``GET /v1/catalog/services``: the service names, and an index that moves whenever a service registration
  changes (a new or removed instance, a new address, port, tags or meta). The answer does not say which
  service changed, so when that index moved every IU service is read again; registrations change when a
  node is provisioned or an IU restarts, check states change far more often.

A steady refresh (nothing changed: a blocking query that ran out its wait) costs the two requests; one IU's
check flipping costs three, at any cluster size. Only documented endpoints and Consul's own ``filter``
language are used (https://developer.hashicorp.com/consul/api-docs/health#list-checks-in-state,
https://developer.hashicorp.com/consul/api-docs/catalog#list-services).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from consul_io import layout

# Node checks (no ServiceID) and the checks of every IU service: the only checks a listing's entries carry.
CHECKS_FILTER = f'ServiceID == "" or ServiceName matches "^{layout.IU_SERVICE_PREFIX}."'

Signature = frozenset


def _check_key(check: dict) -> tuple:
    return str(check.get("Node", "")), str(check.get("CheckID", "")), int(check.get("ModifyIndex") or 0)


def _signatures(checks: Iterable[dict]) -> tuple[dict[str, Signature], dict[str, Signature]]:
    """(IU service name -> its checks, node -> its node checks), each as a set of (node, check, ModifyIndex)."""
    services: dict[str, set] = {}
    nodes: dict[str, set] = {}
    for check in checks:
        if not isinstance(check, dict):
            continue
        if check.get("ServiceID"):
            name = str(check.get("ServiceName", ""))
            if layout.is_iu_service(name):
                services.setdefault(name, set()).add(_check_key(check))
        else:
            nodes.setdefault(str(check.get("Node", "")), set()).add(_check_key(check))
    return ({k: frozenset(v) for k, v in services.items()}, {k: frozenset(v) for k, v in nodes.items()})


def _nodes_of(entries: list) -> set[str]:
    return {str((e.get("Node") or {}).get("Node", "")) for e in entries if isinstance(e, dict)}


def all_passing(entry: dict) -> bool:
    """Consul's ``?passing``: every check of the entry (the node's and the instance's) is passing."""
    return all(c.get("Status") == "passing" for c in entry.get("Checks") or [])


class IUListing:
    """The last listing of each IU service and what it was read against (thread-safe; one per client)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.services_index: int | None = None
        self.service_checks: dict[str, Signature] = {}
        self.node_checks: dict[str, Signature] = {}
        self.entries: dict[str, list] = {}
        self.fetched = 0  # health/service reads made so far (what the benchmark and the tests count)

    def refresh(self, checks: list, services_index: int, names: Iterable[str],
                fetch: Callable[[str], list]) -> list:
        """Bring the listing up to ``checks`` (``health/state/any``) and the catalog's ``names`` at
        ``services_index`` (``catalog/services``), reading with ``fetch(name)`` only the services that
        changed; returns every IU entry, by service name. A ``fetch`` that raises leaves the listing as it
        was, so the next refresh reads the same services again."""
        service_checks, node_checks = _signatures(checks)
        wanted = sorted(n for n in names if layout.is_iu_service(n))
        with self.lock:
            if services_index != self.services_index:
                stale = set(wanted)
            else:
                moved = {n for n in set(node_checks) | set(self.node_checks)
                         if node_checks.get(n) != self.node_checks.get(n)}
                stale = {n for n in wanted if n not in self.entries
                         or service_checks.get(n) != self.service_checks.get(n)
                         or _nodes_of(self.entries[n]) & moved}
        read = {name: list(fetch(name) or []) for name in sorted(stale)}
        with self.lock:
            self.entries = {n: read[n] if n in read else self.entries.get(n, []) for n in wanted}
            self.services_index, self.service_checks, self.node_checks = services_index, service_checks, node_checks
            self.fetched += len(read)
            return [entry for name in wanted for entry in self.entries[name]]
