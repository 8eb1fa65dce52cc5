#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""The documentation and argument spec of the clusterctl.infra.apt_packages action (it runs no module of its own)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: apt_packages
short_description: Make sure Debian packages are installed; ask dpkg first, run ansible.builtin.apt only when needed
description:
  - An action plugin in front of C(ansible.builtin.apt) with C(state=present). It asks dpkg (one
    C(dpkg-query -W) over the connection, no module sent) and reports ok without running apt when every package
    is fully installed and, for C(name=version), at exactly that version (C(*) in a version is a glob, as in
    apt). Otherwise it runs C(ansible.builtin.apt) with the task's arguments unchanged.
  - A spec dpkg cannot answer for (an architecture qualifier, a relation other than C(=), a virtual package)
    always goes to apt.
  - With nothing to install, apt's C(update_cache)/C(cache_valid_time) refresh is skipped too.
  - Supports check mode (the dpkg query is read-only; apt runs in check mode when it runs).
options:
  name:
    description: Packages, each C(name) or C(name=version).
    type: list
    elements: str
    required: true
  state:
    description: Only C(present); other states are C(ansible.builtin.apt)'s.
    type: str
    choices: [present]
    default: present
  update_cache:
    description: Passed to C(ansible.builtin.apt) when it runs.
    type: bool
    default: false
  cache_valid_time:
    description: Passed to C(ansible.builtin.apt) when it runs.
    type: int
  allow_downgrade:
    description: Passed to C(ansible.builtin.apt) when it runs.
    type: bool
    default: false
  install_recommends:
    description: Passed to C(ansible.builtin.apt) when it runs.
    type: bool
  lock_timeout:
    description: Passed to C(ansible.builtin.apt) when it runs.
    type: int
author: clusterctl maintainers
"""

EXAMPLES = r"""
- name: Install chrony
  clusterctl.infra.apt_packages:
    name: chrony
    update_cache: true
    cache_valid_time: 3600

- name: Install the pinned Consul version
  clusterctl.infra.apt_packages:
    name: "consul={{ consul_agent_version }}"
"""

RETURN = r"""
msg:
  description: When apt did not run, the packages that were already installed.
  type: str
  returned: when nothing was missing
"""

from ansible.module_utils.basic import AnsibleModule


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "name": {"type": "list", "elements": "str", "required": True},
            "state": {"type": "str", "choices": ["present"], "default": "present"},
            "update_cache": {"type": "bool", "default": False},
            "cache_valid_time": {"type": "int"},
            "allow_downgrade": {"type": "bool", "default": False},
            "install_recommends": {"type": "bool"},
            "lock_timeout": {"type": "int"},
        },
        supports_check_mode=True,
    )
    module.fail_json(msg="clusterctl.infra.apt_packages is an action plugin: it runs through ansible-playbook, "
                         "which never sends this file to a host")


if __name__ == "__main__":
    main()
