"""The ACL decision for each endpoint, from each API page's "ACL Required" column
(https://developer.hashicorp.com/consul/api-docs/agent, .../agent/service, .../agent/check, .../catalog,
.../health, .../kv, .../txn, .../acl).

The router resolves the request's token once (``req.authz``) and calls :func:`require` for endpoints that
act on one object: a denial there is a 403 with Consul's "Permission denied" text. Endpoints that list
objects (agent services/checks/members, catalog, health, KV ``?recurse``/``?keys``) filter instead: an entry
the token may not read is dropped and the answer carries ``X-Consul-Results-Filtered-By-ACLs: true``
(:func:`filtered`). ``/v1/status/*`` and ``/v1/catalog/datacenters`` need no token.
"""

from __future__ import annotations

from devconsul.acl import ALLOW_ALL, AclError, Authorizer
from devconsul.httpapi import ApiError, Request, Response

FILTERED_HEADER = "X-Consul-Results-Filtered-By-ACLs"


def authz(req: Request) -> Authorizer:
    return getattr(req, "authz", None) or ALLOW_ALL


def check(req: Request, resource: str, access: str, segment: str = "") -> None:
    try:
        authz(req).require(resource, access, segment)
    except AclError as exc:
        raise ApiError(exc.status, exc.reason) from None


def can(req: Request, resource: str, access: str, segment: str = "") -> bool:
    return authz(req).allowed(resource, access, segment)


def filtered(resp: Response, dropped: bool) -> Response:
    if dropped:
        resp.headers[FILTERED_HEADER] = "true"
    return resp


def check_visible(req: Request, check) -> bool:
    """A health check is readable with service:read on its service, node:read on a node check."""
    if check.service_id:
        return can(req, "service", "read", check.service_name) and can(req, "node", "read", check.node)
    return can(req, "node", "read", check.node)


BODY_RULES = ("/v1/agent/service/register", "/v1/agent/check/register")


def require(server, req: Request) -> None:
    """Enforce the rule of a single-object endpoint (list endpoints filter in their own module), from the
    path, method, query and token only: the server calls this before it reads the request body. The two
    register endpoints name their object in the body: here a token that may write no service (or, for a
    check, no service and not the node) is refused; :func:`require_body` decides once the body is read."""
    path = req.path
    if path == "/v1/agent/service/register":
        if not authz(req).grants_any("service", "write"):
            check(req, "service", "write", "")
        return
    if path == "/v1/agent/check/register":
        if not (authz(req).grants_any("service", "write") or can(req, "node", "write", server.catalog.node.name)):
            check(req, "node", "write", server.catalog.node.name)
        return
    _require(server, req)


def require_body(server, req: Request) -> None:
    """The rule of the endpoints whose object is named in the body (after :func:`require`, body read)."""
    if req.path in BODY_RULES:
        _require(server, req)


def _require(server, req: Request) -> None:
    path, reading = req.path, req.method in ("GET", "HEAD")
    node = server.catalog.node.name
    if path.startswith("/v1/kv"):
        key = path.removeprefix("/v1/kv").removeprefix("/")
        if reading and not (req.has("recurse") or req.has("keys")):
            check(req, "key", "read", key)
        elif not reading:
            check(req, "key", "write", key)
        return
    if path.startswith("/v1/acl/"):
        if path in ("/v1/acl/token/self", "/v1/acl/bootstrap"):  # no rule: Consul's "ACL Required: none"
            return
        check(req, "acl", "read" if reading else "write")
        return
    if path.startswith("/v1/operator/"):
        check(req, "operator", "read" if reading else "write")
        return
    if path.startswith("/v1/agent/token/"):
        check(req, "acl", "write")
        return
    if path == "/v1/agent/self":
        check(req, "agent", "read", node)
    elif path in ("/v1/agent/reload", "/v1/agent/leave") or path.startswith("/v1/agent/join/"):
        check(req, "agent", "write", node)
    elif path == "/v1/agent/maintenance":
        check(req, "node", "write", node)
    elif path == "/v1/agent/service/register":
        # agent.go's vetServiceRegisterWithAuthorizer: the new name, and the name of the service it replaces
        body = req.json_body()
        name = body.get("Name") or body.get("name") if isinstance(body, dict) else None
        check(req, "service", "write", str(name or ""))
        service_id = (body.get("ID") or body.get("id") or name) if isinstance(body, dict) else None
        with server.state.lock:
            existing = server.catalog.services.get(str(service_id or ""))
        if existing is not None:
            check(req, "service", "write", existing.name)
    elif path.startswith("/v1/agent/service/"):
        service_id = path.rsplit("/", 1)[-1]
        with server.state.lock:
            svc = server.catalog.services.get(service_id)
        # an unknown ID falls through to the endpoint's 404 once the token may write some service
        name = svc.name if svc is not None else service_id
        check(req, "service", "read" if reading else "write", name)
    elif path.startswith("/v1/agent/check/"):
        _require_check(server, req, path)


def _require_check(server, req: Request, path: str) -> None:
    if path == "/v1/agent/check/register":
        body = req.json_body()
        service_id = ""
        if isinstance(body, dict):
            service_id = str(next((v for k, v in body.items() if k.lower().replace("_", "") == "serviceid"), ""))
        with server.state.lock:
            svc = server.catalog.services.get(service_id) if service_id else None
        if service_id:
            check(req, "service", "write", svc.name if svc else service_id)
        else:
            check(req, "node", "write", server.catalog.node.name)
        return
    check_id = path.rsplit("/", 1)[-1]
    with server.state.lock:
        chk = server.catalog.checks.get(check_id)
    if chk is not None and chk.service_id:
        check(req, "service", "write", chk.service_name)
    else:
        check(req, "node", "write", server.catalog.node.name)
