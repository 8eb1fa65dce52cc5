# Part of clusterctl. Apache-2.0.
"""What the Consul modules (consul_restart, consul_servers_healthy) read of a cluster's health, and the two
bounded waits they share: until every OTHER server is healthy (before taking this one down), and until
this agent knows a leader (and, for servers, every server is healthy) after it came back; and the options
both modules read a server's health with (documented once: doc_fragments/consul_health.py)."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

# Both modules' options for reading a server's health; each adds its own (timeout's default differs).
HEALTH_ARGUMENT_SPEC = {
    "url": {"type": "str", "required": True},
    "node_name": {"type": "str", "default": ""},
    "token": {"type": "str", "default": "", "no_log": True},
}


def _get(url: str, path: str, token: str = "") -> object:
    request = urllib.request.Request(url.rstrip("/") + path, headers={"X-Consul-Token": token} if token else {})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return json.loads(resp.read() or b'""')


def leader(url: str) -> str:
    """The leader the agent reports, or a description of why there is none ("!..." )."""
    try:
        value = _get(url, "/v1/status/leader")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"!{getattr(exc, 'reason', exc)}"
    return value if isinstance(value, str) else f"!unexpected answer {value!r}"


def servers_health(url: str, token: str, me: str) -> tuple[str, str]:
    """("healthy", ""), ("unhealthy", why: the servers other than ``me`` that autopilot reports unhealthy,
    or the server's refusal such as 500 "No cluster leader" while a new cluster forms), ("down", why: the
    agent does not answer) or ("denied", why: the token may not read it, which waiting cannot change)."""
    try:
        health = _get(url, "/v1/operator/autopilot/health", token)
    except urllib.error.HTTPError as exc:
        body = exc.read().decode(errors="replace").strip()[:200]
        return ("denied" if exc.code == 403 else "unhealthy"), f"autopilot health answered {exc.code}: {body}"
    except (urllib.error.URLError, OSError) as exc:
        return "down", str(getattr(exc, "reason", exc))
    except ValueError:
        return "unhealthy", "autopilot health answered something that is not JSON"
    if not isinstance(health, dict) or not isinstance(health.get("Servers"), list):
        return "unhealthy", f"unexpected autopilot health answer: {str(health)[:200]}"
    bad = [f"{srv.get('Name')} (serf {srv.get('SerfStatus')}, voter {srv.get('Voter')})" if isinstance(srv, dict)
           else f"unexpected server entry {str(srv)[:100]}"
           for srv in health["Servers"] if not (isinstance(srv, dict) and (srv.get("Healthy") or srv.get("Name") == me))]
    return ("unhealthy", "unhealthy servers: " + ", ".join(bad)) if bad else ("healthy", "")


def wait_others_healthy(url: str, token: str, me: str, timeout: float) -> tuple[str, str]:
    """Wait (bounded) until every server but ``me`` is healthy: ("healthy" | "down", "") to go ahead (a down
    agent on this node cannot take the quorum down further), ("unhealthy" | "denied", why) to refuse.
    Bounded rather than read once: a cluster still forming has no leader for a few seconds, and a server
    just restarted or rebooted by the previous turn may still be catching up."""
    deadline = time.monotonic() + timeout
    while True:
        state, why = servers_health(url, token, me)
        if state in ("healthy", "down"):
            return state, ""
        if state == "denied" or time.monotonic() >= deadline:
            return state, why
        time.sleep(1)


def fail_unless_others_healthy(module, refusal: str, going_down: str) -> None:
    """Wait (the module's url, token, node_name and timeout) until every other server is healthy, and fail
    the module otherwise: "<refusal>: the other Consul servers are not all healthy, <going_down> now could
    take the quorum down (<why>)". ``module`` is an AnsibleModule with HEALTH_ARGUMENT_SPEC and timeout."""
    p = module.params
    state, why = wait_others_healthy(p["url"], p["token"], p["node_name"], p["timeout"])
    if state not in ("healthy", "down"):
        module.fail_json(msg=f"{refusal}: the other Consul servers are not all healthy, {going_down} now could "
                             f"take the quorum down ({why})")


def wait_leader(url: str, token: str, timeout: float, servers_healthy: bool) -> tuple[bool, str]:
    """Wait (bounded) until the agent names a leader and, with ``servers_healthy``, every server is healthy:
    (True, the leader) or (False, what went wrong, for the failure message)."""
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        last = leader(url)
        if last and not last.startswith("!"):
            if not servers_healthy:
                return True, last
            state, why = servers_health(url, token, "")
            if state == "healthy":
                return True, last
            last = f"!servers: {why}"
        time.sleep(1)
    if last.startswith("!servers: "):
        return False, (f"the Consul servers were not all healthy within {timeout:g}s (last answer from {url}: "
                       f"{last.removeprefix('!servers: ')})")
    return False, f"no leader known within {timeout:g}s (last answer from {url}: {last.lstrip('!') or 'no leader'})"
