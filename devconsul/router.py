"""Path routing: forwarding on client agents, token resolution, then one module per endpoint.

:func:`dispatch` is :func:`authorize` then :func:`route`; the HTTP server calls them apart, reading the
request body in between, so that a request the token may not make never has its body read.

A client agent (``server = false``) answers ``/v1/agent/*`` itself and forwards everything else (KV, txn,
health, catalog, status, ACL) to a server, as Consul's clients forward those RPCs; the server authorizes
the forwarded request with its token. Otherwise the request's token is resolved once (``req.authz``;
an unknown token is a 403 "ACL not found") and the endpoint rules of ``devconsul.authz`` apply.
"""

from __future__ import annotations

from devconsul import api_acl, api_agent, api_health, api_kv, api_remote, api_txn, authz
from devconsul.acl import AclError
from devconsul.httpapi import ApiError, Request, Response

OPEN_PATHS = ("/v1/status/", "/v1/catalog/datacenters", "/v1/internal/devconsul/")
LOCAL_ON_CLIENTS = ("/v1/agent/",)


def dispatch(server, req: Request) -> Response:
    authorize(server, req)
    return route(server, req)


def forwarded(server, req: Request) -> bool:
    """Whether a client agent forwards this request to a server (which authorizes it with its token)."""
    path = req.path
    return server.link is not None and (not path.startswith(LOCAL_ON_CLIENTS) or path == "/v1/agent/members")


def authorize(server, req: Request) -> None:
    """The ACL decision, from the path, method, query and token only (the server makes it before reading
    the request body): the token is resolved (``req.authz``) and the endpoint's rule applied."""
    if forwarded(server, req) or req.path.startswith(OPEN_PATHS):
        return
    try:
        req.authz = server.resolve_token(req.token())
    except AclError as exc:
        raise ApiError(exc.status, exc.reason) from None
    # a token that may read nothing has nothing to wait for: its blocking queries are answered at once
    req.sees_nothing = req.authz.sees_nothing()
    authz.require(server, req)


def route(server, req: Request) -> Response:
    """The endpoint, once :func:`authorize` passed and the body is read."""
    path = req.path
    if forwarded(server, req):
        return server.link.forward(req)
    if not path.startswith(OPEN_PATHS):
        authz.require_body(server, req)
    if path.startswith("/v1/kv/") or path == "/v1/kv":
        return api_kv.handle(server, req, path.removeprefix("/v1/kv").removeprefix("/"))
    if path == "/v1/txn":
        return api_txn.handle(server, req)
    if path.startswith("/v1/agent/"):
        return api_agent.handle(server, req, path.removeprefix("/v1/agent/"))
    if path.startswith("/v1/health/"):
        return api_health.handle_health(server, req, path.removeprefix("/v1/health/"))
    if path in ("/v1/catalog/register", "/v1/catalog/deregister"):
        return api_remote.handle_catalog_write(server, req, path.removeprefix("/v1/catalog/"))
    if path.startswith("/v1/catalog/"):
        return api_health.handle_catalog(server, req, path.removeprefix("/v1/catalog/"))
    if path.startswith("/v1/status/"):
        return api_health.handle_status(server, req, path.removeprefix("/v1/status/"))
    if path.startswith("/v1/operator/"):
        return api_health.handle_operator(server, req, path.removeprefix("/v1/operator/"))
    if path.startswith("/v1/acl/"):
        return api_acl.handle(server, req, path.removeprefix("/v1/acl/"))
    if path.startswith("/v1/internal/devconsul/"):
        return api_remote.handle_internal(server, req, path.removeprefix("/v1/internal/devconsul/"))
    raise ApiError(404, "404 page not found\n")
