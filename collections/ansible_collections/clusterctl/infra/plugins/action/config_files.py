# Part of clusterctl. Apache-2.0.
"""Render a role's templates on the controller and put them in place with one module run, or none.

`ansible.builtin.template` costs two module runs per file (a stat, then a copy or a file), whether or not
the file changes: ~0.4 s of CPU per file and host, most of a provisioning run on a converged fleet. This
action renders every file of a task locally (exactly like the template action: role template search path,
`ansible_managed` and friends), then:

- when given `state` (the registered result of `clusterctl.infra.host_state`, read at the start of the role)
  and every directory, file and absent path already matches it (sha256, mode, owner, group), it reports
  ok without contacting the host;
- otherwise it sends all rendered files to the `config_files` module, which rewrites only the differing ones
  (atomically) in one module run.

A `state` older than a change the role made itself would be wrong; roles read it once, after their package
installs and before their first write, and every path is written by one task only.

Task arguments (see the module and README.md for the rest):
  directories: [{path, mode, owner, group}]
  files: [{src: TEMPLATE | content: TEXT, dest, mode, owner, group}]
  absent: [PATH]
  prune: [{path, patterns}]
  state: REGISTERED host_state RESULT
An entry with `items: LIST` stands for one entry per item: the item is the template variable named by
`loop_var` (default `item`), and `{key}` in `dest`/`path` is replaced by the item's value for that key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath

from ansible._internal._templating import _template_vars  # the template action's own helper (2.19 line)
from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template

MODULE = "clusterctl.infra.config_files"
ARGS = frozenset({"directories", "files", "absent", "prune", "state"})
# ansible.builtin.template's defaults, so a template renders byte for byte as it did there.
TEMPLATE_DEFAULTS = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}


class Unknown(Exception):
    """The host state does not say: ask the host."""


def expand(entries: list, key: str) -> list[tuple[dict, dict]]:
    """(entry, template variables) per concrete entry; `items` entries become one per item."""
    expanded = []
    for entry in entries or []:
        if not isinstance(entry, dict) or key not in entry:
            raise AnsibleActionFail(f"config_files: every entry needs '{key}', got {entry!r}")
        if "items" not in entry:
            expanded.append((entry, {}))
            continue
        loop_var = entry.get("loop_var", "item")
        for item in entry["items"]:
            concrete = {k: v for k, v in entry.items() if k not in ("items", "loop_var")}
            try:
                concrete[key] = str(entry[key]).format_map(item)
            except (KeyError, TypeError, ValueError) as exc:
                raise AnsibleActionFail(f"config_files: cannot fill {entry[key]!r} from item {item!r}: {exc}") from exc
            expanded.append((concrete, {loop_var: item}))
    return expanded


def _mode(value) -> int:
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 8)
    except ValueError:
        raise AnsibleActionFail(f"config_files: mode must be an octal string like '0644', got {value!r}") from None


def _same_attributes(wanted: dict, found: dict) -> bool:
    return (_mode(wanted["mode"]) == _mode(found["mode"]) and wanted.get("owner", "root") == found["owner"]
            and wanted.get("group", "root") == found["group"])


class HostState:
    """Lookups in a registered host_state result."""

    def __init__(self, state: dict):
        self.directories = state.get("directories") or {}
        self.scanned = state.get("scanned") or []

    def directory(self, path: str) -> dict | None:
        """The listing of `path`; None when it is known not to exist; Unknown when it was not looked at."""
        if path in self.directories:
            return self.directories[path]
        if any(fnmatch.fnmatchcase(path, pattern) for pattern in self.scanned):
            return None
        raise Unknown(path)

    def in_place(self, directories: list, files: list, absent: list, prune: list) -> bool:
        try:
            for entry in directories:
                found = self.directory(entry["path"])
                if found is None or not _same_attributes(entry, found):
                    return False
            for entry in files:
                listing = self.directory(posixpath.dirname(entry["dest"]))
                found = (listing or {}).get("files", {}).get(posixpath.basename(entry["dest"]))
                if (found is None or found.get("sha256") != hashlib.sha256(entry["content"].encode()).hexdigest()
                        or not _same_attributes(entry, found)):
                    return False
            for path in absent:
                listing = self.directory(posixpath.dirname(path))
                if listing is not None and posixpath.basename(path) in listing.get("files", {}):
                    return False
            wanted = {entry["dest"] for entry in files}
            for rule in prune:
                listing = self.directory(rule["path"]) or {}
                for name in listing.get("files", {}):
                    path = posixpath.join(rule["path"], name)
                    if path not in wanted and any(fnmatch.fnmatchcase(name, p) for p in rule["patterns"]):
                        return False
        except Unknown:
            return False
        return True


class ActionModule(ActionBase):

    TRANSFERS_FILES = False
    _VALID_ARGS = ARGS

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super().run(tmp, task_vars)
        args = self._task.args
        try:
            directories = [self._attributes(entry) | {"path": entry["path"]}
                           for entry, _ in expand(args.get("directories"), "path")]
            files = [self._attributes(entry) | {"dest": entry["dest"], "content": self._content(entry, extra, task_vars)}
                     for entry, extra in expand(args.get("files"), "dest")]
            absent = list(args.get("absent") or [])
            prune = list(args.get("prune") or [])
            state = args.get("state")
            if state and HostState(state).in_place(directories, files, absent, prune):
                result.update(changed=False, changes=[],
                              msg=f"{len(files)} file(s) and {len(directories)} directory(ies) already in place")
                return result
            module_result = self._execute_module(
                module_name=MODULE, task_vars=task_vars,
                module_args={"directories": directories, "files": files, "absent": absent, "prune": prune})
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        # The module's invocation would repeat every rendered file (secrets included) in the event log.
        module_result.pop("invocation", None)
        result.update(module_result)
        return result

    @staticmethod
    def _attributes(entry: dict) -> dict:
        if "mode" not in entry:
            raise AnsibleActionFail(f"config_files: {entry.get('dest') or entry.get('path')}: 'mode' is required")
        return {"mode": str(entry["mode"]), "owner": entry.get("owner", "root"), "group": entry.get("group", "root")}

    def _content(self, entry: dict, extra_vars: dict, task_vars: dict) -> str:
        if "content" in entry:
            return str(entry["content"])
        if "src" not in entry:
            raise AnsibleActionFail(f"config_files: {entry['dest']}: give 'src' (a template) or 'content'")
        try:
            source = self._find_needle("templates", entry["src"])
        except AnsibleError as exc:
            raise AnsibleActionFail(str(exc)) from exc
        # Same search path and template variables as ansible.builtin.template.
        searchpath = list(task_vars.get("ansible_search_path", [])) + [self._loader._basedir, os.path.dirname(source)]
        searchpath = [path for base in searchpath for path in (os.path.join(base, "templates"), base)]
        template_vars = dict(task_vars, **extra_vars)
        template_vars.update(_template_vars.generate_ansible_template_vars(
            path=entry["src"], fullpath=source, dest_path=entry["dest"],
            include_ansible_managed="ansible_managed" not in template_vars))
        templar = self._templar.copy_with_new_env(searchpath=searchpath, available_variables=template_vars)
        rendered = templar.template(trust_as_template(self._loader.get_text_file_contents(source)),
                                    escape_backslashes=False, overrides=TEMPLATE_DEFAULTS)
        return "" if rendered is None else str(rendered)
