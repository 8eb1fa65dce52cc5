#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Restart the Consul agent and wait until it answers with a known cluster leader again (servers: and until
every server is healthy again); a server is not restarted while another server is unhealthy."""

from __future__ import annotations

DOCUMENTATION = r"""
module: consul_restart
short_description: Restart consul.service, then wait for a leader (and, on servers, a healthy cluster)
description:
  - >-
    C(systemctl restart) of the unit, then polls C(/v1/status/leader) of the agent until it names a leader.
  - >-
    With I(servers_healthy) (the role sets it on servers), it first waits (up to I(timeout)) until autopilot's
    health (C(/v1/operator/autopilot/health), operator:read) reports every OTHER server healthy, and
    refuses to restart when that does not happen (or the token is refused); after the restart it also
    waits until every server is healthy again. Ansible's
    C(throttle: 1) runs the task on one server at a time but does not stop at a failure (the next server's
    turn still comes), so this check is what keeps a server that did not come back from being followed by a
    second one going down: a 3-server cluster never loses its quorum to a configuration change.
  - >-
    An agent that does not answer before the restart is restarted anyway: it is down already, and a
    restart can only bring it back.
  - >-
    Fails, naming the unit and the last answer, when no leader (or no healthy cluster) within I(timeout).
options:
  unit:
    description: The systemd unit.
    type: str
    default: consul.service
  timeout:
    description: Seconds to wait for a leader (and a healthy cluster) after the restart.
    type: int
    default: 60
  servers_healthy:
    description: Check autopilot's health before the restart and wait for it after (Consul servers).
    type: bool
    default: false
  bootstrap_expect:
    description: The servers a new cluster waits for before it elects its first leader (consul.hcl's
      bootstrap_expect); named in the failure when no leader comes, 0 to leave it out.
    type: int
    default: 0
extends_documentation_fragment: [clusterctl.infra.consul_health]
author: clusterctl maintainers
"""

from ansible.module_utils.basic import AnsibleModule  # noqa: E402
from ansible_collections.clusterctl.infra.plugins.module_utils.consul_health import (  # noqa: E402
    HEALTH_ARGUMENT_SPEC,
    fail_unless_others_healthy,
    wait_leader,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            **HEALTH_ARGUMENT_SPEC,
            "unit": {"type": "str", "default": "consul.service"},
            "timeout": {"type": "int", "default": 60},
            "servers_healthy": {"type": "bool", "default": False},
            "bootstrap_expect": {"type": "int", "default": 0},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=True)
    if p["servers_healthy"]:
        fail_unless_others_healthy(module, f"not restarting {p['unit']}", "a restart")
    rc, _, err = module.run_command([module.get_bin_path("systemctl", required=True), "restart", p["unit"]])
    if rc != 0:
        module.fail_json(msg=f"systemctl restart {p['unit']} failed: {err.strip()[-500:]}")
    ok, detail = wait_leader(p["url"], p["token"], p["timeout"], p["servers_healthy"])
    if not ok:
        expect = p["bootstrap_expect"]
        hint = (f"; a new cluster elects its first leader only once all {expect} servers (bootstrap_expect) run: "
                "is every host of consul_servers in this run, and up?") if expect > 1 and "no leader" in detail else ""
        module.fail_json(msg=f"{p['unit']} restarted but {detail}{hint}")
    module.exit_json(changed=True, leader=detail)


if __name__ == "__main__":
    main()
