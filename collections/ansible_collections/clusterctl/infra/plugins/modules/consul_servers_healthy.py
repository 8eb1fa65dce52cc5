#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Wait until the Consul servers are healthy: the others, before this server goes down (a reboot), or all
of them with a known leader, after it came back."""

from __future__ import annotations

DOCUMENTATION = r"""
module: consul_servers_healthy
short_description: Wait until the other Consul servers (or all of them, with a leader) are healthy
description:
  - >-
    With I(others) (before taking this server down, e.g. a reboot), waits up to I(timeout) until autopilot's
    health (C(/v1/operator/autopilot/health), operator:read) reports every server but I(node_name) healthy,
    and fails when that does not happen (or the token is refused): going down now could take the quorum
    down. An agent that does not answer passes (it is down already; its going down cannot cost more).
  - >-
    Without I(others) (after the server came back), waits until the agent names a leader and every server
    is healthy, and fails naming the last answer when not within I(timeout).
  - >-
    Changes nothing (changed is always false).
options:
  others:
    description: Wait for the servers other than I(node_name) (true) or for a leader and every server (false).
    type: bool
    default: false
  timeout:
    description: Seconds to wait.
    type: int
    default: 300
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
            "others": {"type": "bool", "default": False},
            "timeout": {"type": "int", "default": 300},
        },
        supports_check_mode=True,
    )
    p = module.params
    if p["others"]:
        fail_unless_others_healthy(module, f"{p['node_name']} stays up", "taking it down")
        module.exit_json(changed=False)
    ok, detail = wait_leader(p["url"], p["token"], p["timeout"], True)
    if not ok:
        module.fail_json(msg=f"{p['node_name'] or p['url']}: {detail}")
    module.exit_json(changed=False, leader=detail)


if __name__ == "__main__":
    main()
