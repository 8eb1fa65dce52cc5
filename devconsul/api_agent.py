"""``/v1/agent/*``: self, members, services, checks, maintenance and TTL updates.

Pages: https://developer.hashicorp.com/consul/api-docs/agent, .../agent/service, .../agent/check.
Writes are PUT only (405 otherwise). ``pass``/``warn``/``fail`` take the output from ``?note``;
``/v1/agent/check/update/:id`` takes ``{"Status", "Output"}`` and refuses other statuses with 400.
"""

from __future__ import annotations

import functools

from devconsul.authz import can, check_visible, filtered
from devconsul.catalog import NotFound
from devconsul.definitions import STATUSES, DefinitionError, canonical, parse_check, parse_service
from devconsul.httpapi import ApiError, Request, Response

CONSUL_API_VERSION = "1.20.0"
# strconv.ParseBool
GO_TRUE = ("1", "t", "T", "TRUE", "true", "True")
GO_FALSE = ("0", "f", "F", "FALSE", "false", "False")  # the agent API generation this server follows


def _require(req: Request, method: str) -> None:
    if req.method != method:
        raise ApiError(405, f"method {req.method} not allowed", {"Allow": method})


def _write(server, apply) -> Response:
    """A write to this node's services and checks: durable, or undone and answered 500 "not applied"."""
    server.catalog_write(apply)
    return Response(raw=b"")


def _parse_enable(req: Request) -> bool:
    if not req.has("enable"):
        raise ApiError(400, "Missing value for enable")
    raw = req.get("enable")
    if raw in GO_TRUE:
        return True
    if raw in GO_FALSE:
        return False
    raise ApiError(400, f'Invalid value for enable: "{raw}"')


def handle(server, req: Request, rest: str) -> Response:
    catalog = server.catalog
    try:
        if rest == "self":
            _require(req, "GET")
            return Response(payload=_self(server))
        if rest == "members":
            _require(req, "GET")
            members = [_member(server)] + server.members_api()
            shown = [m for m in members if can(req, "node", "read", m["Name"])]
            return filtered(Response(payload=shown), len(shown) < len(members))
        if rest == "services":
            _require(req, "GET")
            with server.state.lock:
                local = [s for s in catalog.services.values() if s.agent_local]
                services = {s.id: s.agent_api() for s in local if can(req, "service", "read", s.name)}
            return filtered(Response(payload=services), len(services) < len(local))
        if rest == "checks":
            _require(req, "GET")
            with server.state.lock:
                every = list(catalog.checks.values())
                checks = {c.check_id: c.api(catalog_view=False) for c in every if check_visible(req, c)}
            return filtered(Response(payload=checks), len(checks) < len(every))
        if rest == "reload":
            _require(req, "PUT")
            server.reload()
            return Response(raw=b"")
        if rest == "leave":
            _require(req, "PUT")
            server.request_leave()
            return Response(raw=b"")
        if rest.startswith("token/"):
            _require(req, "PUT")
            body = canonical(req.json_body(), ("Token",))
            server.agent_tokens.set(rest.removeprefix("token/"), str(body.get("Token") or ""))
            return Response(raw=b"")
        if (req.method == "GET" and rest.startswith("service/") and rest != "service/register"
                and not rest.startswith(("service/deregister/", "service/maintenance/"))):
            _require(req, "GET")
            service_id = rest.removeprefix("service/")
            with server.state.lock:
                svc = catalog.services.get(service_id)
                if svc is None or not svc.agent_local:
                    raise ApiError(404, f"unknown service ID: {service_id}")
                return Response(payload={**svc.agent_api(), "ContentHash": f"{svc.modify_index:016x}"})
        if rest == "service/register":
            _require(req, "PUT")
            defn = parse_service(req.json_body())
            defn.token = defn.token or req.token()  # anti-entropy syncs it with the token it came with
            replace = req.has("replace-existing-checks") and req.get("replace-existing-checks") in ("", "true")
            return _write(server, lambda: catalog.register_service(defn, replace))
        if rest.startswith("service/deregister/"):
            _require(req, "PUT")
            return _write(server, lambda: catalog.deregister_service(rest.removeprefix("service/deregister/")))
        if rest.startswith("service/maintenance/"):
            _require(req, "PUT")
            service_id = rest.removeprefix("service/maintenance/")
            if not service_id:
                raise ApiError(400, "Missing service ID")
            enable = _parse_enable(req)
            return _write(server, lambda: catalog.service_maintenance(service_id, enable, req.get("reason")))
        if rest == "maintenance":
            _require(req, "PUT")
            enable = _parse_enable(req)
            return _write(server, lambda: catalog.node_maintenance(enable, req.get("reason")))
        if rest == "check/register":
            _require(req, "PUT")
            check_defn = parse_check(req.json_body())
            return _write(server, lambda: catalog.register_check(check_defn))
        if rest.startswith("check/deregister/"):
            _require(req, "PUT")
            return _write(server, lambda: catalog.deregister_check(rest.removeprefix("check/deregister/")))
        for verb, status in (("pass", "passing"), ("warn", "warning"), ("fail", "critical")):
            if rest.startswith(f"check/{verb}/"):
                _require(req, "PUT")
                check_id = rest.removeprefix(f"check/{verb}/")
                return _write(server, functools.partial(catalog.update_ttl, check_id, status, req.get("note")))
        if rest.startswith("check/update/"):
            _require(req, "PUT")
            update = canonical(req.json_body(), ("Status", "Output"))
            status = str(update.get("Status") or "")
            if status not in STATUSES:
                raise ApiError(400, f"Invalid check status: '{status}'")
            check_id = rest.removeprefix("check/update/")
            return _write(server, lambda: catalog.update_ttl(check_id, status, str(update.get("Output") or "")))
    except NotFound as exc:
        raise ApiError(404, str(exc)) from None
    except DefinitionError as exc:
        raise ApiError(exc.status, str(exc)) from None
    raise ApiError(404, "404 page not found")


def _self(server) -> dict:
    node = server.catalog.node
    return {
        "Config": {
            "Datacenter": "dc1",
            "PrimaryDatacenter": "dc1",
            "NodeName": node.name,
            "NodeID": node.node_id,
            "Revision": "devconsul",
            "Server": server.is_server,
            "Version": CONSUL_API_VERSION,
            "VersionMetadata": "devconsul",
            "BuildDate": "",
        },
        "DebugConfig": {"ACLsEnabled": server.acls_enabled, "DevMode": False},
        "Coord": {"Vec": [0.0] * 8, "Error": 1.5, "Adjustment": 0.0, "Height": 1e-05},
        "Member": _member(server),
        "Meta": {"consul-network-segment": ""},
        "Stats": {"devconsul": {"note": "a development server that follows Consul's HTTP API; it is not Consul"}},
    }


def _member(server) -> dict:
    node = server.catalog.node
    return {
        "Name": node.name,
        "Addr": node.address,
        "Port": 8301,
        "Tags": {
            "build": f"{CONSUL_API_VERSION}:devconsul", "dc": "dc1", "id": node.node_id, "port": "8300",
            "role": "consul" if server.is_server else "node", "vsn": "2", "vsn_max": "3", "vsn_min": "2",
        },
        "Status": 1,
        "ProtocolMin": 1, "ProtocolMax": 5, "ProtocolCur": 2,
        "DelegateMin": 2, "DelegateMax": 5, "DelegateCur": 4,
    }
