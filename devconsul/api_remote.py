"""Server endpoints that client agents use: catalog writes and the stand-ins for Consul's RPC and gossip.

- ``PUT /v1/catalog/register`` and ``PUT /v1/catalog/deregister`` (https://developer.hashicorp.com/consul/
  api-docs/catalog, ACL Required ``node:write,service:write``): a service needs ``service:write`` on its name;
  the node itself (a new node, a changed address, node-level checks, or no ``SkipNodeUpdate``) needs
  ``node:write``, as catalog_endpoint.go's vetRegisterWithAuthorizer decides.
- ``PUT /v1/internal/devconsul/member`` (``?leave`` to leave): a client agent's heartbeat, standing in for
  Serf (see ``devconsul.remote``). Gossip is not ACL-protected in Consul but by the gossip key; here the
  agent proves it holds the same key (``KeyCheck``) or is refused as Consul refuses undecryptable gossip.
- ``GET /v1/internal/devconsul/acl/resolve``: a client agent resolves a request's token to rules, the
  stand-in for the ACL.TokenRead RPC that Consul's clients make (and cache for ``acl.token_ttl``).
These ``/v1/internal/devconsul`` paths are not Consul's API; only agents of this project call them.
"""

from __future__ import annotations

import hashlib
import hmac

from devconsul.acl import AclError
from devconsul.authz import check
from devconsul.definitions import DefinitionError, canonical
from devconsul.httpapi import ApiError, Request, Response
from devconsul.remote import DEREGISTER_FIELDS, NODE_FIELDS


def key_check(gossip_key: str) -> str:
    return hashlib.sha256(b"devconsul-gossip:" + gossip_key.encode()).hexdigest() if gossip_key else ""


def handle_catalog_write(server, req: Request, rest: str) -> Response:
    if req.method != "PUT":
        raise ApiError(405, f"method {req.method} not allowed", {"Allow": "PUT"})
    if not server.is_server:
        raise ApiError(500, "devconsul: catalog writes go to a server")
    body = req.json_body()
    remote = server.remote
    try:
        if rest == "register":
            _vet_register(server, req, canonical(body, NODE_FIELDS))
        else:
            _vet_deregister(server, req, canonical(body, DEREGISTER_FIELDS))
        name = str(canonical(body, ("Node",)).get("Node") or "")
        with server.state.lock:  # the node's entry before and after, to undo a write that is not durable
            before = remote.copy_node(name)
            topics = remote.register(body) if rest == "register" else remote.deregister(body)
            after = remote.copy_node(name)
    except DefinitionError as exc:
        raise ApiError(exc.status, str(exc)) from None
    server.finish_write(topics, lambda: remote.rollback(name, before, after))
    return Response(payload=True)


def _vet_register(server, req: Request, body: dict) -> None:
    node = str(body.get("Node") or "")
    service = body.get("Service")
    if isinstance(service, dict):
        name = next((v for k, v in service.items() if k.lower() in ("service", "name")), "")
        check(req, "service", "write", str(name))
    with server.state.lock:
        entry = server.remote.nodes.get(node)
        node_changes = (entry is None or not body.get("SkipNodeUpdate")
                        or entry.node.address != str(body.get("Address") or ""))
    checks = list(body.get("Checks") or []) + ([body["Check"]] if body.get("Check") else [])
    node_checks = any(isinstance(c, dict) and not (c.get("ServiceID") or c.get("service_id")) for c in checks)
    if node_changes or node_checks:
        check(req, "node", "write", node)


def _vet_deregister(server, req: Request, body: dict) -> None:
    node = str(body.get("Node") or "")
    with server.state.lock:
        entry = server.remote.nodes.get(node)
        svc = entry.services.get(str(body.get("ServiceID") or "")) if entry else None
        chk = entry.checks.get(str(body.get("CheckID") or "")) if entry else None
    if body.get("ServiceID") and svc is not None:
        check(req, "service", "write", svc.name)
    elif body.get("CheckID") and chk is not None and chk.service_id:
        check(req, "service", "write", chk.service_name)
    else:
        check(req, "node", "write", node)


def handle_internal(server, req: Request, rest: str) -> Response:
    if not server.is_server:
        raise ApiError(404, "404 page not found")
    try:
        return _internal(server, req, rest)
    except DefinitionError as exc:
        raise ApiError(exc.status, str(exc)) from None


def _internal(server, req: Request, rest: str) -> Response:
    if rest == "member" and req.method == "PUT":
        body = canonical(req.json_body(), ("Node", "Address", "ID", "KeyCheck"))
        if not hmac.compare_digest(str(body.get("KeyCheck") or ""), key_check(server.gossip_key)):
            raise ApiError(403, "No installed keys could decrypt the message" if server.gossip_key else
                           "Encryption is configured on the agent but not on this server")
        name = str(body.get("Node") or "")
        if not name:
            raise ApiError(400, "Missing node name")
        if req.has("leave"):
            server.members.left(name)
        else:
            server.members.alive(name, str(body.get("Address") or ""), str(body.get("ID") or ""))
        return Response(payload=True)
    if rest == "acl/resolve" and req.method == "GET":
        if server.acl is None:
            return Response(payload={"Disabled": True})
        try:
            return Response(payload=server.acl.resolve_export(req.token()))
        except AclError as exc:
            raise ApiError(exc.status, exc.reason) from None
    raise ApiError(404, "404 page not found")
