"""``/v1/acl/*``: policies and tokens (https://developer.hashicorp.com/consul/api-docs/acl/policies,
.../acl/tokens). Create is ``PUT /v1/acl/policy`` / ``PUT /v1/acl/token``; read, update and delete take the ID
in the path; ``GET /v1/acl/token/self`` reads the request's own token (no ``acl`` rule needed); the lists are
``/v1/acl/policies`` and ``/v1/acl/tokens``; ``PUT /v1/acl/bootstrap`` makes the first management token once
(https://developer.hashicorp.com/consul/api-docs/acl#bootstrap-acls: no rule; the body's optional
``BootstrapSecret`` becomes its SecretID). With ACLs off every path answers 401 "ACL support disabled",
as Consul does.
"""

from __future__ import annotations

from devconsul.acl import AclError
from devconsul.definitions import canonical
from devconsul.httpapi import ApiError, Request, Response

POLICY_FIELDS = ("ID", "Name", "Description", "Rules", "Datacenters")
TOKEN_FIELDS = ("AccessorID", "SecretID", "Description", "Policies", "Local")


def handle(server, req: Request, rest: str) -> Response:
    store = server.acl
    if store is None:
        raise ApiError(401, "ACL support disabled")
    try:
        return _route(server, store, req, rest)
    except AclError as exc:
        raise ApiError(exc.status, exc.reason) from None


def _body(req: Request, fields) -> dict:
    body = req.json_body()
    if not isinstance(body, dict):
        raise ApiError(400, "Request decode failed: body must be a JSON object")
    return canonical(body, fields)


def _route(server, store, req: Request, rest: str) -> Response:
    method = req.method
    if rest == "bootstrap":
        if method != "PUT":
            raise ApiError(405, f"method {method} not allowed")
        secret = _body(req, ("BootstrapSecret",)).get("BootstrapSecret") or ""
        return _changed(server, store.token_api(store.bootstrap(str(secret))))
    if rest == "policy" and method == "PUT":
        policy = store.put_policy(_body(req, POLICY_FIELDS))
        return _changed(server, policy.api())
    if rest == "policies" and method == "GET":
        with server.state.lock:
            return Response(payload=[p.listing() for p in store.policies.values()])
    if rest.startswith("policy/name/") and method == "GET":
        return Response(payload=store.policy(name=rest.removeprefix("policy/name/")).api())
    if rest.startswith("policy/"):
        policy_id = rest.removeprefix("policy/")
        if method == "GET":
            return Response(payload=store.policy(policy_id).api())
        if method == "PUT":
            return _changed(server, store.put_policy(_body(req, POLICY_FIELDS), policy_id).api())
        if method == "DELETE":
            store.delete_policy(policy_id)
            return _changed(server, True)
    if rest == "token" and method == "PUT":
        return _changed(server, store.token_api(store.put_token(_body(req, TOKEN_FIELDS))))
    if rest == "tokens" and method == "GET":
        with server.state.lock:
            return Response(payload=[store.token_api(t, with_secret=False) for t in store.tokens.values()])
    if rest == "token/self" and method == "GET":
        return Response(payload=store.token_api(store.token(secret=req.token())))
    if rest.startswith("token/"):
        accessor = rest.removeprefix("token/")
        if method == "GET":
            return Response(payload=store.token_api(store.token(accessor)))
        if method == "PUT":
            return _changed(server, store.token_api(store.put_token(_body(req, TOKEN_FIELDS), accessor)))
        if method == "DELETE":
            store.delete_token(accessor)
            return _changed(server, True)
    raise ApiError(405 if rest in ("policy", "token", "policies", "tokens") else 404,
                   f"method {method} not allowed" if rest in ("policy", "token") else "404 page not found")


def _changed(server, payload) -> Response:
    server.acl_changed()
    return Response(payload=payload)
