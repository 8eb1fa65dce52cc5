"""A client agent's link to the server: heartbeat, anti-entropy, request forwarding and token resolution.

Anti-entropy follows agent/local/state.go and https://developer.hashicorp.com/consul/docs/concept/
consistency ("Anti-entropy"): every local change is pushed at once, and a full sync repeats every
``ae_interval`` (Consul scales it with the cluster size, at least 1 minute), so a server that lost the
node's entries gets them back. Each service syncs with its own token: the token it was registered with
over the API, a file definition's ``token``, else ``acl.tokens.config_file_service_registration`` for file
services, else ``acl.tokens.default``; node-level entries sync with ``acl.tokens.agent`` (else default). A
sync the server refuses is logged ("blocked by ACLs") and retried at the next full sync: the service
stays out of the catalog, exactly the failure Consul shows without a registration token.
"""

from __future__ import annotations

import http.client
import json
import logging
import threading
import time
from urllib.parse import urlencode

from devconsul.acl import ALLOW_ALL, AclError, authorizer_from_export
from devconsul.agent import token_for
from devconsul.api_remote import key_check
from devconsul.httpapi import ApiError, Request, Response
from devconsul.remote import HEARTBEAT_S

log = logging.getLogger("devconsul.agent")
TOKEN_TTL_S = 30.0  # acl.token_ttl
FORWARD_SLACK_S = 30.0  # beyond a blocking query's ?wait
RETRY_FAIL_S = 15.0  # ae.StateSyncer retryFailIntv: a refused or failed sync is retried this soon


class ServerUnavailable(Exception):
    pass


class AgentLink:
    def __init__(self, server, settings, ae_interval: float = 60.0):
        self.server = server
        self.settings = settings
        self.addresses = settings.join_addresses()
        self.ae_interval = ae_interval
        self.joined = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pushed: dict[str, str] = {}  # service ID (or "" for the node) -> last payload pushed
        self._pushed_node_checks: set[str] = set()
        self._pushed_service_checks: dict[str, set[str]] = {}  # service ID -> its check IDs the server has
        self._push_tokens: dict[str, str] = {}  # a removed service is deregistered with the token it synced with
        self._tokens: dict[str, tuple[float, object]] = {}
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        for target, name in ((self._heartbeat_loop, "devconsul-heartbeat"), (self._sync_loop, "devconsul-ae")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self, leave: bool) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(3)
        if leave:
            try:
                self._member(leave=True)
                log.info("left the cluster (leave_on_terminate)")
            except ServerUnavailable as exc:
                log.warning("could not leave the cluster: %s", exc)

    # -- HTTP to the server ---------------------------------------------------------------------
    def call(self, method: str, path: str, body: object = None, token: str = "", query: str = "",
             headers: dict | None = None, timeout: float = 10.0) -> tuple[int, dict, bytes]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode() if body is not None else None
        sent = dict(headers or {})
        if token:
            sent["X-Consul-Token"] = token
        errors = []
        for address in self.addresses:
            host, _, port = address.rpartition(":")
            conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
            try:
                conn.request(method, path + (f"?{query}" if query else ""), body=data, headers=sent)
                resp = conn.getresponse()
                return resp.status, dict(resp.getheaders()), resp.read()
            except OSError as exc:
                errors.append(f"{address}: {exc}")
            finally:
                conn.close()
        raise ServerUnavailable("no Consul server answered (" + "; ".join(errors) + ")")

    def forward(self, req: Request) -> Response:
        """Relay a request the server answers (status, body and Consul headers unchanged)."""
        query = urlencode([(k, v) for k, vs in req.query.items() for v in vs])
        headers = {k: v for k, v in req.headers.items() if k in ("x-consul-token", "authorization", "content-type")}
        wait = 600.0 if req.has("index") else 0.0
        try:
            status, got, data = self.call(req.method, req.path, req.body, query=query, headers=headers,
                                          timeout=wait + FORWARD_SLACK_S)
        except ServerUnavailable as exc:
            raise ApiError(500, f"No known Consul servers: {exc}") from None
        keep = {k: v for k, v in got.items() if k.lower().startswith("x-consul") or k.lower() == "x-content-type-options"}
        return Response(status, raw=data, content_type=got.get("Content-Type", "application/json"), headers=keep)

    # -- ACL ------------------------------------------------------------------------------------
    def resolve(self, secret: str):
        if not self.settings.acl_enabled:
            return ALLOW_ALL
        now = time.monotonic()
        with self._lock:
            hit = self._tokens.get(secret)
        if hit is not None and now - hit[0] < TOKEN_TTL_S:
            return hit[1]
        try:
            status, _, data = self.call("GET", "/v1/internal/devconsul/acl/resolve", token=secret)
        except ServerUnavailable as exc:
            raise AclError(500, f"ACL resolution failed, no Consul server answered: {exc}") from None
        if status != 200:  # not cached: a token the role is about to create must work as soon as it exists
            raise AclError(status, data.decode(errors="replace"))
        result = authorizer_from_export(json.loads(data))
        with self._lock:
            self._tokens[secret] = (now, result)
        return result

    # -- membership -----------------------------------------------------------------------------
    def _member(self, leave: bool = False) -> None:
        node = self.server.catalog.node
        status, _, data = self.call("PUT", "/v1/internal/devconsul/member",
                                    {"Node": node.name, "Address": node.address, "ID": node.node_id,
                                     "KeyCheck": key_check(self.settings.gossip_key)},
                                    query="leave" if leave else "")
        if status != 200:
            raise ServerUnavailable(f"server refused the member: {data.decode(errors='replace')[:200]}")

    def _heartbeat_loop(self) -> None:
        failing = ""
        while not self._stop.is_set():
            try:
                self._member()
                if not self.joined.is_set():
                    log.info("joined the cluster through %s", ", ".join(self.addresses))
                    self.joined.set()
                failing = ""
            except ServerUnavailable as exc:
                if str(exc) != failing:  # once per distinct failure, not every second
                    log.error("cannot reach the servers: %s", exc)
                    failing = str(exc)
            self._stop.wait(HEARTBEAT_S)

    # -- anti-entropy ---------------------------------------------------------------------------
    def _sync_loop(self) -> None:
        seen, last_full, retry_at = -1, 0.0, None
        while not self._stop.wait(0.1):
            if not self.joined.is_set():
                continue
            version = self.server.state.version
            now = time.monotonic()
            full = now - last_full >= self.ae_interval or (retry_at is not None and now >= retry_at)
            if version == seen and not full:
                continue
            try:
                clean = self.sync(full)
                seen = version
                if full:
                    last_full = now
                retry_at = None if clean else now + RETRY_FAIL_S
            except ServerUnavailable as exc:
                log.warning("anti-entropy: %s", exc)
                retry_at = now + RETRY_FAIL_S

    def _token_for(self, svc) -> str:
        return token_for(self.server.agent_tokens, svc)

    def sync(self, full: bool) -> bool:
        """Push the node's services and checks (their catalog view) to the server; remove what went away.
        False when the server refused something (it is retried after ``RETRY_FAIL_S``)."""
        catalog = self.server.catalog
        with self.server.state.lock:
            node = catalog.node
            base = {"Node": node.name, "Address": node.address, "ID": node.node_id}
            wanted: dict[str, tuple[object, dict]] = {}
            for svc in catalog.services.values():
                if not svc.agent_local:
                    continue
                checks = [_check_payload(c) for c in catalog.service_checks(svc.id)]
                wanted[svc.id] = (svc, {**base, "SkipNodeUpdate": True, "Service": _service_payload(svc),
                                        "Checks": checks})
            node_checks = {c.check_id: _check_payload(c) for c in catalog.node_checks()}
        node_payload = {**base, "Checks": list(node_checks.values())}
        clean = self._push("", None, node_payload, full)
        for gone in self._pushed_node_checks - set(node_checks):
            clean &= self._remove({**base, "CheckID": gone}, self._token_for(None))
        self._pushed_node_checks = set(node_checks)
        for service_id, (svc, payload) in wanted.items():
            pushed = self._push(service_id, svc, payload, full)
            clean &= pushed
            # A register call adds and updates the checks it lists and never removes one (Consul's
            # agent/local/state.go deregisters each check the agent dropped): without this the end of
            # maintenance (its _service_maintenance check removed) never reached the server.
            have = {c["CheckID"] for c in payload["Checks"]}
            gone = self._pushed_service_checks.get(service_id, set()) - have
            for check_id in sorted(gone):
                if self._remove({**base, "CheckID": check_id}, self._token_for(svc)):
                    self._pushed_service_checks.get(service_id, set()).discard(check_id)
                else:
                    clean = False
            if pushed:
                self._pushed_service_checks[service_id] = have | (self._pushed_service_checks.get(service_id,
                                                                                                  set()) & gone)
        for service_id in [s for s in self._pushed if s and s not in wanted]:
            token = self._push_tokens.get(service_id) or self._token_for(None)
            if self._remove({**base, "ServiceID": service_id}, token):
                self._pushed.pop(service_id, None)
                self._push_tokens.pop(service_id, None)
                self._pushed_service_checks.pop(service_id, None)
            else:
                clean = False
        return clean

    def _push(self, key: str, svc, payload: dict, full: bool) -> bool:
        text = json.dumps(payload, sort_keys=True)
        if not full and self._pushed.get(key) == text:
            return True
        token = self._token_for(svc)
        status, _, data = self.call("PUT", "/v1/catalog/register", payload, token=token)
        if status == 200:
            self._pushed[key] = text
            self._push_tokens[key] = token
        else:
            self._pushed.pop(key, None)
            what = f"Service {svc.id!r}" if svc is not None else "Node info"
            log.warning("%s sync blocked by ACLs or refused (%d): %s", what, status,
                        data.decode(errors="replace")[:200])
        return status == 200

    def _remove(self, payload: dict, token: str) -> bool:
        status, _, data = self.call("PUT", "/v1/catalog/deregister", payload, token=token)
        if status != 200:
            log.warning("deregistration of %s refused (%d): %s", payload, status, data.decode(errors="replace")[:200])
        return status == 200


def _service_payload(svc) -> dict:
    return {"ID": svc.id, "Name": svc.name, "Tags": list(svc.tags), "Address": svc.address, "Port": svc.port,
            "Meta": dict(svc.meta), "Weights": dict(svc.weights), "EnableTagOverride": svc.enable_tag_override}


def _check_payload(check) -> dict:
    return {"CheckID": check.check_id, "Name": check.name, "Status": check.synced_status,
            "Output": check.synced_output, "Notes": check.notes, "ServiceID": check.service_id, "Type": check.type}
