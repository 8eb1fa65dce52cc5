"""The server's view of the other nodes: catalog entries that client agents sync, and LAN membership.

Catalog writes follow https://developer.hashicorp.com/consul/api-docs/catalog ("Register Entity",
"Deregister Entity"); a client agent's anti-entropy uses exactly these (``devconsul.antientropy``), with
``SkipNodeUpdate`` for service syncs, as Consul's agent/local/state.go does.

Membership stands in for Serf/memberlist, which this server does not speak: a client agent reports itself
alive every ``HEARTBEAT_S`` over the server port (``devconsul.agentlink``). The leader then does what
Consul's leader reconcile does (agent/consul/leader.go): a new live member's node is registered with a
passing ``serfHealth``; a member silent for ``failure_timeout`` gets ``serfHealth`` critical ("Agent not live
or unreachable"), which takes every service instance on it out of ``?passing`` health reads; a member that
leaves (``leave_on_terminate``, ``consul leave``) is deregistered with all its services and checks.
memberlist's LAN defaults (ProbeInterval 1 s, ProbeTimeout 500 ms, SuspicionMult 4) declare a dead
node failed within about 5 s in a small cluster, which is the default here.
"""

from __future__ import annotations

import copy
import logging
import threading
import time
from dataclasses import dataclass, field

from devconsul.catalog import Catalog
from devconsul.definitions import DefinitionError, canonical, parse_service
from devconsul.records import SERF_CHECK_ID, Check, Node, Service

log = logging.getLogger("devconsul.members")
HEARTBEAT_S = 1.0
FAILURE_TIMEOUT_S = 5.0
NODE_FIELDS = ("ID", "Node", "Address", "TaggedAddresses", "NodeMeta", "Service", "Check", "Checks",
               "SkipNodeUpdate")
CHECK_FIELDS = ("Node", "CheckID", "ID", "Name", "Status", "Notes", "Output", "ServiceID", "Type", "Definition")
DEREGISTER_FIELDS = ("Node", "ServiceID", "CheckID")


@dataclass
class RemoteNode:
    node: Node
    services: dict[str, Service] = field(default_factory=dict)
    checks: dict[str, Check] = field(default_factory=dict)


@dataclass
class Member:
    name: str
    address: str
    node_id: str
    status: str = "alive"  # alive | failed | left
    last_seen: float = 0.0
    server: bool = False


class RemoteCatalog:
    """Other nodes' entries in the server's catalog; shares the catalog's lock and indexes."""

    def __init__(self, catalog: Catalog):
        self.catalog = catalog
        self.nodes: dict[str, RemoteNode] = {}

    # -- writes (state lock held by the callers in this module) --------------------------------
    def _bump(self, entry: RemoteNode | None, names: set[str], node_level: bool, services: bool, checks: bool):
        cat = self.catalog
        if entry is not None and node_level:
            names = names | {s.name for s in entry.services.values()}
        idx, topics = cat._bump(names, False, services, checks)
        if node_level:
            cat.nodes_index = idx
            topics.append(("catalog", ""))
        return idx, topics

    def register(self, payload: object) -> list:
        """``PUT /v1/catalog/register``: the node, then its service and checks; same content moves nothing."""
        body = canonical(payload, NODE_FIELDS)
        name = str(body.get("Node") or "")
        address = str(body.get("Address") or "")
        if not name or not address:
            raise DefinitionError("Must provide node and address" if not name else "Must provide address")
        if name == self.catalog.node.name:
            raise DefinitionError("devconsul: the server's own node is kept by its agent, not by catalog writes")
        topics: list = []
        with self.catalog.state.lock:
            entry = self.nodes.get(name)
            if entry is None or (not body.get("SkipNodeUpdate") and entry.node.address != address):
                node = Node(name, str(body.get("ID") or (entry.node.node_id if entry else "")), address)
                idx, more = self._bump(entry, set(), True, False, False)
                node.create_index = entry.node.create_index if entry else idx
                node.modify_index = idx
                if entry is None:
                    entry = self.nodes[name] = RemoteNode(node)
                else:
                    entry.node = node
                topics += more
            if body.get("Service"):
                defn = parse_service(_catalog_service(body["Service"]))
                svc = Service(defn.id, defn.name, defn.tags, defn.address, defn.port, defn.meta, defn.weights,
                              defn.enable_tag_override, defn.kind, defn.tagged_addresses)
                old = entry.services.get(svc.id)
                if old is None or not old.same_definition(svc):
                    idx, more = self._bump(None, {svc.name} | ({old.name} if old else set()), False, True, False)
                    svc.create_index, svc.modify_index = (old.create_index if old else idx), idx
                    entry.services[svc.id] = svc
                    topics += more
            checks = list(body.get("Checks") or []) + ([body["Check"]] if body.get("Check") else [])
            for raw in checks:
                topics += self._put_check(entry, canonical(raw, CHECK_FIELDS))
        return topics

    def _put_check(self, entry: RemoteNode, raw: dict) -> list:
        check_id = str(raw.get("CheckID") or raw.get("ID") or raw.get("Name") or "")
        if not check_id:
            raise DefinitionError("Missing check ID")
        service_id = str(raw.get("ServiceID") or "")
        svc = entry.services.get(service_id) if service_id else None
        if service_id and svc is None:
            raise DefinitionError(f"Unknown service ID '{service_id}' for check ID '{check_id}'")
        status = str(raw.get("Status") or "critical")
        check = Check(check_id, str(raw.get("Name") or check_id), entry.node.name, status=status,
                      output=str(raw.get("Output") or ""), notes=str(raw.get("Notes") or ""),
                      service_id=service_id, service_name=svc.name if svc else "",
                      service_tags=list(svc.tags) if svc else [], type=str(raw.get("Type") or ""),
                      synced_status=status, synced_output=str(raw.get("Output") or ""))
        old = entry.checks.get(check_id)
        if old is not None and old.api() | {"CreateIndex": 0, "ModifyIndex": 0} == check.api() | {
                "CreateIndex": 0, "ModifyIndex": 0}:
            return []
        idx, topics = self._bump(entry, {svc.name} if svc else set(), not service_id, False, True)
        check.create_index, check.modify_index = (old.create_index if old else idx), idx
        entry.checks[check_id] = check
        return topics

    def deregister(self, payload: object) -> list:
        """``PUT /v1/catalog/deregister``: a check, a service (with its checks) or the whole node."""
        body = canonical(payload, DEREGISTER_FIELDS)
        name = str(body.get("Node") or "")
        if not name:
            raise DefinitionError("Must provide node")
        with self.catalog.state.lock:
            entry = self.nodes.get(name)
            if entry is None:
                return []
            if body.get("CheckID"):
                check = entry.checks.pop(str(body["CheckID"]), None)
                if check is None:
                    return []
                return self._bump(entry, {check.service_name} if check.service_id else set(),
                                  not check.service_id, False, True)[1]
            if body.get("ServiceID"):
                svc = entry.services.pop(str(body["ServiceID"]), None)
                if svc is None:
                    return []
                for check_id in [c for c, chk in entry.checks.items() if chk.service_id == svc.id]:
                    del entry.checks[check_id]
                return self._bump(None, {svc.name}, False, True, True)[1]
            del self.nodes[name]
            names = {s.name for s in entry.services.values()}
            return self._bump(None, names, True, True, True)[1]

    # -- undo (a client agent's write that could not be made durable) ------------------------------
    def copy_node(self, name: str) -> RemoteNode | None:
        """A copy of ``name``'s entry (None: no such node), taken before and after a write; lock held."""
        entry = self.nodes.get(name)
        if entry is None:
            return None
        return RemoteNode(copy.copy(entry.node), {k: copy.copy(v) for k, v in entry.services.items()},
                          {k: copy.copy(v) for k, v in entry.checks.items()})

    def rollback(self, name: str, before: RemoteNode | None, after: RemoteNode | None) -> list:
        """Put ``name``'s entry back as it was before the write, unless a later write changed it since
        (that write stands); lock held."""
        if before == after or self.nodes.get(name) != after:
            return []
        if before is None:
            del self.nodes[name]
        else:
            self.nodes[name] = before
        names = {s.name for entry in (before, after) if entry is not None for s in entry.services.values()}
        return self._bump(None, names, True, True, True)[1]

    def set_serf(self, name: str, status: str, output: str) -> list:
        with self.catalog.state.lock:
            entry = self.nodes.get(name)
            if entry is None:
                return []
            return self._put_check(entry, {"CheckID": SERF_CHECK_ID, "Name": "Serf Health Status",
                                           "Status": status, "Output": output})

    # -- persistence ----------------------------------------------------------------------------
    def snapshot(self) -> list:
        from dataclasses import asdict

        return [{"node": asdict(e.node), "services": [asdict(s) for s in e.services.values()],
                 "checks": [c.to_record() for c in e.checks.values()]} for e in self.nodes.values()]

    def restore(self, snap: list) -> None:
        for rec in snap:
            entry = RemoteNode(Node(**rec["node"]))
            entry.services = {s["id"]: Service(**s) for s in rec["services"]}
            entry.checks = {c["check_id"]: Check.from_record(c) for c in rec["checks"]}
            self.nodes[entry.node.name] = entry


class Membership:
    """Live, failed and left client agents; a thread turns silence into a failed member."""

    def __init__(self, server, failure_timeout: float = FAILURE_TIMEOUT_S):
        self.server = server
        self.failure_timeout = failure_timeout
        self.members: dict[str, Member] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._watch, name="devconsul-members", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2)

    def alive(self, name: str, address: str, node_id: str) -> None:
        remote = self.server.remote
        with self.server.state.lock:
            member = self.members.get(name)
            was = member.status if member else None
            self.members[name] = Member(name, address, node_id, "alive", time.monotonic())
            topics = []
            if was != "alive" or name not in remote.nodes:
                log.info("member %s (%s) is alive", name, address)
                topics = remote.register({"Node": name, "Address": address, "ID": node_id})
                topics += remote.set_serf(name, "passing", "Agent alive and reachable")
        self.server.finish_write(topics)

    def left(self, name: str) -> None:
        with self.server.state.lock:
            if name in self.members:
                self.members[name].status = "left"
            log.info("member %s left the cluster: deregistering its node", name)
            topics = self.server.remote.deregister({"Node": name})
        self.server.finish_write(topics)

    def _watch(self) -> None:
        while not self._stop.wait(min(0.5, self.failure_timeout / 4)):
            now = time.monotonic()
            for member in list(self.members.values()):
                if member.status == "alive" and now - member.last_seen > self.failure_timeout:
                    member.status = "failed"
                    log.warning("member %s failed: no heartbeat for %.1fs", member.name, now - member.last_seen)
                    topics = self.server.remote.set_serf(member.name, "critical", "Agent not live or unreachable")
                    self.server.finish_write(topics)

    def api(self) -> list[dict]:
        status = {"alive": 1, "left": 3, "failed": 4}
        return [{"Name": m.name, "Addr": m.address, "Port": 8301, "Status": status[m.status],
                 "Tags": {"role": "node", "dc": "dc1", "id": m.node_id}} for m in self.members.values()]


def _catalog_service(payload: object) -> object:
    """A catalog registration's service in the agent definition's shape: the catalog names the service in
    ``Service`` (https://developer.hashicorp.com/consul/api-docs/catalog#service), an agent definition in
    ``Name`` (this project's client agents send that one)."""
    if not isinstance(payload, dict):
        return payload
    named = next((v for k, v in payload.items() if k.lower() == "service"), None)
    if named is None or any(k.lower() == "name" for k in payload):
        return payload
    return {**{k: v for k, v in payload.items() if k.lower() != "service"}, "Name": named}
