"""``/v1/health/*``, ``/v1/catalog/*`` and ``/v1/status/*`` reads, all blocking-capable.

- ``/v1/health/service/:service``: one entry per instance with its Node, Service and Checks (node-level
  checks first, ``serfHealth`` included); ``?passing`` keeps entries whose checks are ALL passing, so a
  warning drops the instance too; every ``?tag`` must match (case-insensitively, as Consul compares);
  https://developer.hashicorp.com/consul/api-docs/health#list-service-instances-for-service
- ``/v1/health/checks/:service``, ``/v1/health/state/:state`` (any|passing|warning|critical),
  ``/v1/health/node/:node``; https://developer.hashicorp.com/consul/api-docs/health
- ``/v1/catalog/services|service/:service|nodes|node/:node|datacenters``;
  https://developer.hashicorp.com/consul/api-docs/catalog
- ``/v1/status/leader|peers``; https://developer.hashicorp.com/consul/api-docs/status
- ``/v1/operator/autopilot/health`` (one server: itself, healthy, FailureTolerance 0)
``?filter`` (:mod:`devconsul.bexpr`, Consul's filter language:
https://developer.hashicorp.com/consul/api-docs/features/filtering) works on ``/v1/health/service/:service``,
the three check lists (``/v1/health/checks/:service``, ``/v1/health/state/:state``, ``/v1/health/node/:node``)
and ``/v1/catalog/service/:service``, with the selectors those pages list (Node.*, Service.ID/Service/Tags/
Meta/Port/Address, Checks.* for a service's health; Node, CheckID, Name, Status, ServiceID, ServiceName,
ServiceTags, ... for a check; ID, Node, ServiceID/ServiceTags/ServiceMeta/ServicePort/... for the catalog). On the other endpoints it is refused with 400 rather than silently ignored; ``?near`` is not
implemented.
"""

from __future__ import annotations

from devconsul import bexpr
from devconsul.api_agent import CONSUL_API_VERSION
from devconsul.authz import can, check_visible, filtered
from devconsul.httpapi import ApiError, Request, Response, blocking_read
from devconsul.watch import ANY_CATALOG, service

LEADER = "127.0.0.1:8300"


def _views(server):
    """``(node, services, checks)`` for the server's own node, then every other node (lock held)."""
    catalog = server.catalog
    local = [s for s in catalog.services.values() if server.local_synced(s)]
    ids = {s.id for s in local}
    out = [(catalog.node, local, [c for c in catalog.checks.values() if not c.service_id or c.service_id in ids])]
    remote = getattr(server, "remote", None)
    for name in sorted(remote.nodes if remote else ()):
        entry = remote.nodes[name]
        out.append((entry.node, list(entry.services.values()), list(entry.checks.values())))
    return out


def _by_id(checks):
    return sorted(checks, key=lambda c: c.check_id)


def _match(svc, name: str, tags: list[str]) -> bool:
    have = {t.lower() for t in svc.tags}
    return svc.name == name and all(t.lower() in have for t in tags)


def handle_health(server, req: Request, rest: str) -> Response:
    kind, _, arg = rest.partition("/")
    _reads_only(req, filterable=kind in ("service", "checks", "state", "node") and bool(arg))
    catalog = server.catalog
    if kind == "service" and arg:
        passing = req.flag("passing")
        tags = req.query.get("tag", [])
        flt = bexpr.parse(req.get("filter"), bexpr.HEALTH_SERVICE_FIELDS) if req.get("filter") else None

        def build() -> Response:
            entries, dropped = [], False
            for node, services, checks in _views(server):
                for svc in sorted((s for s in services if _match(s, arg, tags)), key=lambda s: s.id):
                    if not (can(req, "service", "read", svc.name) and can(req, "node", "read", node.name)):
                        dropped = True
                        continue
                    mine = _by_id(c for c in checks if not c.service_id) + _by_id(
                        c for c in checks if c.service_id == svc.id)
                    if passing and any(c.synced_status != "passing" for c in mine):
                        continue
                    entry = {"Node": node.to_api(), "Service": svc.node_service_api(),
                             "Checks": [c.api() for c in mine]}
                    if flt is None or bexpr.evaluate(flt, entry):  # after the ACL filter, as in Consul
                        entries.append(entry)
            return filtered(Response(payload=entries), dropped)

        return blocking_read(server, req, lambda: catalog.service_index(arg), build, service(arg))
    if kind in ("checks", "state", "node") and arg:
        if kind == "state" and arg not in ("any", "passing", "warning", "critical"):
            raise ApiError(400, f"Invalid state: {arg}")
        check_filter = bexpr.parse(req.get("filter"), bexpr.HEALTH_CHECK_FIELDS) if req.get("filter") else None

        def wanted(node, check) -> bool:
            if kind == "checks":
                return check.service_name == arg
            if kind == "state":
                return arg == "any" or check.synced_status == arg
            return node.name == arg

        def build_checks() -> Response:
            found, dropped = [], False
            for node, _, checks in _views(server):
                for check in _by_id(checks):
                    if not wanted(node, check):
                        continue
                    if not check_visible(req, check):
                        dropped = True
                        continue
                    shown = check.api()
                    if check_filter is None or bexpr.evaluate(check_filter, shown):  # after the ACL filter
                        found.append(shown)
            return filtered(Response(payload=found), dropped)

        return blocking_read(server, req, lambda: catalog.checks_index, build_checks, ANY_CATALOG)
    raise ApiError(404, "404 page not found")


def handle_catalog(server, req: Request, rest: str) -> Response:
    kind, _, arg = rest.partition("/")
    _reads_only(req, filterable=kind == "service" and bool(arg))
    catalog = server.catalog
    if kind == "services" and not arg:
        def build_services() -> Response:
            out: dict[str, set[str]] = {}
            dropped = False
            for _, services, _ in _views(server):
                for svc in services:
                    if can(req, "service", "read", svc.name):
                        out.setdefault(svc.name, set()).update(svc.tags)
                    else:
                        dropped = True
            return filtered(Response(payload={k: sorted(v) for k, v in out.items()}), dropped)

        return blocking_read(server, req, lambda: catalog.services_index, build_services, ANY_CATALOG)
    if kind == "service" and arg:
        tags = req.query.get("tag", [])
        flt = bexpr.parse(req.get("filter"), bexpr.CATALOG_SERVICE_FIELDS) if req.get("filter") else None

        def build_service() -> Response:
            nodes, dropped = [], False
            for node, services, _ in _views(server):
                for svc in sorted((s for s in services if _match(s, arg, tags)), key=lambda s: s.id):
                    if not (can(req, "service", "read", svc.name) and can(req, "node", "read", node.name)):
                        dropped = True
                        continue
                    entry = svc.catalog_api(node)
                    if flt is None or bexpr.evaluate(flt, entry):  # after the ACL filter, as in Consul
                        nodes.append(entry)
            return filtered(Response(payload=nodes), dropped)

        return blocking_read(server, req, lambda: catalog.service_index(arg), build_service, service(arg))
    if kind == "nodes" and not arg:
        def build_nodes() -> Response:
            views = _views(server)
            seen = [node.to_api() for node, _, _ in views if can(req, "node", "read", node.name)]
            return filtered(Response(payload=seen), len(seen) < len(views))

        return blocking_read(server, req, lambda: catalog.nodes_index, build_nodes, ANY_CATALOG)
    if kind == "node" and arg:
        def build_node() -> Response:
            for node, services, _ in _views(server):
                if node.name == arg and can(req, "node", "read", node.name):
                    shown = {s.id: s.node_service_api() for s in services if can(req, "service", "read", s.name)}
                    return filtered(Response(payload={"Node": node.to_api(), "Services": shown}),
                                    len(shown) < len(services))
            return Response(payload=None)

        return blocking_read(server, req, catalog.node_services_index, build_node, ANY_CATALOG)
    if kind == "datacenters" and not arg:
        return Response(payload=["dc1"])
    raise ApiError(404, "404 page not found")


def handle_status(server, req: Request, rest: str) -> Response:
    _reads_only(req)
    if rest == "leader":
        return Response(payload=server.leader_address() or LEADER)
    if rest == "peers":
        return Response(payload=[server.leader_address() or LEADER])
    raise ApiError(404, "404 page not found")


def handle_operator(server, req: Request, rest: str) -> Response:
    """``GET /v1/operator/autopilot/health`` (operator:read; https://developer.hashicorp.com/consul/api-docs/
    operator/autopilot#read-health): what a rolling server restart checks before and after each server.
    devconsul has one server, its own leader, so the answer is that server, healthy, and a failure
    tolerance of 0 (a single-server cluster tolerates no server down)."""
    _reads_only(req)
    if rest != "autopilot/health":
        raise ApiError(404, "404 page not found")
    if not server.is_server:  # reached only through a server (client agents forward /v1/operator)
        raise ApiError(500, "devconsul: operator reads go to a server")
    node = server.catalog.node
    with server.state.lock:
        index = server.state.index
    me = {"ID": node.node_id, "Name": node.name, "Address": server.leader_address(), "SerfStatus": "alive",
          "Version": CONSUL_API_VERSION, "Leader": True, "LastContact": "0s", "LastTerm": 1, "LastIndex": index,
          "Healthy": True, "Voter": True, "StableSince": server.started_at}
    return Response(payload={"Healthy": True, "FailureTolerance": 0, "Servers": [me]})


def _reads_only(req: Request, filterable: bool = False) -> None:
    if req.method != "GET":
        raise ApiError(405, f"method {req.method} not allowed", {"Allow": "GET"})
    if req.has("filter") and not filterable:
        raise ApiError(400, "?filter expressions are not implemented by the dev server")
