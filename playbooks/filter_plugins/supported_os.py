"""``supported_os_problem``: why the roles cannot provision a host, from its ``/etc/os-release`` text.

Usage in a play (``playbooks/tasks/supported_os.yml``)::

    "{{ os_release_text | supported_os_problem }}"   # "" when supported, else the reason naming the OS

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
    from preflight.checks.os_support import unsupported
except ImportError:  # ansible-playbook run from a checkout whose venv lacks the editable install
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from preflight.checks.os_support import unsupported
from preflight.parsers.common import ParseError  # noqa: E402 (found through the same path)
from preflight.parsers.os_release import parse  # noqa: E402


def supported_os_problem(text: Any) -> str:
    try:
        found = parse(str(text))
    except ParseError as exc:
        raise AnsibleFilterError(f"os-release: {exc}") from None
    return unsupported(found) or ""


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"supported_os_problem": supported_os_problem}
