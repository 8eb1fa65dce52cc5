"""Path routing and the ACL decision for each endpoint.

With ACLs on (``--acl-token-file``) the token in the file is the only token and may do everything;
requests without a token act as Consul's anonymous token under ``default_policy = deny``. As in
Consul, what that means depends on the endpoint (https://developer.hashicorp.com/consul/api-docs/acl,
each page's "ACL Required" column): reads of a single object and every write answer 403; list reads
(KV ``?recurse``/``?keys``, catalog, health, agent services/checks/members) answer with the entries
the token may see, i.e. none, and ``X-Consul-Results-Filtered-By-ACLs: true``; ``/v1/status/*`` and
``/v1/catalog/datacenters`` need no token. An unknown token is a 403 "ACL not found" everywhere.
"""

from __future__ import annotations

import hmac

from devconsul import api_agent, api_health, api_kv, api_txn
from devconsul.httpapi import ApiError, Request, Response, permission_denied

OPEN, FILTER, DENY = "open", "filter", "deny"


def dispatch(server, req: Request) -> Response:
    authorize(server, req)
    return route(server, req)


def authorize(server, req: Request) -> None:
    """The ACL decision, from the path, method, query and token only (the server makes it before reading
    the request body)."""
    _authorize(server, req, *_acl_rule(req))


def route(server, req: Request) -> Response:
    path = req.path
    if path.startswith("/v1/kv/") or path == "/v1/kv":
        return api_kv.handle(server, req, path.removeprefix("/v1/kv").removeprefix("/"))
    if path == "/v1/txn":
        return api_txn.handle(server, req)
    if path.startswith("/v1/agent/"):
        return api_agent.handle(server, req, path.removeprefix("/v1/agent/"))
    if path.startswith("/v1/health/"):
        return api_health.handle_health(server, req, path.removeprefix("/v1/health/"))
    if path.startswith("/v1/catalog/"):
        return api_health.handle_catalog(server, req, path.removeprefix("/v1/catalog/"))
    if path.startswith("/v1/status/"):
        return api_health.handle_status(server, req, path.removeprefix("/v1/status/"))
    raise ApiError(404, "404 page not found\n")


def _acl_rule(req: Request) -> tuple[str, str, str]:
    """``(mode, permission, resource)`` for the anonymous token on this request."""
    path, reading = req.path, req.method == "GET"
    if path.startswith("/v1/status/") or path == "/v1/catalog/datacenters":
        return OPEN, "", ""
    if path.startswith("/v1/kv"):
        key = path.removeprefix("/v1/kv").removeprefix("/")
        if reading:
            return (FILTER, "key:read", key) if (req.has("recurse") or req.has("keys")) else (DENY, "key:read", key)
        return DENY, "key:write", key
    if path == "/v1/txn":
        return DENY, "key:write", ""
    if path.startswith(("/v1/health/", "/v1/catalog/")):
        return FILTER, "service:read", ""
    if path in ("/v1/agent/services", "/v1/agent/checks", "/v1/agent/members"):
        return FILTER, "service:read", ""
    if path == "/v1/agent/self":
        return DENY, "agent:read", ""
    if path.startswith("/v1/agent/service/") and reading:
        return DENY, "service:read", path.rsplit("/", 1)[-1]
    if path.startswith(("/v1/agent/service/", "/v1/agent/check/")):
        return DENY, "service:write", path.rsplit("/", 1)[-1]
    return DENY, "node:write", ""


def _authorize(server, req: Request, mode: str, permission: str, resource: str) -> None:
    if server.acl_token is None or mode == OPEN:
        return
    token = req.token()
    if token:
        if hmac.compare_digest(token.encode(), server.acl_token.encode()):
            return
        raise ApiError(403, "ACL not found")
    req.authorized = False
    if mode == FILTER:
        req.filtered = True
        return
    raise permission_denied(permission, resource)
