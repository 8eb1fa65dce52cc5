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
``?filter`` (:mod:`devconsul.bexpr`, Consul's filter language:
https://developer.hashicorp.com/consul/api-docs/features/filtering) works on ``/v1/health/service/:service``
and ``/v1/catalog/service/:service``, with the selectors those pages list (Node.*, Service.ID/Service/Tags/
Meta/Port/Address, Checks.* for health; ID, Node, ServiceID/ServiceTags/ServiceMeta/ServicePort/... for the
catalog). On the other endpoints it is refused with 400 rather than silently ignored; ``?near`` is not
implemented.
"""

from __future__ import annotations

from devconsul import bexpr
from devconsul.httpapi import ApiError, Request, Response, blocking_read
from devconsul.watch import ANY_CATALOG, service

LEADER = "127.0.0.1:8300"


def handle_health(server, req: Request, rest: str) -> Response:
    kind, _, arg = rest.partition("/")
    _reads_only(req, filterable=kind == "service" and bool(arg))
    catalog = server.catalog
    if kind == "service" and arg:
        passing = req.flag("passing")
        tags = req.query.get("tag", [])
        flt = bexpr.parse(req.get("filter"), bexpr.HEALTH_SERVICE_FIELDS) if req.get("filter") else None

        def build() -> Response:
            entries = []
            for svc in catalog.instances(arg, tags):
                checks = catalog.node_checks() + catalog.service_checks(svc.id)
                if passing and any(c.synced_status != "passing" for c in checks):
                    continue
                entry = {
                    "Node": catalog.node.to_api(),
                    "Service": svc.node_service_api(),
                    "Checks": [c.api() for c in checks],
                }
                if flt is None or bexpr.evaluate(flt, entry):
                    entries.append(entry)
            return Response(payload=[] if req.filtered else entries)

        return blocking_read(server, req, lambda: catalog.service_index(arg), build, service(arg))
    if kind == "checks" and arg:
        def build_checks() -> Response:
            checks = [c.api() for c in sorted(catalog.checks.values(), key=lambda c: c.check_id)
                      if c.service_name == arg]
            return Response(payload=[] if req.filtered else checks)

        return blocking_read(server, req, lambda: catalog.checks_index, build_checks, ANY_CATALOG)
    if kind == "state" and arg:
        if arg not in ("any", "passing", "warning", "critical"):
            raise ApiError(400, f"Invalid state: {arg}")

        def build_state() -> Response:
            checks = [c.api() for c in sorted(catalog.checks.values(), key=lambda c: c.check_id)
                      if arg == "any" or c.synced_status == arg]
            return Response(payload=[] if req.filtered else checks)

        return blocking_read(server, req, lambda: catalog.checks_index, build_state, ANY_CATALOG)
    if kind == "node" and arg:
        def build_node() -> Response:
            checks = [c.api() for c in sorted(catalog.checks.values(), key=lambda c: c.check_id)]
            return Response(payload=checks if arg == catalog.node.name and not req.filtered else [])

        return blocking_read(server, req, lambda: catalog.checks_index, build_node, ANY_CATALOG)
    raise ApiError(404, "404 page not found")


def handle_catalog(server, req: Request, rest: str) -> Response:
    kind, _, arg = rest.partition("/")
    _reads_only(req, filterable=kind == "service" and bool(arg))
    catalog = server.catalog
    if kind == "services" and not arg:
        def build_services() -> Response:
            out: dict[str, list[str]] = {}
            for svc in catalog.services.values():
                out.setdefault(svc.name, [])
                out[svc.name] = sorted(set(out[svc.name]) | set(svc.tags))
            return Response(payload={} if req.filtered else out)

        return blocking_read(server, req, lambda: catalog.services_index, build_services, ANY_CATALOG)
    if kind == "service" and arg:
        tags = req.query.get("tag", [])
        flt = bexpr.parse(req.get("filter"), bexpr.CATALOG_SERVICE_FIELDS) if req.get("filter") else None

        def build_service() -> Response:
            nodes = [s.catalog_api(catalog.node) for s in catalog.instances(arg, tags)]
            nodes = [n for n in nodes if flt is None or bexpr.evaluate(flt, n)]
            return Response(payload=[] if req.filtered else nodes)

        return blocking_read(server, req, lambda: catalog.service_index(arg), build_service, service(arg))
    if kind == "nodes" and not arg:
        return blocking_read(server, req, lambda: catalog.nodes_index,
                             lambda: Response(payload=[] if req.filtered else [catalog.node.to_api()]), ANY_CATALOG)
    if kind == "node" and arg:
        def build_node() -> Response:
            if arg != catalog.node.name or req.filtered:
                return Response(payload=None)
            services = {s.id: s.node_service_api() for s in catalog.services.values()}
            return Response(payload={"Node": catalog.node.to_api(), "Services": services})

        return blocking_read(server, req, lambda: catalog.services_index, build_node, ANY_CATALOG)
    if kind == "datacenters" and not arg:
        return Response(payload=["dc1"])
    raise ApiError(404, "404 page not found")


def handle_status(server, req: Request, rest: str) -> Response:
    _reads_only(req)
    if rest == "leader":
        return Response(payload=LEADER)
    if rest == "peers":
        return Response(payload=[LEADER])
    raise ApiError(404, "404 page not found")


def _reads_only(req: Request, filterable: bool = False) -> None:
    if req.method != "GET":
        raise ApiError(405, f"method {req.method} not allowed", {"Allow": "GET"})
    if req.has("filter") and not filterable:
        raise ApiError(400, "?filter expressions are not implemented by the dev server")
