"""Load an Ansible inventory exactly as Ansible resolves it and turn it into the cluster model.

Uses Ansible's own InventoryManager and VariableManager (INI or YAML sources, group_vars/, host_vars/,
patterns), so there is no second parser that could disagree with what ``ansible-playbook`` sees.

Errors name the place: before Ansible reads anything, every YAML file of the inventory (sources,
``group_vars/``, ``host_vars/``) is parsed once for syntax only, so a mistake is one line
``FILE:LINE:COLUMN: YAML: problem`` instead of Ansible's per-plugin warnings and a final line without the
location. Ansible's warnings while the inventory loads are collected, not printed; when parsing fails,
the message of the plugin that matches the file type (yaml for .yml/.yaml/.json, ini otherwise) is kept.
A ``--limit`` that selects nothing names the pattern and the inventory's groups.

Vault: ``vault_secrets`` (:mod:`cluster.ansible.vault`, e.g. from ``--vault-password-file``) decrypt vars
files encrypted as a whole and inline ``!vault`` values; without them, the secrets Ansible's configuration
names (``ANSIBLE_VAULT_PASSWORD_FILE``...) are used, as ansible-playbook would. The secrets are in effect
only while the inventory loads: the variables of :data:`cluster.spec.NAMES` (the model's and the typed
settings') are templated and decrypted then, once, and anything that cannot be is a one-line
InventoryError naming where. Nothing decrypts later: the model carries plain values, and ``check_vault``
asks the load to list every other inline ``!vault`` value that would not decrypt (what a playbook run
would trip on) while the secrets are still there.

Executable inventories (Ansible's ``script`` plugin) are code: loading one runs it, as the operator, and
``inventory validate`` must be safe to point at any file. They are refused, and the ``script``
plugin is disabled for every source (a directory source would otherwise run each executable file in
it), unless the operator asks with ``CLUSTERCTL_ALLOW_INVENTORY_SCRIPTS=1`` in the environment (an
environment variable rather than a flag so that ``provision``, which hands the same path to
ansible-playbook, follows the same rule).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import model, spec, validate
from cluster import variables as declared
from cluster.ansible import vault
from common.errors import ClusterctlError, ExitCode
from common.text import plural, suggest

ALLOW_SCRIPTS_ENV = "CLUSTERCTL_ALLOW_INVENTORY_SCRIPTS"
_ENABLED: dict[str, list[str]] = {}


class InventoryError(ClusterctlError):
    exit_code = ExitCode.USAGE

    def __init__(self, message: str, problems: list[validate.Problem] | None = None):
        super().__init__(message)
        self.problems = problems or []


@dataclass
class LoadedInventory:
    path: Path
    selected: dict[str, dict[str, Any]]  # host -> resolved variables, for the --limit selection
    everyone: dict[str, dict[str, Any]]  # host -> resolved variables, whole inventory
    undecryptable: list[str] = field(default_factory=list)  # with check_vault: vault.undecryptable(selected)
    # group -> its hosts in the order a play over that group runs them (Ansible's get_groups_dict)
    groups: dict[str, list[str]] = field(default_factory=dict)
    # declared.placeholders(selected), checked while the vault secrets were in effect
    placeholders: list[validate.Problem] = field(default_factory=list)
    sealed: int = 0  # inline vault values of the selected hosts (placeholders inside them need the password)
    placeholders_checked: bool = False  # vault secrets were in effect: sealed values were checked too
    unrendered: list[validate.Problem] = field(default_factory=list)  # variables whose template failed


YAML_SUFFIXES = (".yml", ".yaml", ".json")


class _SyntaxLoader(yaml.SafeLoader):
    """Syntax only: Ansible's own tags (``!vault``, ``!unsafe``) are accepted without being constructed."""


_SyntaxLoader.add_multi_constructor("!", lambda loader, suffix, node: None)


def _vars_files(directory: Path) -> list[Path]:
    files = []
    for sub in ("group_vars", "host_vars"):
        base = directory / sub
        if base.is_dir():
            files += [p for p in sorted(base.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    return files


def _inventory_files(path: Path) -> list[tuple[Path, bool]]:
    """(file, is a vars file) for every file Ansible will read as YAML from this inventory source."""
    if path.is_file():
        sources, directory = [path], path.parent
    else:
        directory = path
        sources = [
            p for p in sorted(path.iterdir())
            if p.is_file() and not p.name.startswith(".")
            and not any(p.name.endswith(ext) for ext in _ignored_suffixes())
        ]
    found = [(p, False) for p in sources if p.suffix in YAML_SUFFIXES and not os.access(p, os.X_OK)]
    return found + [(p, True) for p in _vars_files(directory) if p.suffix in ("", *YAML_SUFFIXES)]


def _ignored_suffixes() -> tuple[str, ...]:
    import ansible.constants as C

    return tuple(C.INVENTORY_IGNORE_EXTS)


def check_syntax(path: Path) -> None:
    """InventoryError ``FILE:LINE:COLUMN: YAML: problem`` for the first YAML file that does not parse."""
    for file, _ in _inventory_files(path):
        try:
            text = file.read_text(errors="replace")
        except OSError as exc:
            raise InventoryError(f"{file}: cannot read: {exc.strerror or exc}") from None
        if text.lstrip().startswith("$ANSIBLE_VAULT"):
            continue  # encrypted as a whole: the vault loader reports what is wrong with it
        try:
            yaml.load(text, Loader=_SyntaxLoader)  # noqa: S506 - _SyntaxLoader is a SafeLoader
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            where = f"{file}:{mark.line + 1}:{mark.column + 1}" if mark else str(file)
            problem = exc.problem or exc.context or "not valid YAML"
            raise InventoryError(f"{where}: YAML: {problem}") from None
        except yaml.YAMLError as exc:
            raise InventoryError(f"{file}: YAML: {' '.join(str(exc).split())}") from None


class _Warnings:
    """Collects the warnings Ansible's Display would print while the inventory loads (one per plugin
    that tried a source, the "For example: raw: ..." tips): the caller decides what a person sees."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    def __enter__(self) -> _Warnings:
        from ansible.utils.display import Display

        self._display = Display()  # the process-wide instance
        self._display.warning = lambda msg, *a, **k: self.messages.append(str(msg))
        self._display.error_as_warning = lambda msg, exception, *a, **k: self.messages.append(
            f"{msg or ''} {getattr(exception, 'message', None) or exception}".strip()
        )
        return self

    def __exit__(self, *exc) -> None:
        del self._display.warning  # back to the class's methods
        del self._display.error_as_warning

    def summarize(self, path: Path, most: int = 5) -> None:
        """After a load that worked: each distinct warning once, its first line only, on stderr."""
        import sys

        distinct = list(dict.fromkeys(m.strip().splitlines()[0] for m in self.messages if m.strip()))
        for message in distinct[:most]:
            print(f"warning: {path}: ansible: {message}", file=sys.stderr)
        if len(distinct) > most:
            print(f"warning: {path}: (+{len(distinct) - most} more ansible warnings)", file=sys.stderr)

    def plugin_failure(self, source: Path) -> str | None:
        """The failure message of the plugin matching ``source``'s type, first line only."""
        plugins = ("yaml", "auto") if source.suffix in YAML_SUFFIXES else ("ini",)
        for name in plugins:
            for message in self.messages:
                for prefix in (f"Failed to parse inventory with '{name}' plugin: ",
                               f"Failed to parse inventory with '{name}' plugin. "):
                    if message.startswith(prefix):
                        text = message[len(prefix):].strip().splitlines()[0]
                        return text.removeprefix("Failed to parse inventory: ").strip()
        return None


def _ansible_objects(path: Path, warnings: _Warnings, secrets: vault.VaultSecrets):
    """Ansible's loader, inventory and variable manager for ``path``; its DataLoader decrypts files
    encrypted as a whole with ``secrets`` (inline values: :func:`vault.secrets_in_effect`)."""
    import ansible.constants as C
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager
    from ansible.parsing.dataloader import DataLoader
    from ansible.vars.manager import VariableManager

    # Fail on an unparseable source instead of Ansible's default warning + empty inventory. Set on the
    # constant, not in os.environ, so child processes (ansible-lint's syntax checks) keep their default.
    C.INVENTORY_UNPARSED_IS_FAILED = True
    _ENABLED.setdefault("default", list(C.INVENTORY_ENABLED))  # Ansible's configured list, once
    enabled = _ENABLED["default"]
    if scripts_allowed():
        C.INVENTORY_ENABLED = list(enabled)
    else:
        _refuse_scripts(path)
        C.INVENTORY_ENABLED = [p for p in enabled if p != "script"]
    C.HOST_PATTERN_MISMATCH = "ignore"  # a --limit that matches nothing is load_inventory's one-line error
    check_syntax(path)
    loader = DataLoader()
    loader.set_vault_secrets(secrets)  # before the inventory is parsed: its source may be encrypted too
    try:
        inventory = InventoryManager(loader=loader, sources=[str(path)])
    except AnsibleError as exc:
        raise _source_error(path, exc, warnings) from None
    return loader, inventory, VariableManager(loader=loader, inventory=inventory)


def scripts_allowed() -> bool:
    return os.environ.get(ALLOW_SCRIPTS_ENV, "") == "1"


def _refuse_scripts(path: Path) -> None:
    """An executable inventory file (or one inside an inventory directory) is refused before Ansible sees
    it; Ansible's directory loader skips the same hidden and backup names this skips."""
    candidates = [path] if path.is_file() else [
        p for p in path.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(path).parts)
        and not {"group_vars", "host_vars"} & set(p.relative_to(path).parts)
    ] if path.is_dir() else []
    for candidate in candidates:
        if os.access(candidate, os.X_OK):
            raise InventoryError(
                f"{candidate}: executable inventory (a script) is not run: set {ALLOW_SCRIPTS_ENV}=1 to allow it, "
                "or remove the executable bit if it is a static INI/YAML file"
            )


def _source_error(path: Path, exc: BaseException, warnings: _Warnings) -> InventoryError:
    """What made the source unparseable, from the plugin that should have read it."""
    if vault.failure(exc):
        return _error(path, exc, "cannot parse inventory: ")
    sources = [path] if path.is_file() else [
        p for p in sorted(path.iterdir()) if p.is_file() and not p.name.startswith(".")
        and not any(p.name.endswith(ext) for ext in _ignored_suffixes())
    ]
    if not sources:
        return InventoryError(f"{path}: no inventory source here (expected hosts.yml or an INI hosts file; "
                              "create a virtual one with clusterctl virtual create -i DIR)")
    for source in sources:
        if message := warnings.plugin_failure(source):
            if source.suffix in YAML_SUFFIXES:
                return InventoryError(f"{source}: YAML: {message}")
            line = _ini_error_line(source)
            return InventoryError(f"{source}{f':{line}' if line else ''}: INI: {message}")
    return _error(path, exc, "cannot parse inventory: ")


def _ini_error_line(source: Path) -> int | None:
    """The line Ansible's ini plugin stopped at, or None. Its error names only the file: the plugin counts
    lines in its ``_origin`` but resets the count before raising (ansible-core 2.19), so parse the file
    again with ``_parse`` watched and read the count there."""
    try:
        from ansible.inventory.data import InventoryData
        from ansible.parsing.dataloader import DataLoader
        from ansible.plugins.loader import inventory_loader

        plugin = inventory_loader.get("ini")
        seen: dict[str, int | None] = {}
        parse_lines = plugin._parse

        def watched(lines):
            try:
                return parse_lines(lines)
            except Exception:
                seen["line"] = plugin._origin.line_num
                raise

        plugin._parse = watched
        try:
            plugin.parse(InventoryData(), DataLoader(), str(source.resolve()))
        except Exception:  # noqa: BLE001 -- the failure itself is already known; only its line is wanted
            pass
        line = seen.get("line")
        return line if isinstance(line, int) and line > 0 else None
    except Exception:  # noqa: BLE001 -- a changed private API: the message keeps the file alone
        return None


def has_template(value: Any) -> bool:
    """True when a string anywhere in ``value`` (nested lists/mappings too) holds Jinja2 syntax."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    if isinstance(value, list | tuple):
        return any(has_template(v) for v in value)
    if isinstance(value, Mapping):
        return any(has_template(v) for v in value.values())
    return False


def _error(path: Path, exc: BaseException, what: str = "") -> InventoryError:
    """One-line InventoryError for an Ansible error; a vault failure says which file or value, and why."""
    return InventoryError(f"{path}: {what}{vault.failure(exc) or ' '.join(str(exc).split())}")


def _resolve(path: Path, host: str, loader, hostvars: dict[str, Any],
             problems: list[validate.Problem]) -> dict[str, Any]:
    """The host's variables with those clusterctl reads (:data:`cluster.spec.NAMES`) decrypted (inline
    ``!vault``) and templated; the others as Ansible gave them. A template that fails (an undefined
    variable) is a problem appended to ``problems``, reported with every other one, and the variable is
    left out (so no rule judges the unrendered text)."""
    from ansible.errors import AnsibleError
    from ansible.template import Templar

    templar = Templar(loader=loader, variables=hostvars)
    resolved = dict(hostvars)
    for key in spec.NAMES:
        value = hostvars.get(key)
        try:
            if vault.is_encrypted(value):
                resolved[key] = vault.decrypted(value)
            elif value is not None and has_template(value):
                resolved[key] = templar.template(value)
        except AnsibleError as exc:
            if key in spec.SECRETS:
                # the vault check's own words (no password given / cannot decrypt: why), as provision says it
                resolved[key] = spec.Undecryptable(key, vault.failure_reason(exc) or str(exc).splitlines()[0][:120])
                continue
            if vault.failure(exc):
                raise _error(path, exc, f"{host}: {key}: ") from None
            del resolved[key]
            problems.append(declared.with_origin(validate.Problem(
                host, key, None, f"cannot be templated: {' '.join(str(exc).split())[:200]}"),
                {host: hostvars}, path))
    return resolved


def load_inventory(
    path: str | os.PathLike, limit: str | None = None, vault_secrets: vault.VaultSecrets | None = None,
    check_vault: bool = False,
) -> LoadedInventory:
    """The hosts' variables as Ansible resolves them, clusterctl's own templated and decrypted.

    ``vault_secrets``: None = those Ansible's configuration names. ``check_vault``: also list (in
    ``undecryptable``) every other inline vault value of the selected hosts that would not decrypt.
    """
    path = Path(path)
    if not path.exists():
        raise InventoryError(f"{path}: inventory not found")
    if nested := _nested_inventories(path):
        # Ansible would merge them into one, and each one's hosts would lack the other's group_vars
        raise InventoryError(f"{path}: a directory of inventories ({', '.join(nested)}), not one: pass one of "
                             f"them, e.g. -i {path / nested[0]}")
    from ansible.errors import AnsibleError

    secrets = list(vault_secrets) if vault_secrets is not None else vault.configured_vault_secrets()
    everyone: dict[str, dict[str, Any]] = {}
    undecryptable: list[str] = []
    unrendered: list[validate.Problem] = []
    with _Warnings() as warnings, vault.secrets_in_effect(secrets):
        loader, inventory, variables = _ansible_objects(path, warnings, secrets)
        try:
            for host in inventory.get_hosts("all"):
                hostvars = variables.get_vars(host=host, include_hostvars=False)
                everyone[host.name] = _resolve(path, host.name, loader, hostvars, unrendered)
            selected_names = [h.name for h in inventory.get_hosts(limit)] if limit else list(everyone)
            unmatched = _unmatched_terms(inventory, limit) if limit and selected_names else []
            groups = {name: list(hosts) for name, hosts in inventory.get_groups_dict().items()}
        except AnsibleError as exc:
            raise _error(path, exc) from None
        selected = {n: everyone[n] for n in selected_names}
        if check_vault:
            undecryptable = vault.undecryptable(selected, path if path.is_dir() else path.parent)
        placeholders = declared.placeholders(selected, path)
    warnings.summarize(path)
    if limit and (unmatched or not selected_names):
        names = sorted(g for g in groups if g not in ("all", "ungrouped"))
        # A part that matches nothing (a typo among several hosts) is the same mistake as a whole limit that
        # does: Ansible would only warn, and the run would go ahead on fewer hosts than meant.
        what = f"--limit {limit!r}: {', '.join(map(repr, unmatched))}" if unmatched else f"--limit {limit!r}"
        near = suggest((unmatched or [limit])[0], [*names, *everyone])
        raise InventoryError(f"{what} matches no host in {path}{near} (groups: {', '.join(names) or '-'}; "
                             f"hosts: {_first(list(everyone))})")
    return LoadedInventory(path, selected, everyone, undecryptable, groups, placeholders,
                           declared.sealed_values(selected), bool(secrets),
                           [p for p in unrendered if p.host in selected])


def _nested_inventories(path: Path) -> list[str]:
    """The subdirectories that are inventories of their own (a hosts file), when ``path`` holds no inventory
    file itself: ``-i inventory`` meant one of ``inventory/sample`` and ``inventory/virtual``."""
    if not path.is_dir() or any(p.is_file() and not p.name.startswith(".") for p in path.iterdir()):
        return []
    return sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith(".")
                  and any((d / name).is_file() for name in ("hosts.yml", "hosts.yaml", "hosts", "hosts.ini")))


def _unmatched_terms(inventory, limit: str) -> list[str]:
    """The parts of a host pattern (``a,b`` / ``a:b``) that select nothing; exclusions (``!x``) and
    intersections (``&x``) are left out, an empty one of those is no mistake."""
    from ansible.inventory.manager import split_host_pattern

    return [term for term in split_host_pattern(limit)
            if term and term[0] not in "!&" and not inventory.get_hosts(term)]


def _first(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f", ... (+{len(names) - limit})" if len(names) > limit else "") or "-"


def load_cluster(
    path: str | os.PathLike, limit: str | None = None, vault_secrets: vault.VaultSecrets | None = None
) -> model.Cluster:
    """Load, validate (raising InventoryError listing every problem) and build the cluster model."""
    return cluster_of(load_inventory(path, limit, vault_secrets))


def problems_of(loaded: LoadedInventory) -> list[validate.Problem]:
    """Every problem of a loaded inventory: the rules over its hosts' variables (each naming the file that
    sets the variable), then every variable that nothing reads."""
    return loaded.unrendered + [declared.with_origin(p, loaded.selected, loaded.path)
                                for p in validate.validate(loaded.selected, loaded.everyone)] + declared.unknown_variables(
        loaded.selected, loaded.path)


def cluster_of(loaded: LoadedInventory) -> model.Cluster:
    """Validate an already loaded inventory (InventoryError listing every problem) and build the model."""
    problems = problems_of(loaded)
    if problems:
        raise InventoryError(
            f"{loaded.path}: {plural(len(problems), 'inventory problem')}:\n{validate.format_problems(problems)}", problems
        )
    return model.build_cluster(loaded.selected, loaded.groups.get("consul_servers"))

