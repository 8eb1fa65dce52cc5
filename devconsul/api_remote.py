"""Server endpoints that client agents use: catalog writes and the stand-ins for Consul's RPC and gossip.

- ``PUT /v1/catalog/register`` and ``PUT /v1/catalog/deregister`` (https://developer.hashicorp.com/consul/
  api-docs/catalog, ACL Required ``node:write,service:write``): a service needs ``service:write`` on its name
  and on the name of the instance with its ID that it replaces, a check on another service of the node on
  that service's name; the node itself (a new node, a changed address, node-level checks, or no ``SkipNodeUpdate``) needs
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


def _field(obj: dict, *names: str) -> str:
    return str(next((v for k, v in obj.items() if k.lower() in names), "") or "")


def _vet_register(server, req: Request, body: dict) -> None:
    """catalog_endpoint.go's vetRegisterWithAuthorizer: ``service:write`` on the service's name and on the name
    of the service it overwrites (same ID on that node: "effectively a delete"); a service-level check on
    another service of the node needs ``service:write`` on that service's name;
    the node itself or a node-level check needs ``node:write``."""
    node = str(body.get("Node") or "")
    service = body.get("Service") if isinstance(body.get("Service"), dict) else None
    service_id = _field(service, "id") if service else ""
    if service is not None:
        check(req, "service", "write", _field(service, "service", "name"))
    checks = [c for c in list(body.get("Checks") or []) + ([body["Check"]] if body.get("Check") else [])
              if isinstance(c, dict)]
    with server.state.lock:
        entry = server.remote.nodes.get(node)
        node_changes = (entry is None or not body.get("SkipNodeUpdate")
                        or entry.node.address != str(body.get("Address") or ""))
        services = dict(entry.services) if entry else {}
    if service is not None and (overwritten := services.get(service_id or _field(service, "service", "name"))):
        check(req, "service", "write", overwritten.name)
    for chk in checks:
        target = _field(chk, "serviceid", "service_id")
        if not target or (service is not None and target == service_id):
            continue
        if target in services:  # an unknown ID is refused by the registration itself (remote.register)
            check(req, "service", "write", services[target].name)
    node_checks = any(not _field(c, "serviceid", "service_id") for c in checks)
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
