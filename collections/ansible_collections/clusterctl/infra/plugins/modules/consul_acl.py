#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Bootstrap Consul's ACLs with the vault's management token, and ensure ACL policies and tokens (with SecretIDs
from the vault) exist as given."""

from __future__ import annotations

DOCUMENTATION = r"""
module: consul_acl
short_description: Bootstrap Consul's ACLs and ensure ACL policies and tokens, with secrets chosen by the caller
description:
  - First makes sure the cluster's ACLs are bootstrapped with I(management_token). When that token is
    unknown, C(PUT /v1/acl/bootstrap) with it as C(BootstrapSecret) (Consul's one-time bootstrap, so no
    server's configuration needs C(initial_management)). A cluster bootstrapped with another token is an
    error saying so; one bootstrapped with this token (or with it as C(initial_management)) is left as it is.
  - Creates or updates each policy (by name) and each token (by its SecretID, so the secret can live in a
    vault and be rendered into configuration before the token exists). A token is found with
    C(GET /v1/acl/token/self) using its own secret; a missing one is created with C(PUT /v1/acl/token) and
    that SecretID. Only what differs is written; check mode writes nothing and reports what would change.
  - Talks to the Consul HTTP API given in I(url) with the management token; run it where that API is
    reachable (a server's local agent). Only the Python standard library is used.
options:
  url:
    description: Consul HTTP API base URL, e.g. C(http://127.0.0.1:8500).
    type: str
    required: true
  management_token:
    description: The management token (a UUID), the bootstrap token of the cluster's ACLs.
    type: str
    required: true
    no_log: true
  policies:
    description: List of C({name, rules}).
    type: list
    elements: dict
    default: []
  tokens:
    description: List of C({secret, description, policies}) (policy names).
    type: list
    elements: dict
    default: []
  timeout:
    description: Seconds for each HTTP request, and for the API to answer at all (a starting agent).
    type: int
    default: 30
author: clusterctl maintainers
"""

RETURN = r"""
created:
  description: Policy names and token descriptions created; C(ACL bootstrap) when this run bootstrapped.
  type: list
  returned: always
updated:
  description: Policy names and token descriptions updated.
  type: list
  returned: always
"""

import json  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402
from functools import partial  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


class ConsulError(Exception):
    pass


def call(url: str, method: str, path: str, token: str, body: object = None, timeout: int = 30):
    """(status, parsed JSON or text) of one request; connection failures raise ConsulError."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url.rstrip("/") + path, data=data, method=method,
                                     headers={"X-Consul-Token": token})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            text = resp.read().decode()
            return resp.status, json.loads(text) if text else None
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except (urllib.error.URLError, OSError) as exc:
        raise ConsulError(f"{method} {path}: {getattr(exc, 'reason', exc)}") from None


def _need(status: int, result, what: str):
    if status != 200:
        raise ConsulError(f"{what}: HTTP {status}: {str(result)[:300]}")
    return result


def _read_policy(url: str, name: str, management: str, timeout: int) -> dict | None:
    """The policy named ``name``, None when there is none."""
    status, found = call(url, "GET", f"/v1/acl/policy/name/{name}", management, timeout=timeout)
    if status == 200 and isinstance(found, dict):
        return found
    if status not in (403, 404):
        _need(status, found, f"read policy {name}")
    return None


def _read_token(url: str, secret: str, description: str, timeout: int) -> dict | None:
    """The token whose SecretID is ``secret`` (read with itself), None when there is none (403)."""
    status, found = call(url, "GET", "/v1/acl/token/self", secret, timeout=timeout)
    if status == 200 and isinstance(found, dict):
        return found
    if status != 403:
        _need(status, found, f"read token {description}")
    return None


BOOTSTRAP_REFUSED = "ACL bootstrap no longer allowed"  # Consul's 403 once a cluster is bootstrapped


def bootstrap(url: str, management: str, check: bool, timeout: int) -> bool:
    """Make sure the cluster's ACLs are bootstrapped with ``management``: True when this call bootstrapped them
    (in check mode: would). Several nodes' runs may race here; the loser's 403 is read as "bootstrapped",
    and then the token must work, or the cluster was bootstrapped with another one."""
    status, found = call(url, "GET", "/v1/acl/token/self", management, timeout=timeout)
    if status == 200:
        return False
    if status != 403:
        _need(status, found, "read the management token")
    if check:
        return True
    status, made = call(url, "PUT", "/v1/acl/bootstrap", "", {"BootstrapSecret": management}, timeout)
    if status == 200:
        return True
    if status == 403 and BOOTSTRAP_REFUSED in str(made):
        if call(url, "GET", "/v1/acl/token/self", management, timeout=timeout)[0] == 200:
            return False
        raise ConsulError("the cluster's ACLs were bootstrapped with another management token than "
                          f"consul_agent_acl_management_token (Consul: {str(made).strip()[:200]}): put that token "
                          "in the vault, or reset the ACL bootstrap as Consul documents it")
    _need(status, made, "ACL bootstrap")
    return False


def _find_or_create(read, create, check: bool, what: str, created: list[str]) -> dict | None:
    """What ``read()`` finds, compared and updated by the caller; None when it was missing and ``create()``
    made it (or, in check mode, would: ``what`` appended to ``created``). A create Consul refuses because
    another node made it in between is read again and adopted; any other refusal fails with Consul's answer."""
    found = read()
    if found is not None:
        return found
    if not check:
        status, made = create()
        if status != 200:
            found = read()
            if found is None:
                _need(status, made, f"create {what}")
            return found
    created.append(what)
    return None


def ensure(url: str, management: str, policies: list[dict], tokens: list[dict], check: bool,
           timeout: int = 30) -> tuple[list[str], list[str]]:
    created: list[str] = []
    updated: list[str] = []
    deadline = time.monotonic() + timeout
    while True:  # an agent that just started may not have a leader yet ("" until one is elected)
        try:
            status, leader = call(url, "GET", "/v1/status/leader", "", timeout=timeout)
            if status == 200 and leader:
                break
        except ConsulError:
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise ConsulError(f"no Consul leader known at {url} within {timeout}s")
        time.sleep(1)
    if bootstrap(url, management, check, timeout):
        created.append("ACL bootstrap")
    # Every node ensures the shared policies and tokens (registration, operator, edge), and a batch runs its
    # nodes in parallel forks: another node can create one between this node's read and its create, which
    # Consul refuses ("already exists", "SecretID is already in use"). A refused create is read again and,
    # found, adopted as if it had been read first.
    for policy in policies:
        name, rules = str(policy["name"]), str(policy["rules"])
        found = _find_or_create(partial(_read_policy, url, name, management, timeout),
                                partial(call, url, "PUT", "/v1/acl/policy", management, {"Name": name, "Rules": rules},
                                        timeout), check, f"policy {name}", created)
        if found is None:
            continue
        if found.get("Rules") != rules:
            updated.append(f"policy {name}")
            if not check:
                _need(*call(url, "PUT", f"/v1/acl/policy/{found['ID']}", management,
                            {"Name": name, "Rules": rules}, timeout), f"update policy {name}")
    for token in tokens:
        secret, description = str(token["secret"]), str(token.get("description") or "")
        wanted = sorted(str(p) for p in token.get("policies") or [])
        body = {"Description": description, "Policies": [{"Name": p} for p in wanted]}
        found = _find_or_create(partial(_read_token, url, secret, description, timeout),
                                partial(call, url, "PUT", "/v1/acl/token", management, {**body, "SecretID": secret},
                                        timeout), check, f"token {description}", created)
        if found is None:
            continue
        have = sorted(p["Name"] for p in found.get("Policies") or [])
        if have != wanted or found.get("Description") != description:
            updated.append(f"token {description}")
            if not check:
                _need(*call(url, "PUT", f"/v1/acl/token/{found['AccessorID']}", management, body, timeout),
                      f"update token {description}")
    return created, updated


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "url": {"type": "str", "required": True},
            "management_token": {"type": "str", "required": True, "no_log": True},
            "policies": {"type": "list", "elements": "dict", "default": []},
            "tokens": {"type": "list", "elements": "dict", "default": [], "no_log": True},
            "timeout": {"type": "int", "default": 30},
        },
        supports_check_mode=True,
    )
    p = module.params
    try:
        created, updated = ensure(p["url"], p["management_token"], p["policies"], p["tokens"], module.check_mode,
                                  p["timeout"])
    except ConsulError as exc:
        module.fail_json(msg=str(exc))
    module.exit_json(changed=bool(created or updated), created=created, updated=updated)


if __name__ == "__main__":
    main()
