"""Agent-side state that is not the catalog: the agent's ACL tokens and the services of its config files.

Tokens (https://developer.hashicorp.com/consul/commands/acl/set-agent-token): ``agent`` (node registration,
falls back to ``default``), ``config_file_service_registration`` (services and checks from config files, falls
back to ``default``), ``default`` (requests without a token, and the fallback above). ``PUT
/v1/agent/token/<type>`` replaces one; with ``acl.enable_token_persistence`` the change is kept in
``<data_dir>/acl-tokens.json`` and wins over the configuration at the next start, as Consul does.

File services (https://developer.hashicorp.com/consul/docs/register/service/vm/define): registered at start
and on ``consul reload``; a reload replaces the definitions that changed and removes the file services that
are gone, keeping API-registered services and every maintenance check of a service that stays (maintenance
is a check the agent persists, not part of the definition).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from devconsul.definitions import DefinitionError, parse_service
from devconsul.persist import write_atomically

log = logging.getLogger("devconsul.agent")
TOKEN_FILE = "acl-tokens.json"
TOKEN_TYPES = ("agent", "default", "config_file_service_registration", "agent_recovery", "replication")


class AgentTokens:
    def __init__(self, configured: dict[str, str], data_dir: Path | None, persist: bool, on_change=None):
        self.on_change = on_change  # a new token may unblock a sync: anti-entropy runs again
        self.tokens = dict(configured)
        self.path = data_dir / TOKEN_FILE if (data_dir is not None and persist) else None
        if self.path is not None and self.path.is_file():
            self.tokens.update(json.loads(self.path.read_text()))

    def get(self, kind: str) -> str:
        return self.tokens.get(kind, "")

    def set(self, kind: str, token: str) -> None:
        # Consul's older names for two of them are still accepted
        kind = {"acl_token": "default", "acl_agent_token": "agent", "agent_master": "agent_recovery"}.get(kind, kind)
        if kind not in TOKEN_TYPES:
            raise DefinitionError(f"Token {kind!r} is not a valid token type", status=404)
        self.tokens[kind] = token
        if self.on_change is not None:
            self.on_change()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            saved = {k: v for k, v in self.tokens.items() if k in TOKEN_TYPES}
            write_atomically(self.path, json.dumps(saved))
            os.chmod(self.path, 0o600)


def token_for(tokens: AgentTokens, svc) -> str:
    """The token anti-entropy writes ``svc`` with (None: the node's own entries)."""
    if svc is None:
        return tokens.get("agent") or tokens.get("default")
    if svc.token:
        return svc.token
    if svc.source == "file":
        return tokens.get("config_file_service_registration") or tokens.get("default")
    return tokens.get("default")


def load_file_services(server, definitions: list[dict]) -> list:
    """Register ``definitions`` (from config files) and drop the file services no longer defined."""
    catalog = server.catalog
    parsed = []
    for raw in definitions:
        defn = parse_service(raw)  # a bad definition fails the start or the reload, as in Consul
        defn.source = "file"
        parsed.append(defn)
    topics: list = []
    with server.state.lock:
        keep = {d.id for d in parsed}
        for svc in [s for s in catalog.services.values() if s.source == "file" and s.id not in keep]:
            log.info("removing service %s: no longer in the configuration", svc.id)
            topics += catalog.remove_service(svc)
        for defn in parsed:
            topics += catalog.register_service(defn, replace_existing_checks=True)
    return topics
