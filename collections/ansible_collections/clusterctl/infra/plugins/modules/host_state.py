#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Read, in one module run, everything a clusterctl role needs to know about a host before it acts."""

from __future__ import annotations

DOCUMENTATION = r"""
module: host_state
short_description: Read a role's managed directories, users, units and small files in one run
description:
  - Read-only (safe in check mode). A role runs it once, first; the C(clusterctl.infra.config_files) action
    compares its rendered files with the result and skips the host entirely when nothing differs, and the
    role's user and unit tasks are skipped when the user or unit is already as wanted. One module run per
    role and host instead of a stat per file, user and unit (each module run costs ~0.2 s of CPU).
  - Managed files are reported by digest, mode and owner only, never by content, so files holding secrets
    can be compared without their contents entering the result.
options:
  directories:
    description: Directories (or glob patterns of directories) to list, non-recursively.
    type: list
    elements: str
    default: []
  users:
    description: Users to look up in the passwd database.
    type: list
    elements: str
    default: []
  units:
    description: systemd units to ask C(systemctl is-enabled) about.
    type: list
    elements: str
    default: []
  read:
    description: Small text files (or glob patterns) whose first 4 KiB to return, e.g. sysfs attributes.
    type: list
    elements: str
    default: []
author: clusterctl maintainers
"""

RETURN = r"""
directories:
  description: Per existing directory, its mode/owner/group and its regular files (sha256, mode, owner, group).
  type: dict
  returned: always
scanned:
  description: The directory patterns that were listed; a directory matching one but absent from C(directories) does not exist.
  type: list
  returned: always
users:
  description: Per existing user, its uid, home and shell.
  type: dict
  returned: always
units:
  description: Per unit, the output of C(systemctl is-enabled) (C(not-found) when systemd does not know it).
  type: dict
  returned: always
contents:
  description: Per file read, its text (the first 4 KiB).
  type: dict
  returned: always
"""

import glob
import grp
import hashlib
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

MAX_DIGEST_BYTES = 1 << 20  # larger files get no digest: config_files then always asks the host
# A sysfs attribute is at most one page; /proc/cpuinfo's first CPU fits too. Keeps events small: this
# result is in every run's event log, per host.
MAX_READ_BYTES = 4096


def _owner(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _attributes(st: os.stat_result) -> dict:
    return {"mode": f"{stat.S_IMODE(st.st_mode):04o}", "owner": _owner(st.st_uid), "group": _group(st.st_gid)}


def _digest(path: str, size: int) -> str | None:
    if size > MAX_DIGEST_BYTES:
        return None
    with open(path, "rb") as handle:
        return hashlib.sha256(handle.read()).hexdigest()


def list_directory(path: str) -> dict:
    info = _attributes(os.stat(path))
    files = {}
    for entry in os.scandir(path):
        # Symlinks and special files get an entry without a digest: config_files then asks the host.
        if not entry.is_file(follow_symlinks=False):
            files[entry.name] = {"type": "other", "sha256": None, **_attributes(entry.stat(follow_symlinks=False))}
        else:
            st = entry.stat(follow_symlinks=False)
            try:
                files[entry.name] = {"sha256": _digest(entry.path, st.st_size), **_attributes(st)}
            except OSError:
                continue  # vanished or unreadable: no entry, so no shortcut for it
    info["files"] = files
    return info


def lookup_user(name: str) -> dict | None:
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        return None
    return {"uid": entry.pw_uid, "home": entry.pw_dir, "shell": entry.pw_shell}


def unit_state(module: AnsibleModule, systemctl: str | None, unit: str) -> str:
    if systemctl is None:
        return "not-found"
    # One call per unit: with several units systemctl prints nothing for unknown ones, so lines would shift.
    rc, out, _ = module.run_command([systemctl, "is-enabled", unit])
    state = out.strip().splitlines()[-1] if out.strip() else ""
    return state or "not-found"


def read_text(path: str) -> str:
    with open(path, "rb") as handle:
        return handle.read(MAX_READ_BYTES).decode("utf-8", errors="replace")


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "str", "default": []},
            "users": {"type": "list", "elements": "str", "default": []},
            "units": {"type": "list", "elements": "str", "default": []},
            "read": {"type": "list", "elements": "str", "default": []},
        },
        supports_check_mode=True,
    )
    params = module.params
    directories = {}
    for pattern in params["directories"]:
        for path in sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]:
            if os.path.isdir(path) and not os.path.islink(path):
                directories[path] = list_directory(path)
    users = {name: found for name in params["users"] if (found := lookup_user(name)) is not None}
    systemctl = module.get_bin_path("systemctl") if params["units"] else None
    units = {unit: unit_state(module, systemctl, unit) for unit in params["units"]}
    contents = {}
    for pattern in params["read"]:
        for path in sorted(glob.glob(pattern)):
            try:
                contents[path] = read_text(path)
            except OSError as exc:
                module.fail_json(msg=f"cannot read {path}: {exc.strerror}")
    module.exit_json(changed=False, directories=directories, scanned=params["directories"], users=users,
                     units=units, contents=contents)


if __name__ == "__main__":
    main()
