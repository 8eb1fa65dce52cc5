"""``supported_os_problem``: why the roles cannot provision a host, from its ``/etc/os-release`` text.

Usage in a play (``playbooks/tasks/supported_os.yml``)::

    "{{ os_release_text | supported_os_problem }}"   # "" when supported, else the reason naming the OS
    "{{ os_release_text | repository_release_problem(distro, suite) }}"   # "" when both are this release's

The rule and the list are preflight's ``os_support`` check's (:mod:`preflight.checks.os_support`), read
through the same os-release parser: provisioning and preflight never disagree about a host. A file the
parser cannot read stops the host too, naming the line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ansible.errors import AnsibleFilterError

try:
    from preflight.checks.os_support import repository_mismatch, unsupported
except ImportError:  # ansible-playbook run from a checkout whose venv lacks the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from preflight.checks.os_support import repository_mismatch, unsupported
from preflight.parsers.common import ParseError  # noqa: E402 (found through the same path)
from preflight.parsers.os_release import parse  # noqa: E402


def _parsed(text: Any):
    try:
        return parse(str(text))
    except ParseError as exc:
        raise AnsibleFilterError(f"os-release: {exc}") from None


def supported_os_problem(text: Any) -> str:
    return unsupported(_parsed(text)) or ""


def repository_release_problem(text: Any, nvidia_distro: Any = None, consul_suite: Any = None) -> str:
    """"" when NVIDIA's repository path and HashiCorp's suite (each None when the play has no role using it)
    are this host's release's, else the reason naming the variables."""
    return repository_mismatch(_parsed(text), nvidia_distro, consul_suite) or ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"supported_os_problem": supported_os_problem, "repository_release_problem": repository_release_problem}
