"""Consul helpers for the consul_agent role and rolling-restart.yml.

- ``consul_bind_ip``: Consul's ``bind_addr`` must be an IP or a go-sockaddr template; a host name (an FQDN
  ``ansible_host``) is resolved here to its first IPv4 address, or fails naming the value.
- ``consul_node_acl``: the policies and tokens of one node (``consul_io.acl``), for the
  ``clusterctl.infra.consul_acl`` module; tokens whose vault value is empty are left out.
- ``consul_marker_key``: the preflight release marker of an IU.
- ``consul_maintenance``: the agent's checks (``GET /v1/agent/checks``) -> service ID -> the reason (Notes)
  of each service that Consul holds in maintenance.
- ``consul_node_maintenance``: the reason (Notes) of the node's maintenance among checks (the agent's
  ``GET /v1/agent/checks`` mapping, or the catalog's ``GET /v1/health/node/<node>`` list), None when the node is
  not in maintenance.
- ``consul_serving_ius``: the agent's checks -> the IU service IDs in rotation (every check passing or warning,
  no maintenance); ``under_node_maintenance=True`` judges them as if the node were not in maintenance (the IUs
  a drained node would put back).
- ``consul_token``: the token rule (roles/consul_agent/README.md): ``consul_token | consul_token(consul_token_file)``
  is the vault value when set, else the token read from the 0600 file on the controller; a bad file fails
  naming it. The same function as every Python reader's (cluster.settings.Consul.operator_token).

Consul names come from ``consul_io/layout.py`` only (``tests/unit/consul_io/test_layout.py`` scans the roles'
and playbooks' YAML for hand-written ones); the agent's address, scheme and datacenter from the
``cluster_node`` filter's ``consul`` block.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from cluster import settings
    from consul_io import acl
except ImportError:  # ansible-playbook run from a checkout whose venv lacks the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from cluster import settings
    from consul_io import acl
from consul_io import layout  # noqa: E402 (found through the same path as cluster)
from consul_io.client import TokenError  # noqa: E402

_TEMPLATE = re.compile(r"^\{\{.*\}\}$")


def consul_bind_ip(value: Any) -> str:
    text = str(value or "").strip()
    if _TEMPLATE.match(text):
        return text
    try:
        return str(ipaddress.ip_address(text))
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(text, None, socket.AF_INET, socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise AnsibleFilterError(f"consul_agent_bind_addr: cannot resolve {text!r} to an IP address ({exc}); "
                                 "set consul_agent_bind_addr to an IP or a go-sockaddr template") from None
    return str(infos[0][4][0])


def consul_node_acl(node: str, datacenter: str, tokens: dict[str, Any], kv_prefix: str = acl.EAS_PREFIX) -> dict:
    """``{"policies": [{name, rules}], "tokens": [{secret, description, policies}]}`` for ``node``."""
    policies = acl.node_policies(node, datacenter, kv_prefix)
    descriptions = {
        "agent": f"consul agent token of {node}",
        "registration": f"config_file_service_registration of {node}",
        "operator": "clusterctl operator (maintenance, preflight release)",
        "eas_agent": f"eas-agent of {node}",
        "edge": "edge (read-only)",
    }
    out_tokens, used, seen = [], set(), {}
    for kind, description in descriptions.items():
        policy = layout.acl_policy(kind, node)
        secret = str(tokens.get(kind) or "")
        if secret in seen:  # one secret is one token: two jobs on it would leave it with only one policy
            raise AnsibleFilterError(f"{node}: the {seen[secret]} and {kind} Consul tokens are the same secret; "
                                     "each job needs its own token")
        if secret:
            seen[secret] = kind
            out_tokens.append({"secret": secret, "description": description, "policies": [policy]})
            used.add(policy)
    return {"policies": [{"name": n, "rules": r} for n, r in policies.items() if n in used], "tokens": out_tokens}


def consul_marker_key(iu_id: str, datacenter: str) -> str:
    return layout.marker_key(datacenter, iu_id)


def consul_maintenance(checks: Any) -> dict[str, Any]:
    """``{service ID: Notes}`` of the services in maintenance among an agent's checks (a mapping by check ID)."""
    if not isinstance(checks, dict):
        raise AnsibleFilterError(f"consul_maintenance: expected the agent's checks (a mapping), got {type(checks).__name__}")
    return {service: check.get("Notes") if isinstance(check, dict) else None for check_id, check in checks.items()
            if (service := layout.maintained_service(str(check_id))) is not None}


def _check_list(checks: Any, what: str) -> list[dict]:
    if isinstance(checks, dict):
        return [c for c in checks.values() if isinstance(c, dict)]
    if isinstance(checks, list):
        return [c for c in checks if isinstance(c, dict)]
    raise AnsibleFilterError(f"{what}: expected Consul checks (a mapping or a list), got {type(checks).__name__}")


def consul_node_maintenance(checks: Any) -> str | None:
    for check in _check_list(checks, "consul_node_maintenance"):
        if check.get("CheckID") == layout.NODE_MAINT_CHECK:
            return str(check.get("Notes") or "")
    return None


def consul_serving_ius(checks: Any, under_node_maintenance: bool = False) -> list[str]:
    """IU service IDs whose every own check passes (or warns), with no service maintenance; none while the node is
    in maintenance unless ``under_node_maintenance``. Node-level checks other than maintenance (serfHealth) are not
    the agent's to report: the agent answering is its own gossip health."""
    listed = _check_list(checks, "consul_serving_ius")
    if not under_node_maintenance and any(c.get("CheckID") == layout.NODE_MAINT_CHECK for c in listed):
        return []
    states: dict[str, list[str]] = {}
    for check in listed:
        if layout.is_iu_service(str(check.get("ServiceName") or "")) and check.get("ServiceID"):
            maintenance = layout.is_maintenance_check(str(check.get("CheckID")))
            states.setdefault(str(check["ServiceID"]), []).append("maintenance" if maintenance else str(check.get("Status")))
    return sorted(iu for iu, found in states.items() if all(s in ("passing", "warning") for s in found))


def consul_token(value: Any, path: Any = "") -> str:
    try:
        return settings.Consul(token=value, token_file=str(path or "") or None).operator_token() or ""
    except TokenError as exc:
        raise AnsibleFilterError(str(exc)) from None


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"consul_bind_ip": consul_bind_ip, "consul_node_acl": consul_node_acl,
                "consul_marker_key": consul_marker_key, "consul_maintenance": consul_maintenance,
                "consul_node_maintenance": consul_node_maintenance, "consul_serving_ius": consul_serving_ius,
                "consul_token": consul_token}
