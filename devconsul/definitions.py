"""Service and check definitions decoded the way Consul's agent endpoints decode them.

Consul matches JSON field names case-insensitively and accepts snake_case aliases
(``deregister_critical_service_after``), which is why py-consul can send ``{"name": ..., "checks": ...}``
in lower case. Validation messages follow ``agent/agent_endpoint.go`` and ``structs.CheckType.Validate``
(https://developer.hashicorp.com/consul/api-docs/agent/service, .../agent/check).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from devconsul.durations import duration_value

MIN_INTERVAL = 1.0  # checks.MinInterval: shorter intervals are raised to 1s
STATUSES = ("passing", "warning", "critical")

SERVICE_FIELDS = (
    "ID", "Name", "Tags", "Address", "Port", "Meta", "Weights", "EnableTagOverride", "Kind",
    "TaggedAddresses", "Check", "Checks", "Token",
)
CHECK_FIELDS = (
    "ID", "CheckID", "Name", "Notes", "Status", "ServiceID", "TTL", "HTTP", "Method", "Header", "Body",
    "Interval", "Timeout", "TCP", "Args", "ScriptArgs", "Script", "GRPC", "UDP", "H2PING", "DockerContainerID",
    "AliasService", "AliasNode", "OSService", "TLSSkipVerify", "DeregisterCriticalServiceAfter",
)


class DefinitionError(ValueError):
    """A definition Consul would refuse with 400; ``str()`` is Consul's reason text."""

    def __init__(self, reason: str, status: int = 400):
        super().__init__(reason)
        self.status = status


def canonical(payload: object, fields: tuple[str, ...]) -> dict:
    """Rename keys to their canonical Consul spelling; unknown keys are dropped, as Consul ignores them."""
    if not isinstance(payload, dict):
        raise DefinitionError("Request decode failed: body must be a JSON object")
    lookup = {f.lower(): f for f in fields}
    out: dict = {}
    for key, value in payload.items():
        name = lookup.get(str(key).lower().replace("_", ""))
        if name is not None:
            out[name] = value
    return out


@dataclass
class CheckDefinition:
    check_id: str = ""
    name: str = ""
    notes: str = ""
    status: str = ""
    service_id: str = ""
    ttl: float = 0.0
    http: str = ""
    method: str = ""
    header: dict = field(default_factory=dict)
    body: str = ""
    tcp: str = ""
    interval: float = 0.0
    timeout: float = 0.0
    tls_skip_verify: bool = False
    deregister_after: float = 0.0

    @property
    def kind(self) -> str:
        return "http" if self.http else "tcp" if self.tcp else "ttl"


def parse_check(payload: object) -> CheckDefinition:
    raw = canonical(payload, CHECK_FIELDS)
    try:
        chk = CheckDefinition(
            check_id=str(raw.get("CheckID") or raw.get("ID") or ""),
            name=str(raw.get("Name") or ""),
            notes=str(raw.get("Notes") or ""),
            status=str(raw.get("Status") or ""),
            service_id=str(raw.get("ServiceID") or ""),
            ttl=duration_value(raw.get("TTL") or 0),
            http=str(raw.get("HTTP") or ""),
            method=str(raw.get("Method") or ""),
            header=dict(raw.get("Header") or {}),
            body=str(raw.get("Body") or ""),
            tcp=str(raw.get("TCP") or ""),
            interval=duration_value(raw.get("Interval") or 0),
            timeout=duration_value(raw.get("Timeout") or 0),
            tls_skip_verify=bool(raw.get("TLSSkipVerify")),
            deregister_after=duration_value(raw.get("DeregisterCriticalServiceAfter") or 0),
        )
    except (TypeError, ValueError) as exc:
        raise DefinitionError(f"Request decode failed: {exc}") from exc
    if any(raw.get(k) for k in ("Args", "ScriptArgs", "Script", "DockerContainerID")):
        # Consul's default: enable_script_checks = false; agent.addCheck's plain error is a 500.
        raise DefinitionError(
            "Scripts are disabled on this agent from remote calls; to enable, configure 'enable_script_checks' "
            "to true", status=500,
        )
    if any(raw.get(k) for k in ("GRPC", "UDP", "H2PING", "AliasService", "AliasNode", "OSService")):
        raise DefinitionError("Invalid check: the dev server runs TTL, HTTP and TCP checks only")
    if chk.status and chk.status not in STATUSES:
        raise DefinitionError("Status for checks must 'passing', 'warning', 'critical'")
    interval_check = bool(chk.http or chk.tcp)
    if chk.interval > 0 and chk.ttl > 0:
        raise DefinitionError("Invalid check: Interval and TTL cannot both be specified")
    if interval_check and chk.interval <= 0:
        raise DefinitionError("Invalid check: Interval must be > 0 for Script, HTTP, H2PING, TCP or UDP checks")
    if not interval_check and chk.ttl <= 0:
        raise DefinitionError("Invalid check: TTL must be > 0 for TTL checks")
    if interval_check:
        chk.interval = max(chk.interval, MIN_INTERVAL)
    return chk


@dataclass
class ServiceDefinition:
    id: str
    name: str
    tags: list[str]
    address: str
    port: int
    meta: dict[str, str]
    weights: dict[str, int]
    enable_tag_override: bool
    kind: str
    tagged_addresses: dict
    checks: list[CheckDefinition]
    token: str = ""  # the ACL token anti-entropy syncs this service with (a definition's "token")
    source: str = "api"  # "file": defined in the agent's configuration, replaced on reload


def parse_service(payload: object) -> ServiceDefinition:
    raw = canonical(payload, SERVICE_FIELDS)
    name = raw.get("Name")
    if not name:
        raise DefinitionError("Missing service name")
    address = str(raw.get("Address") or "")
    if address in ("0.0.0.0", "::", "[::]"):
        raise DefinitionError("Invalid service address")
    weights = canonical(raw.get("Weights") or {"Passing": 1, "Warning": 1}, ("Passing", "Warning"))
    weights = {"Passing": int(weights.get("Passing", 1)), "Warning": int(weights.get("Warning", 1))}
    if weights["Passing"] < 1:
        raise DefinitionError("Invalid Weights: Passing must be greater than 0")
    check_payloads = []
    if raw.get("Check"):
        check_payloads.append(raw["Check"])
    check_payloads.extend(raw.get("Checks") or [])
    try:
        port = int(raw.get("Port") or 0)
    except (TypeError, ValueError) as exc:
        raise DefinitionError(f"Request decode failed: {exc}") from exc
    return ServiceDefinition(
        id=str(raw.get("ID") or name),
        name=str(name),
        tags=[str(t) for t in raw.get("Tags") or []],
        address=address,
        port=port,
        meta={str(k): str(v) for k, v in (raw.get("Meta") or {}).items()},
        weights=weights,
        enable_tag_override=bool(raw.get("EnableTagOverride")),
        kind=str(raw.get("Kind") or ""),
        tagged_addresses=dict(raw.get("TaggedAddresses") or {}),
        checks=[parse_check(p) for p in check_payloads],
        token=str(raw.get("Token") or ""),
    )
