# Part of clusterctl. Apache-2.0.
"""Install Debian packages with ``ansible.builtin.apt``, or not at all when dpkg already has every one.

``ansible.builtin.apt`` opens python-apt's cache on every run, also when there is nothing to do: on a Debian 12
host with the main archive's lists that is ~0.9 s of CPU (one Python object per package, ~63,000 of them) and
~2.5 s per task and host in all; site.yml has eight such tasks, the largest single share of a converged host's
rerun (measured in this collection's README.md). This action asks dpkg first, one ``dpkg-query -W`` over the
connection (~10 ms, no module sent), and runs the apt module with the task's arguments unchanged only when a
package is not fully installed, or is at another version than an exact ``name=version`` asks for.

Anything it cannot decide from dpkg's answer (an architecture qualifier, a version relation other than ``=``,
a name dpkg does not know, such as a virtual package) goes to apt: the shortcut only ever says "nothing to do"
when dpkg shows exactly what was asked for.

Skipped with the install: apt's ``update_cache`` + ``cache_valid_time`` refresh. The lists only matter to what
apt could install, so a task with nothing to install needs no fresh lists; a task that must refresh them
regardless is ``ansible.builtin.apt: {update_cache: true}`` on its own.
"""

from __future__ import annotations

import fnmatch
import re
import shlex

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

MODULE = "ansible.builtin.apt"
# The apt arguments this action passes through; anything else (state: latest, upgrade, autoremove, deb, purge)
# is not "make sure these are installed" and belongs in ansible.builtin.apt itself.
ARGS = frozenset({"name", "state", "update_cache", "cache_valid_time", "allow_downgrade", "install_recommends",
                  "lock_timeout"})
# Debian policy 5.6.1 (package names) and 5.6.12 (versions); a spec outside these goes to apt undecided.
NAME = re.compile(r"[a-z0-9][a-z0-9+.-]+")
VERSION = re.compile(r"[A-Za-z0-9.+~:*-]+")
# dpkg-query expands \t and \n itself; db:Status-Abbrev is e.g. "ii " (want install, installed, no error flag).
QUERY_FORMAT = r"${Package}\t${db:Status-Abbrev}\t${Version}\n"


def parse_specs(names: list[str]) -> dict[str, str | None] | None:
    """{package: wanted version or None} for plain ``name`` and ``name=version`` specs; None when any spec is
    something else, so that apt decides."""
    wanted: dict[str, str | None] = {}
    for spec in names:
        name, sep, version = str(spec).partition("=")
        if not NAME.fullmatch(name) or (sep and not VERSION.fullmatch(version)) or name in wanted:
            return None
        wanted[name] = version if sep else None
    return wanted


def installed_versions(dpkg_query_stdout: str) -> dict[str, str]:
    """{package: version} of the fully installed packages in dpkg-query's output (QUERY_FORMAT)."""
    found = {}
    for line in dpkg_query_stdout.splitlines():
        fields = line.split("\t")
        # second letter i: installed; third blank: no reinstall-required error flag. Desired state (first
        # letter) may be i or h (held: still installed).
        if len(fields) == 3 and len(fields[1]) == 3 and fields[1][1] == "i" and fields[1][2] == " ":
            found[fields[0]] = fields[2]
    return found


def unsatisfied(wanted: dict[str, str | None], installed: dict[str, str]) -> list[str]:
    """The specs dpkg's answer does not satisfy (apt's ``=`` is an exact version, ``*`` a glob)."""
    missing = []
    for name, version in wanted.items():
        have = installed.get(name)
        if have is None or (version is not None and not fnmatch.fnmatchcase(have, version)):
            missing.append(f"{name}={version}" if version else name)
    return missing


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = ARGS

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        if args.get("state", "present") != "present":
            raise AnsibleActionFail(f"apt_packages: state must be present, got {args['state']!r} "
                                    "(other states are ansible.builtin.apt's)")
        names = args.get("name")
        names = [names] if isinstance(names, str) else list(names or [])
        if not names:
            raise AnsibleActionFail("apt_packages: 'name' lists no package")
        wanted = parse_specs(names)
        if wanted is not None:
            query = " ".join(["dpkg-query", "-W", "-f=" + shlex.quote(QUERY_FORMAT), "--", *map(shlex.quote, wanted)])
            # Read-only and readable by any user: no privilege escalation, also in check mode. Exit 1 only
            # means some name is unknown to dpkg (then it is not installed).
            answer = self._low_level_execute_command(query, sudoable=False)
            if answer.get("rc") in (0, 1):
                missing = unsatisfied(wanted, installed_versions(answer.get("stdout", "")))
                if not missing:
                    result.update(changed=False, msg=f"already installed: {', '.join(map(str, names))}")
                    return result
        try:
            module_result = self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        result.update(module_result)
        return result
