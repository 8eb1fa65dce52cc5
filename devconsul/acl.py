"""Consul's ACL system as far as the cluster uses it: policies with rules, tokens, default policy, authorizer.

Rules (https://developer.hashicorp.com/consul/docs/secure/acl/rule, "ACL rule configuration reference"):
- segmented resources ``node``, ``service``, ``key``, ``agent``, ``session``, ``event``, ``query``, each exact
  (``service "web" {policy = "write"}``) or ``<resource>_prefix``; scalar ``acl``, ``operator``, ``keyring``,
  ``mesh``; dispositions ``read``, ``write``, ``deny`` (``list`` needs ``acl.enable_key_list_policy``, which
  this server does not implement, so it refuses it);
- "When using prefix-based rules, the most specific prefix match determines the action"; an exact rule wins
  over every prefix rule; rules of several policies on one segment merge as "DENY has priority over WRITE or
  READ, WRITE over READ";
- ``write`` implies ``read``; a resource no rule matches gets the ``default_policy`` (``deny``: nothing,
  ``allow``: write), and so does the anonymous token when no rule of its policies applies.
Tokens (https://developer.hashicorp.com/consul/api-docs/acl/tokens): AccessorID + SecretID, linked policies;
``acl.tokens.initial_management`` is linked to ``global-management`` (ID ...0001); the anonymous token
(AccessorID ...0002, SecretID ``anonymous``) is what a request without a token uses; an unknown secret is
a 403 "ACL not found". A denial is a 403 with Consul's text:
``Permission denied: token with AccessorID '<id>' lacks permission '<resource>:<access>' on "<segment>"``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from dataclasses import asdict, dataclass, field

from devconsul.hcl import ConfigError, parse_hcl

GLOBAL_MANAGEMENT_ID = "00000000-0000-0000-0000-000000000001"
ANONYMOUS_ACCESSOR = "00000000-0000-0000-0000-000000000002"
SEGMENTED = ("node", "service", "key", "agent", "session", "event", "query")
SCALAR = ("acl", "operator", "keyring", "mesh")
DISPOSITIONS = {"deny": 0, "read": 1, "write": 2}
POLICY_NAME = re.compile(r"^[A-Za-z0-9\-_]{1,128}$")


class AclError(Exception):
    """An ACL refusal with its HTTP status and Consul's text."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status
        self.reason = reason


def _level(value: object, where: str) -> int:
    if isinstance(value, dict):
        value = value.get("policy")
    if value not in DISPOSITIONS:
        raise AclError(400, f'Failed to parse ACL rules: Invalid {where} policy: "{value}"')
    return DISPOSITIONS[str(value)]


@dataclass
class Rules:
    """Merged rules: ``exact[resource][segment]``, ``prefix[resource][segment]``, ``scalar[resource]``."""

    exact: dict[str, dict[str, int]] = field(default_factory=dict)
    prefix: dict[str, dict[str, int]] = field(default_factory=dict)
    scalar: dict[str, int] = field(default_factory=dict)

    def absorb(self, other: Rules) -> None:
        for mine, theirs in ((self.exact, other.exact), (self.prefix, other.prefix)):
            for resource, segments in theirs.items():
                table = mine.setdefault(resource, {})
                for segment, level in segments.items():
                    table[segment] = _combine(table.get(segment), level)
        for resource, level in other.scalar.items():
            self.scalar[resource] = _combine(self.scalar.get(resource), level)


def _combine(old: int | None, new: int) -> int:
    if old is None:
        return new
    if DISPOSITIONS["deny"] in (old, new):
        return DISPOSITIONS["deny"]
    return max(old, new)


def parse_rules(text: str) -> Rules:
    """HCL or JSON rules, as ``PUT /v1/acl/policy`` takes them in ``Rules``."""
    rules = Rules()
    if not text.strip():
        return rules
    try:
        tree = json.loads(text) if text.lstrip().startswith("{") else parse_hcl(text, "rules")
    except (ConfigError, ValueError) as exc:
        raise AclError(400, f"Failed to parse ACL rules: {exc}") from None
    for key, body in tree.items():
        resource, is_prefix = (key[: -len("_prefix")], True) if key.endswith("_prefix") else (key, False)
        if resource in SCALAR and not is_prefix:
            rules.scalar[resource] = _combine(rules.scalar.get(resource), _level(body, resource))
            continue
        if resource not in SEGMENTED or not isinstance(body, dict):
            raise AclError(400, f'Failed to parse ACL rules: unknown or malformed rule "{key}"')
        table = (rules.prefix if is_prefix else rules.exact).setdefault(resource, {})
        for segment, disposition in body.items():
            if isinstance(disposition, dict) and disposition.get("policy") == "list":
                raise AclError(400, "Failed to parse ACL rules: the list disposition needs "
                                    "acl.enable_key_list_policy, which the dev server does not implement")
            table[str(segment)] = _combine(table.get(str(segment)), _level(disposition, key))
    return rules


class Authorizer:
    """What one resolved token may do. ``management`` tokens may do everything."""

    def __init__(self, accessor: str, rules: Rules | None, default_allow: bool, management: bool = False):
        self.accessor = accessor
        self.rules = rules or Rules()
        self.default_level = DISPOSITIONS["write"] if default_allow else DISPOSITIONS["deny"]
        self.management = management

    def level(self, resource: str, segment: str) -> int:
        if self.management:
            return DISPOSITIONS["write"]
        if resource in SCALAR:
            return self.rules.scalar.get(resource, self.default_level)
        exact = self.rules.exact.get(resource, {})
        if segment in exact:
            return exact[segment]
        best, found = -1, self.default_level
        for prefix, level in self.rules.prefix.get(resource, {}).items():
            if segment.startswith(prefix) and len(prefix) > best:
                best, found = len(prefix), level
        return found

    def allowed(self, resource: str, access: str, segment: str = "") -> bool:
        return self.level(resource, segment) >= DISPOSITIONS[access]

    def grants_any(self, resource: str, access: str) -> bool:
        """Whether ``access`` on ``resource`` is allowed for some segment (the default, or any rule)."""
        want = DISPOSITIONS[access]
        if self.management or self.default_level >= want:
            return True
        if resource in SCALAR:
            return self.rules.scalar.get(resource, self.default_level) >= want
        levels = [*self.rules.exact.get(resource, {}).values(), *self.rules.prefix.get(resource, {}).values()]
        return any(level >= want for level in levels)

    def sees_nothing(self) -> bool:
        """No read right anywhere (the anonymous token under ``default_policy = deny`` without policies)."""
        if self.management or self.default_level >= DISPOSITIONS["read"]:
            return False
        levels = [*self.rules.scalar.values()]
        for table in (self.rules.exact, self.rules.prefix):
            for segments in table.values():
                levels += segments.values()
        return all(level < DISPOSITIONS["read"] for level in levels)

    def require(self, resource: str, access: str, segment: str = "") -> None:
        if not self.allowed(resource, access, segment):
            raise AclError(403, f"Permission denied: token with AccessorID '{self.accessor}' lacks permission "
                                f"'{resource}:{access}' on \"{segment}\"" if resource not in SCALAR else
                                f"Permission denied: token with AccessorID '{self.accessor}' lacks permission "
                                f"'{resource}:{access}'")


ALLOW_ALL = Authorizer("", None, default_allow=True, management=True)


@dataclass
class Policy:
    id: str
    name: str
    description: str = ""
    rules: str = ""
    create_index: int = 0
    modify_index: int = 0

    def api(self) -> dict:
        return {"ID": self.id, "Name": self.name, "Description": self.description, "Rules": self.rules,
                "Datacenters": None, "Hash": _hash(self.rules), "CreateIndex": self.create_index,
                "ModifyIndex": self.modify_index}

    def listing(self) -> dict:
        out = self.api()
        out.pop("Rules")
        return out


@dataclass
class Token:
    accessor: str
    secret: str
    description: str = ""
    policies: list[str] = field(default_factory=list)  # policy IDs
    local: bool = False
    create_time: str = ""
    create_index: int = 0
    modify_index: int = 0


def _hash(text: str) -> str:
    import base64

    return base64.b64encode(hashlib.blake2b(text.encode(), digest_size=32).digest()).decode()


class AclStore:
    """Policies and tokens of the datacenter (the server's state; clients resolve through it)."""

    def __init__(self, state, default_policy: str = "deny", initial_management: str | None = None):
        self.state = state
        self.enabled = True
        self.default_allow = default_policy == "allow"
        self.policies: dict[str, Policy] = {
            GLOBAL_MANAGEMENT_ID: Policy(GLOBAL_MANAGEMENT_ID, "global-management",
                                         "Builtin Policy that grants unlimited access", "")}
        self.tokens: dict[str, Token] = {
            ANONYMOUS_ACCESSOR: Token(ANONYMOUS_ACCESSOR, "anonymous", "Anonymous Token")}
        self.bootstrap_index = 0  # the index of the bootstrap (Consul's "reset index"); 0: not bootstrapped
        if initial_management:  # Consul creates it through its bootstrap: /v1/acl/bootstrap is refused after
            token = self._put_token(Token(str(uuid.uuid5(uuid.NAMESPACE_OID, "initial-management:" + initial_management)),
                                          initial_management, "Initial Management Token", [GLOBAL_MANAGEMENT_ID]))
            self.bootstrap_index = token.create_index

    def bootstrap(self, secret: str = "") -> Token:
        """``PUT /v1/acl/bootstrap`` (https://developer.hashicorp.com/consul/api-docs/acl#bootstrap-acls): the
        first management token, once, with ``secret`` (``BootstrapSecret``, a UUID) as its SecretID or a new
        one. A cluster bootstrapped before (through this call or ``initial_management``) answers 403
        "Permission denied: ACL bootstrap no longer allowed (reset index: N)", as Consul does."""
        if secret:
            try:
                uuid.UUID(secret)
            except ValueError:
                raise AclError(400, "Invalid bootstrap secret: not a UUID") from None
        with self.state.lock:
            if self.bootstrap_index:
                raise AclError(403, "Permission denied: ACL bootstrap no longer allowed "
                                    f"(reset index: {self.bootstrap_index})")
            token = self._put_token(Token(str(uuid.uuid4()), secret or str(uuid.uuid4()),
                                          "Bootstrap Token (Global Management)", [GLOBAL_MANAGEMENT_ID],
                                          create_time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())))
            self.bootstrap_index = token.create_index
            return token

    # -- resolution -----------------------------------------------------------------------------
    def resolve(self, secret: str) -> Authorizer:
        """The authorizer of a SecretID (empty: the anonymous token); unknown secrets are 403 ACL not found."""
        secret = secret or "anonymous"
        with self.state.lock:
            token = next((t for t in self.tokens.values() if t.secret == secret), None)
            if token is None:
                raise AclError(403, "ACL not found")
            return self._authorizer(token)

    def _authorizer(self, token: Token) -> Authorizer:
        if GLOBAL_MANAGEMENT_ID in token.policies:
            return Authorizer(token.accessor, None, self.default_allow, management=True)
        rules = Rules()
        for policy_id in token.policies:
            policy = self.policies.get(policy_id)
            if policy is not None:  # a deleted policy's link is dropped, as Consul does
                rules.absorb(parse_rules(policy.rules))
        return Authorizer(token.accessor, rules, self.default_allow)

    def resolve_export(self, secret: str) -> dict:
        """What a client agent needs to authorize locally (the stand-in for Consul's ACL.TokenRead RPC)."""
        authz = self.resolve(secret)
        return {"AccessorID": authz.accessor, "Management": authz.management, "DefaultAllow": self.default_allow,
                "Rules": asdict(authz.rules)}

    # -- policies -------------------------------------------------------------------------------
    def put_policy(self, body: dict, policy_id: str | None = None) -> Policy:
        name = str(body.get("Name") or "")
        if not POLICY_NAME.match(name):
            raise AclError(400, f"Invalid Policy: invalid Name. Only alphanumeric characters, '-' and '_' are "
                                f"allowed: {name!r}" if name else "Invalid Policy: no Name is set")
        rules_text = str(body.get("Rules") or "")
        parse_rules(rules_text)
        with self.state.lock:
            if policy_id is not None and policy_id not in self.policies:
                raise AclError(400, f"Cannot find policy {policy_id}")
            if policy_id == GLOBAL_MANAGEMENT_ID:
                raise AclError(400, "Changing the Rules for the builtin global-management policy is not permitted")
            clash = next((p for p in self.policies.values() if p.name == name and p.id != policy_id), None)
            if clash is not None:
                raise AclError(400, f"Invalid Policy: A Policy with Name {name!r} already exists")
            old = self.policies.get(policy_id or "")
            policy = Policy(policy_id or str(uuid.uuid4()), name, str(body.get("Description") or ""), rules_text)
            idx = self.state.next_index()
            policy.create_index = old.create_index if old else idx
            policy.modify_index = idx
            self.policies[policy.id] = policy
            return policy

    def policy(self, policy_id: str = "", name: str = "") -> Policy:
        with self.state.lock:
            found = self.policies.get(policy_id) if policy_id else next(
                (p for p in self.policies.values() if p.name == name), None)
        if found is None:
            raise AclError(403, "ACL not found")
        return found

    def delete_policy(self, policy_id: str) -> None:
        with self.state.lock:
            if policy_id == GLOBAL_MANAGEMENT_ID:
                raise AclError(400, "Delete of builtin global-management policy not permitted")
            self.policies.pop(policy_id, None)
            self.state.next_index()

    # -- tokens ---------------------------------------------------------------------------------
    def put_token(self, body: dict, accessor: str | None = None) -> Token:
        with self.state.lock:
            old = self.tokens.get(accessor or str(body.get("AccessorID") or ""))
            if accessor is not None and old is None:
                raise AclError(400, f"Cannot find token {accessor}")
            links = []
            for link in body.get("Policies") or []:
                if not isinstance(link, dict):
                    raise AclError(400, "Request decode failed: Policies must be a list of {ID} or {Name}")
                policy = self.policies.get(str(link.get("ID") or "")) or next(
                    (p for p in self.policies.values() if p.name == link.get("Name")), None)
                if policy is None:
                    raise AclError(400, f"No such ACL policy with {'ID' if link.get('ID') else 'name'} "
                                        f"\"{link.get('ID') or link.get('Name')}\"")
                links.append(policy.id)
            secret = str(body.get("SecretID") or (old.secret if old else "") or uuid.uuid4())
            if old is None and any(t.secret == secret for t in self.tokens.values()):
                raise AclError(400, "Invalid Token: SecretID is already in use")
            token = Token(old.accessor if old else str(body.get("AccessorID") or uuid.uuid4()), secret,
                          str(body.get("Description") or ""), links, bool(body.get("Local")),
                          old.create_time if old else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
            return self._put_token(token, old)

    def _put_token(self, token: Token, old: Token | None = None) -> Token:
        idx = self.state.next_index()
        token.create_index = old.create_index if old else idx
        token.modify_index = idx
        self.tokens[token.accessor] = token
        return token

    def token(self, accessor: str = "", secret: str = "") -> Token:
        with self.state.lock:
            found = self.tokens.get(accessor) if accessor else next(
                (t for t in self.tokens.values() if t.secret == (secret or "anonymous")), None)
        if found is None:
            raise AclError(403, "ACL not found")
        return found

    def delete_token(self, accessor: str) -> None:
        with self.state.lock:
            if accessor == ANONYMOUS_ACCESSOR:
                raise AclError(400, "Delete operation not permitted on the anonymous token")
            self.tokens.pop(accessor, None)
            self.state.next_index()

    def token_api(self, token: Token, with_secret: bool = True) -> dict:
        out = {
            "AccessorID": token.accessor, "SecretID": token.secret, "Description": token.description,
            "Policies": [{"ID": p, "Name": self.policies[p].name} for p in token.policies if p in self.policies],
            "Local": token.local, "CreateTime": token.create_time, "Hash": _hash(token.accessor + ",".join(token.policies)),
            "CreateIndex": token.create_index, "ModifyIndex": token.modify_index,
        }
        if not with_secret:
            out["SecretID"] = "<hidden>"
        return out

    # -- persistence ----------------------------------------------------------------------------
    def snapshot(self) -> dict:
        return {"policies": [asdict(p) for p in self.policies.values()],
                "tokens": [asdict(t) for t in self.tokens.values()], "bootstrap_index": self.bootstrap_index}

    def restore(self, snap: dict) -> None:
        for rec in snap.get("policies", []):
            self.policies[rec["id"]] = Policy(**rec)
        for rec in snap.get("tokens", []):
            self.tokens[rec["accessor"]] = Token(**rec)
        # a data directory written before the bootstrap was recorded: a management token means bootstrapped
        managed = [t.create_index for t in self.tokens.values() if GLOBAL_MANAGEMENT_ID in t.policies]
        self.bootstrap_index = int(snap.get("bootstrap_index") or 0) or min(managed, default=self.bootstrap_index)


def authorizer_from_export(data: dict) -> Authorizer:
    rules = Rules(**data.get("Rules") or {})
    return Authorizer(str(data.get("AccessorID") or ""), rules, bool(data.get("DefaultAllow")),
                      bool(data.get("Management")))
