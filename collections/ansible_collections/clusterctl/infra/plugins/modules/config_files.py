#!/usr/bin/python
# Part of clusterctl. Apache-2.0.
"""Put a role's directories and rendered files in place in one module run (the remote half of config_files)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: config_files
short_description: Write a set of rendered files and their directories in one module run
description:
  - The remote half of the C(clusterctl.infra.config_files) action, which renders the templates on the
    controller and sends their text here. Use the action, not this module, in tasks.
  - Each file is compared by content, mode, owner and group; only differing files are rewritten
    (atomically, through a temporary file in the same directory), so a second run changes nothing.
    Supports check mode and diff mode.
options:
  directories:
    description: Directories to create, each with path, mode, owner, group.
    type: list
    elements: dict
    default: []
  files:
    description: Files to write, each with dest, content, mode, owner, group.
    type: list
    elements: dict
    default: []
  absent:
    description: Paths that must not exist.
    type: list
    elements: str
    default: []
  prune:
    description: >-
      Directories to clean, each with path and patterns: files matching a pattern and not among C(files)
      are removed (e.g. service definitions of inference units that no longer exist).
    type: list
    elements: dict
    default: []
author: clusterctl maintainers
"""

import fnmatch
import hashlib
import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

MAX_DIFF_BYTES = 64 << 10

_ENTRY_OPTIONS = {
    "mode": {"type": "str", "required": True},
    "owner": {"type": "str", "default": "root"},
    "group": {"type": "str", "default": "root"},
}


def _file_args(path: str, entry: dict) -> dict:
    return {"path": path, "mode": entry["mode"], "owner": entry["owner"], "group": entry["group"],
            # SELinux context: left as the policy's default (like the template module without se* options).
            "secontext": [None, None, None], "attributes": None}


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        return None


def _diff_text(data: bytes | None) -> str:
    if data is None:
        return ""
    if len(data) > MAX_DIFF_BYTES or b"\0" in data:
        return f"({len(data)} bytes, not shown)\n"
    return data.decode("utf-8", errors="replace")


def ensure_directory(module: AnsibleModule, entry: dict, report: list, diffs: list) -> None:
    path = entry["path"]
    if os.path.lexists(path) and not os.path.isdir(path):
        module.fail_json(msg=f"{path} exists and is not a directory")
    created = not os.path.isdir(path)
    if created:
        diffs.append({"before_header": path, "after_header": path, "before": "(absent)\n", "after": "(directory)\n"})
        if not module.check_mode:
            os.makedirs(path)
    changed = created
    if not (created and module.check_mode):
        changed = module.set_fs_attributes_if_different(_file_args(path, entry), changed)
    if changed:
        report.append({"path": path, "action": "created" if created else "attributes"})


def ensure_file(module: AnsibleModule, entry: dict, report: list, diffs: list) -> None:
    dest = entry["dest"]
    if os.path.isdir(dest):
        module.fail_json(msg=f"{dest} is a directory, expected a file")
    wanted = entry["content"].encode("utf-8")
    current = _read(dest)
    rewrite = current is None or hashlib.sha256(current).digest() != hashlib.sha256(wanted).digest()
    if rewrite:
        diffs.append({"before_header": dest, "after_header": dest,
                      "before": _diff_text(current), "after": _diff_text(wanted)})
        if not module.check_mode:
            directory = os.path.dirname(dest) or "."
            if not os.path.isdir(directory):
                module.fail_json(msg=f"{dest}: directory {directory} does not exist (list it under directories)")
            # atomic_move gives a file it creates the umask's mode (0644 under 022) until the attributes below
            # set the entry's own: under 077 a new file is never wider than 0600 (root's) in between.
            umask = os.umask(0o077)
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".clusterctl.")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(wanted)
                module.atomic_move(tmp, dest)
            finally:
                os.umask(umask)
                if os.path.exists(tmp):
                    os.unlink(tmp)
    changed = rewrite
    if not (current is None and module.check_mode):
        changed = module.set_fs_attributes_if_different(_file_args(dest, entry), changed)
    if changed:
        action = "created" if current is None else "updated" if rewrite else "attributes"
        report.append({"path": dest, "action": action})


def remove(module: AnsibleModule, path: str, report: list, diffs: list) -> None:
    if not os.path.lexists(path):
        return
    if os.path.isdir(path) and not os.path.islink(path):
        module.fail_json(msg=f"{path} is a directory; config_files removes files only")
    diffs.append({"before_header": path, "after_header": path, "before": _diff_text(_read(path)), "after": ""})
    if not module.check_mode:
        os.unlink(path)
    report.append({"path": path, "action": "removed"})


def stale_files(prune: list, wanted: set) -> list:
    stale = []
    for rule in prune:
        if not os.path.isdir(rule["path"]):
            continue
        for name in sorted(os.listdir(rule["path"])):
            path = os.path.join(rule["path"], name)
            if path not in wanted and any(fnmatch.fnmatch(name, pattern) for pattern in rule["patterns"]):
                stale.append(path)
    return stale


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "directories": {"type": "list", "elements": "dict", "default": [],
                            "options": {"path": {"type": "path", "required": True}, **_ENTRY_OPTIONS}},
            "files": {"type": "list", "elements": "dict", "default": [],
                      "options": {"dest": {"type": "path", "required": True},
                                  "content": {"type": "str", "required": True}, **_ENTRY_OPTIONS}},
            "absent": {"type": "list", "elements": "path", "default": []},
            "prune": {"type": "list", "elements": "dict", "default": [],
                      "options": {"path": {"type": "path", "required": True},
                                  "patterns": {"type": "list", "elements": "str", "required": True}}},
        },
        supports_check_mode=True,
    )
    params = module.params
    report: list = []
    diffs: list = []
    for entry in params["directories"]:
        ensure_directory(module, entry, report, diffs)
    for entry in params["files"]:
        ensure_file(module, entry, report, diffs)
    wanted = {entry["dest"] for entry in params["files"]}
    for path in list(params["absent"]) + stale_files(params["prune"], wanted):
        remove(module, path, report, diffs)
    result = {"changed": bool(report), "changes": report}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
