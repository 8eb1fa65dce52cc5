#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Restart the Consul agent and wait until it answers with a known cluster leader again (servers: and until
every server is healthy again); a server is not restarted while another server is unhealthy."""

from __future__ import annotations

DOCUMENTATION = r"""
module: consul_restart
short_description: Restart consul.service, then wait for a leader (and, on servers, a healthy cluster)
description:
  - C(systemctl restart) of the unit, then polls C(/v1/status/leader) of the agent until it names a leader.
  - With I(servers_healthy) (the role sets it on servers), it first waits (up to I(timeout)) until autopilot's
    health (C(/v1/operator/autopilot/health), operator:read) reports every OTHER server healthy, and
    refuses to restart when that does not happen (or the token is refused); after the restart it also
    waits until every server is healthy again. Ansible's
    C(throttle: 1) runs the task on one server at a time but does not stop at a failure (the next server's
    turn still comes), so this check is what keeps a server that did not come back from being followed by a
    second one going down: a 3-server cluster never loses its quorum to a configuration change.
  - An agent that does not answer before the restart is restarted anyway: it is down already, and a
    restart can only bring it back.
  - Fails, naming the unit and the last answer, when no leader (or no healthy cluster) within I(timeout).
options:
  unit:
    description: The systemd unit.
    type: str
    default: consul.service
  url:
    description: The agent's HTTP API base URL.
    type: str
    required: true
  timeout:
    description: Seconds to wait for a leader (and a healthy cluster) after the restart.
    type: int
    default: 60
  servers_healthy:
    description: Check autopilot's health before the restart and wait for it after (Consul servers).
    type: bool
    default: false
  node_name:
    description: This agent's node name (autopilot's server Name); its own health does not stop its restart.
    type: str
    default: ""
  token:
    description: ACL token with operator:read for the health read (sent as X-Consul-Token, never logged).
    type: str
    default: ""
author: clusterctl maintainers
"""

import json  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


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


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "consul.service"},
            "url": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 60},
            "servers_healthy": {"type": "bool", "default": False},
            "node_name": {"type": "str", "default": ""},
            "token": {"type": "str", "default": "", "no_log": True},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=True)
    if p["servers_healthy"]:
        # Wait (bounded) rather than read once: a cluster that is still forming (every server just started
        # by the role's first run) has no leader for a few seconds, and a server just restarted by the
        # previous turn may still be catching up.
        deadline = time.monotonic() + p["timeout"]
        while True:
            state, why = servers_health(p["url"], p["token"], p["node_name"])
            if state in ("healthy", "down"):  # a down agent cannot take the quorum down further
                break
            if state == "denied" or time.monotonic() >= deadline:
                module.fail_json(msg=f"not restarting {p['unit']}: the other Consul servers are not all "
                                     f"healthy, a restart now could take the quorum down ({why})")
            time.sleep(1)
    rc, _, err = module.run_command([module.get_bin_path("systemctl", required=True), "restart", p["unit"]])
    if rc != 0:
        module.fail_json(msg=f"systemctl restart {p['unit']} failed: {err.strip()[-500:]}")
    deadline = time.monotonic() + p["timeout"]
    last = ""
    while time.monotonic() < deadline:
        last = leader(p["url"])
        if last and not last.startswith("!"):
            if not p["servers_healthy"]:
                module.exit_json(changed=True, leader=last)
            state, why = servers_health(p["url"], p["token"], "")
            if state == "healthy":
                module.exit_json(changed=True, leader=last)
            last = f"!servers: {why}"
        time.sleep(1)
    if last.startswith("!servers: "):
        module.fail_json(msg=f"{p['unit']} restarted but the Consul servers were not all healthy within "
                             f"{p['timeout']}s (last answer from {p['url']}: {last.removeprefix('!servers: ')})")
    module.fail_json(msg=f"{p['unit']} restarted but no leader known within {p['timeout']}s "
                         f"(last answer from {p['url']}: {last.lstrip('!') or 'no leader'})")


if __name__ == "__main__":
    main()
