"""The single node's agent state and catalog: services, checks, maintenance, health views.

Agent operations follow ``agent/agent.go`` and ``agent/local/state.go`` of Consul:
- a service's check IDs default to ``service:<id>``, or ``service:<id>:<n>`` (1-based) when it has
  several; check names default to ``Service '<name>' check``; new checks start critical unless the
  definition gives a Status; re-registering keeps the status and output of checks that already exist;
- ``replace-existing-checks`` drops the service's checks that the new definition no longer has;
- maintenance adds a critical check ``_service_maintenance:<id>`` (``_node_maintenance`` for the node);
- an output-only check update reaches the catalog after ``check_update_interval`` (default 5 min),
  a status change at once.
Index rules for the health/catalog reads are in ``Catalog.service_index``.
"""

from __future__ import annotations

import copy
import random
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Protocol

from devconsul.definitions import CheckDefinition, DefinitionError, ServiceDefinition
from devconsul.records import (
    NODE_MAINT_CHECK_ID,
    SERF_CHECK_ID,
    SERVICE_MAINT_PREFIX,
    Check,
    Node,
    Service,
)
from devconsul.state import State
from devconsul.watch import Topic

DEFAULT_SERVICE_MAINT_REASON = (
    "Maintenance mode is enabled for this service, but no reason was provided. This is a default message."
)
DEFAULT_NODE_MAINT_REASON = (
    "Maintenance mode is enabled for this node, but no reason was provided. This is a default message."
)
OUTPUT_MAX = 4096  # checks.DefaultBufSize


class NotFound(DefinitionError):
    def __init__(self, reason: str):
        super().__init__(reason, status=404)


class CheckHooks(Protocol):
    def check_added(self, check: Check) -> None: ...
    def check_removed(self, check_id: str) -> None: ...
    def ttl_reset(self, check: Check) -> None: ...
    def sync_deferred(self, check: Check) -> None: ...


class _NoHooks:
    def check_added(self, check: Check) -> None: ...
    def check_removed(self, check_id: str) -> None: ...
    def ttl_reset(self, check: Check) -> None: ...
    def sync_deferred(self, check: Check) -> None: ...


@dataclass
class CatalogUndo:
    """The node's services and checks before a write and after it (shallow copies: records change only by
    attribute assignment). Taken under the lock around the write; a few dozen records on a node."""

    services: dict[str, Service]
    checks: dict[str, Check]
    after: tuple[dict[str, Service], dict[str, Check]] = field(default_factory=lambda: ({}, {}))


def _copies(records: dict) -> dict:
    return {key: copy.copy(record) for key, record in records.items()}


class Catalog:
    def __init__(self, state: State, node_name: str, check_update_interval: float = 300.0,
                 address: str = "127.0.0.1"):
        self.state = state
        self.node = Node(node_name, str(uuid.uuid4()), address)
        self.services: dict[str, Service] = {}
        self.checks: dict[str, Check] = {}
        self.services_index = 0
        self.checks_index = 0
        self.nodes_index = 0
        self.name_index: dict[str, int] = {}
        self.check_update_interval = check_update_interval
        self.hooks: CheckHooks = _NoHooks()

    # -- bookkeeping ----------------------------------------------------------------------------
    def _bump(self, names: set[str], node_level: bool, services: bool, checks: bool) -> tuple[int, list[Topic]]:
        idx = self.state.next_index()
        if services:
            self.services_index = idx
        if checks:
            self.checks_index = idx
        if node_level:
            names = names | {s.name for s in self.services.values()}
        for name in names:
            self.name_index[name] = idx
        topics: list[Topic] = [("catalog", n) for n in names]
        if node_level:
            topics.append(("catalog", ""))
        return idx, topics

    def bootstrap(self) -> list[Topic]:
        """What a fresh single-server Consul holds: its node, the ``consul`` service, ``serfHealth``."""
        with self.state.lock:
            idx = self.state.next_index()
            self.node.create_index = self.node.modify_index = self.nodes_index = idx
            consul = Service("consul", "consul", port=8300, agent_local=False)
            _, topics = self._put_service(consul)
            serf = Check(
                SERF_CHECK_ID, "Serf Health Status", self.node.name, status="passing",
                output="Agent alive and reachable", synced_status="passing",
                synced_output="Agent alive and reachable",
            )
            topics += self._put_check(serf)
            return topics

    def _put_service(self, svc: Service) -> tuple[bool, list[Topic]]:
        old = self.services.get(svc.id)
        if old is not None and old.same_definition(svc):
            old.token, old.source = svc.token, svc.source
            return False, []
        idx, topics = self._bump({svc.name} | ({old.name} if old else set()), False, True, False)
        svc.create_index = old.create_index if old else idx
        svc.modify_index = idx
        self.services[svc.id] = svc
        return True, topics

    def _put_check(self, check: Check) -> list[Topic]:
        old = self.checks.get(check.check_id)
        names = {check.service_name} if check.service_id else set()
        if old and old.service_id:
            names.add(old.service_name)
        if old is not None and old is not check and _same_view(old, check):
            check.create_index, check.modify_index = old.create_index, old.modify_index
            self.checks[check.check_id] = check
            self.state.touch()
            return []
        idx, topics = self._bump(names, not check.service_id, False, True)
        check.create_index = old.create_index if old else idx
        check.modify_index = idx
        self.checks[check.check_id] = check
        return topics

    def _drop_check(self, check_id: str) -> list[Topic]:
        check = self.checks.pop(check_id)
        _, topics = self._bump({check.service_name} if check.service_id else set(), not check.service_id, False, True)
        self.hooks.check_removed(check_id)
        return topics

    def _new_check(self, defn: CheckDefinition, check_id: str, name: str, svc: Service | None) -> Check:
        now = time.time()
        check = Check(
            check_id=check_id,
            name=name,
            node=self.node.name,
            status=defn.status or "critical",
            notes=defn.notes,
            service_id=svc.id if svc else "",
            service_name=svc.name if svc else "",
            service_tags=list(svc.tags) if svc else [],
            type=defn.kind,
            definition=defn,
        )
        prev = self.checks.get(check_id)
        if prev is not None:  # Consul restores status and output from its check-state snapshot
            check.status, check.output = prev.status, prev.output
            check.critical_since = prev.critical_since
        check.synced_status, check.synced_output = check.status, check.output
        if check.status == "critical" and check.critical_since is None:
            check.critical_since = now
        if defn.kind == "ttl":
            check.ttl_deadline = now + defn.ttl
        return check

    # -- services -------------------------------------------------------------------------------
    def register_service(self, defn: ServiceDefinition, replace_existing_checks: bool) -> list[Topic]:
        svc = Service(
            defn.id, defn.name, defn.tags, defn.address, defn.port, defn.meta, defn.weights,
            defn.enable_tag_override, defn.kind, defn.tagged_addresses, token=defn.token, source=defn.source,
        )
        with self.state.lock:
            _, topics = self._put_service(svc)
            wanted: set[str] = set()
            for n, chk in enumerate(defn.checks, start=1):
                check_id = chk.check_id or (f"service:{svc.id}" if len(defn.checks) == 1 else f"service:{svc.id}:{n}")
                wanted.add(check_id)
                check = self._new_check(chk, check_id, chk.name or f"Service '{svc.name}' check", svc)
                topics += self._put_check(check)
                self.hooks.check_added(check)
            if replace_existing_checks:
                for check in list(self.checks.values()):
                    if check.service_id == svc.id and check.check_id not in wanted and check.type != "maintenance":
                        topics += self._drop_check(check.check_id)
            return topics

    def deregister_service(self, service_id: str) -> list[Topic]:
        with self.state.lock:
            svc = self.services.get(service_id)
            if svc is None or not svc.agent_local:
                raise NotFound(
                    f'Unknown service ID "{service_id}". Ensure that the service ID is passed, not the service name.'
                )
            return self.remove_service(svc)

    def remove_service(self, svc: Service) -> list[Topic]:
        topics: list[Topic] = []
        for check in [c for c in self.checks.values() if c.service_id == svc.id]:
            topics += self._drop_check(check.check_id)
        del self.services[svc.id]
        _, more = self._bump({svc.name}, False, True, False)
        return topics + more

    def service_maintenance(self, service_id: str, enable: bool, reason: str) -> list[Topic]:
        with self.state.lock:
            svc = self.services.get(service_id)
            if svc is None or not svc.agent_local:
                raise NotFound(
                    f'Unknown service ID "{service_id}". Ensure that the service ID is passed, not the service name.'
                )
            check_id = SERVICE_MAINT_PREFIX + service_id
            return self._maintenance(check_id, enable, "Service Maintenance Mode",
                                     reason or DEFAULT_SERVICE_MAINT_REASON, svc)

    def node_maintenance(self, enable: bool, reason: str) -> list[Topic]:
        with self.state.lock:
            return self._maintenance(NODE_MAINT_CHECK_ID, enable, "Node Maintenance Mode",
                                     reason or DEFAULT_NODE_MAINT_REASON, None)

    def _maintenance(self, check_id: str, enable: bool, name: str, notes: str, svc: Service | None) -> list[Topic]:
        if not enable:
            return self._drop_check(check_id) if check_id in self.checks else []
        if check_id in self.checks:
            return []
        check = Check(
            check_id, name, self.node.name, notes=notes, type="maintenance",
            service_id=svc.id if svc else "", service_name=svc.name if svc else "",
            service_tags=list(svc.tags) if svc else [], critical_since=time.time(),
        )
        return self._put_check(check)

    # -- checks ---------------------------------------------------------------------------------
    def register_check(self, defn: CheckDefinition) -> list[Topic]:
        if not defn.name:
            raise DefinitionError("Missing check name")
        with self.state.lock:
            svc = None
            if defn.service_id:
                svc = self.services.get(defn.service_id)
                if svc is None or not svc.agent_local:
                    raise NotFound(f'ServiceID "{defn.service_id}" does not exist')
            check = self._new_check(defn, defn.check_id or defn.name, defn.name, svc)
            topics = self._put_check(check)
            self.hooks.check_added(check)
            return topics

    def deregister_check(self, check_id: str) -> list[Topic]:
        with self.state.lock:
            if check_id not in self.checks or check_id == SERF_CHECK_ID:
                raise NotFound(f'Unknown check ID "{check_id}". Ensure that the check ID is passed, not the check name.')
            return self._drop_check(check_id)

    def update_ttl(self, check_id: str, status: str, output: str) -> list[Topic]:
        with self.state.lock:
            check = self.checks.get(check_id)
            if check is None or check_id == SERF_CHECK_ID:
                raise NotFound(f'Unknown check ID "{check_id}". Ensure that the check ID is passed, not the check name.')
            if check.type != "ttl":
                raise DefinitionError(f'CheckID "{check_id}" does not have associated TTL', status=500)
            if len(output) > OUTPUT_MAX:
                output = f"{output[:OUTPUT_MAX]} ... (captured {OUTPUT_MAX} of {len(output)} bytes)"
            check.ttl_deadline = time.time() + check.definition.ttl
            self.state.touch()
            self.hooks.ttl_reset(check)
            return self.set_status(check, status, output)

    def set_status(self, check: Check, status: str, output: str) -> list[Topic]:
        """Agent-side status update (``local.State.UpdateCheck``); lock held by the caller."""
        now = time.time()
        if status == "critical":
            check.critical_since = check.critical_since or now
        else:
            check.critical_since = None
        if check.status == status and check.output == output:
            return []
        if self.check_update_interval > 0 and check.status == status:
            check.output = output
            self.state.touch()
            if check.sync_due is None:
                check.sync_due = now + self.check_update_interval / 2 + self.check_update_interval * random.random()
                self.hooks.sync_deferred(check)
            return []
        check.status, check.output = status, output
        return self.sync_check(check)

    def sync_check(self, check: Check) -> list[Topic]:
        """Write the agent view of ``check`` into the catalog (anti-entropy for one check)."""
        check.sync_due = None
        if (check.synced_status, check.synced_output) == (check.status, check.output):
            self.state.touch()
            return []
        check.synced_status, check.synced_output = check.status, check.output
        return self._put_check(check)

    # -- reads (callers hold state.lock) --------------------------------------------------------
    def service_index(self, name: str) -> int:
        """``maxIndexForService``: the per-service index, or the services table index for an unknown name."""
        return max(self.name_index.get(name) or self.services_index, 1)

    def node_services_index(self) -> int:
        """``NodeServices``' index: it reads the nodes and the services tables, so the larger of their
        indexes (``maxIndexTxn(tx, "nodes", "services")``); a node registered without a service moves it."""
        return max(self.nodes_index, self.services_index, 1)

    def node_checks(self) -> list[Check]:
        return sorted((c for c in self.checks.values() if not c.service_id), key=lambda c: c.check_id)

    def service_checks(self, service_id: str) -> list[Check]:
        return sorted((c for c in self.checks.values() if c.service_id == service_id), key=lambda c: c.check_id)

    def instances(self, name: str, tags: list[str]) -> list[Service]:
        wanted = [t.lower() for t in tags]
        found = []
        for svc in sorted(self.services.values(), key=lambda s: s.id):
            have = {t.lower() for t in svc.tags}
            if svc.name == name and all(t in have for t in wanted):
                found.append(svc)
        return found

    # -- undo (a write that could not be made durable) -------------------------------------------
    def begin_undo(self) -> CatalogUndo:
        """Before a write; lock held until :meth:`end_undo`."""
        return CatalogUndo(_copies(self.services), _copies(self.checks))

    def end_undo(self, undo: CatalogUndo) -> None:
        undo.after = (_copies(self.services), _copies(self.checks))

    def rollback(self, undo: CatalogUndo) -> list[Topic]:
        """Put back each record the write changed, except where a later write changed it since (that write
        stands), as the KV store's undo does; the restored records move the index like any write. Lock held."""
        names: set[str] = set()
        node_level = services_changed = checks_changed = False
        for live, before, after in ((self.services, undo.services, undo.after[0]),
                                    (self.checks, undo.checks, undo.after[1])):
            for key in before.keys() | after.keys():
                old, new = before.get(key), after.get(key)
                if old == new or live.get(key) != new:
                    continue
                is_check = live is self.checks
                if is_check:
                    self.hooks.check_removed(key)
                if old is None:
                    del live[key]
                else:
                    live[key] = restored = copy.copy(old)
                    if is_check:
                        self.hooks.check_added(restored)
                for record in (old, new):
                    if record is None:
                        continue
                    if not is_check:
                        names.add(record.name)
                    elif record.service_id:
                        names.add(record.service_name)
                    else:
                        node_level = True
                checks_changed |= is_check
                services_changed |= not is_check
        if not (names or node_level):
            return []
        return self._bump(names, node_level, services_changed, checks_changed)[1]

    # -- persistence ----------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {
            "node": asdict(self.node),
            "services": [asdict(s) for s in self.services.values()],
            "checks": [c.to_record() for c in self.checks.values()],
            "indexes": {
                "services": self.services_index, "checks": self.checks_index, "nodes": self.nodes_index,
                "names": dict(self.name_index),
            },
        }

    def restore(self, snap: dict) -> None:
        self.node = Node(**snap["node"])
        self.services = {s["id"]: Service(**s) for s in snap["services"]}
        self.checks = {c["check_id"]: Check.from_record(c) for c in snap["checks"]}
        idx = snap["indexes"]
        self.services_index, self.checks_index, self.nodes_index = idx["services"], idx["checks"], idx["nodes"]
        self.name_index = dict(idx["names"])


def _same_view(old: Check, new: Check) -> bool:
    """True when the catalog would not change (Consul skips identical check writes)."""
    a, b = old.api(), new.api()
    for key in ("CreateIndex", "ModifyIndex"):
        a.pop(key), b.pop(key)
    return a == b
