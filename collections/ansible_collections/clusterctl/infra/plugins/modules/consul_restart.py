#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Restart the Consul agent and wait until it answers with a known cluster leader again."""

from __future__ import annotations

DOCUMENTATION = r"""
module: consul_restart
short_description: Restart consul.service, then wait for a leader through its HTTP API
description:
  - C(systemctl restart) of the unit, then polls C(/v1/status/leader) of the agent until it names a leader.
    With C(throttle: 1) on the task, Consul servers restart one at a time and the next one only once the
    cluster has a leader again, so a configuration change never takes a quorum down.
  - Fails, naming the unit and the last answer, when no leader is known within I(timeout) seconds.
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
    description: Seconds to wait for a leader after the restart.
    type: int
    default: 60
author: clusterctl maintainers
"""

import json  # noqa: E402
import time  # noqa: E402
import urllib.error  # noqa: E402
import urllib.request  # noqa: E402

from ansible.module_utils.basic import AnsibleModule  # noqa: E402


def leader(url: str) -> str:
    """The leader the agent reports, or a description of why there is none."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/status/leader", timeout=5) as resp:
            value = json.loads(resp.read() or b'""')
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return f"!{getattr(exc, 'reason', exc)}"
    return value if isinstance(value, str) else f"!unexpected answer {value!r}"


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "unit": {"type": "str", "default": "consul.service"},
            "url": {"type": "str", "required": True},
            "timeout": {"type": "int", "default": 60},
        },
        supports_check_mode=True,
    )
    p = module.params
    if module.check_mode:
        module.exit_json(changed=True)
    rc, _, err = module.run_command([module.get_bin_path("systemctl", required=True), "restart", p["unit"]])
    if rc != 0:
        module.fail_json(msg=f"systemctl restart {p['unit']} failed: {err.strip()[-500:]}")
    deadline = time.monotonic() + p["timeout"]
    last = ""
    while time.monotonic() < deadline:
        last = leader(p["url"])
        if last and not last.startswith("!"):
            module.exit_json(changed=True, leader=last)
        time.sleep(1)
    module.fail_json(msg=f"{p['unit']} restarted but no leader known within {p['timeout']}s "
                         f"(last answer from {p['url']}: {last.lstrip('!') or 'no leader'})")


if __name__ == "__main__":
    main()
