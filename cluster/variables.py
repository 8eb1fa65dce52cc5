"""Every variable an inventory may set, and the two checks over what an inventory sets: unknown names and
placeholders left in place of a value.

A variable that nothing reads is ignored by Ansible without a word: ``ui_size: 2`` leaves the node at
the default ``iu_size``, ``gpu_modle`` judges it against another GPU's thresholds. :func:`known` is every
name something reads, each with its reader:

- clusterctl's Python: :data:`cluster.spec.NAMES`;
- each role (``roles/<role>``): the options of ``meta/argument_specs.yml``, the keys of
  ``defaults/main.yml``, and the variables its defaults' templates read (``bmc_address`` reaches
  ``cpu_cstates`` through ``cpu_cstates_bmc``'s default);
- the playbooks (``playbooks/*.yml``, ``playbooks/tasks/``): the variables their templates read
  (``clusterctl_batches``, ``rolling_restart_drain_timeout_s``);
- the simulator (:data:`SIMULATOR`, virtual inventories only);
- Ansible itself (:mod:`cluster.ansible.own_variables`): its magic variables (``inventory_hostname``,
  ``group_names``...), the connection and privilege variables (``ansible_host``, ``ansible_user``,
  ``ansible_become``...) and every variable its configuration and its ssh/local connection, sudo/su
  become and sh shell plugins read.

Anything else is "unknown variable", named with the file (and line) that sets it and the nearest known
name. A site's own variables (for its own playbooks or templates) start with :data:`SITE_PREFIX`, or are
listed in :data:`SITE_LIST` (itself a ``site_`` variable): both are left alone.

A placeholder is a value starting :data:`PLACEHOLDER` (``inventory/sample``'s secrets decrypt to
``REPLACE-ME: what goes here``): a copied sample that still has one would send it to a node as a token,
a key or a password. A vault-encrypted value is checked when the vault password is given; a problem names
the file and its variables, never the value.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from cluster import spec
from cluster.spec import Problem
from common.text import suggest

REPO_ROOT = Path(__file__).resolve().parents[1]
SITE_PREFIX = "site_"
SITE_LIST = "site_variables"
PLACEHOLDER = "REPLACE-ME"
# Read by sim/ (the simulated machines of a virtual inventory) and by the virtual inventory's own templates.
SIMULATOR = ("sim_hardware", "sim_faults", "sim_command_delay_s", "consul_virtual_token_seed")


class _KeysOnly(yaml.SafeLoader):
    """Role and playbook YAML with Ansible's tags (``!vault``, ``!unsafe``) read as plain scalars."""


_KeysOnly.add_multi_constructor("!", lambda loader, suffix, node: loader.construct_scalar(node)
                                if isinstance(node, yaml.ScalarNode) else None)


def _load(path: Path) -> Any:
    try:
        return yaml.load(path.read_text(), Loader=_KeysOnly)  # noqa: S506 - a SafeLoader
    except (OSError, yaml.YAMLError):
        return None


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, Mapping):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


class _AnyName(dict):
    """Every filter and test name exists: Ansible's (``bool``, ``to_uuid``) are unknown to plain Jinja,
    whose compiler would refuse the template."""

    def __contains__(self, name: object) -> bool:
        return True

    def get(self, name: Any, default: Any = None) -> Any:
        return super().get(name) or (lambda *args, **kwargs: None)


def template_reads(value: Any) -> set[str]:
    """The variables the Jinja templates anywhere in ``value`` read (a template that does not parse: none)."""
    import jinja2
    from jinja2 import meta

    env = jinja2.Environment()  # noqa: S701 - parsed only, never rendered
    env.filters, env.tests = _AnyName(env.filters), _AnyName(env.tests)
    names: set[str] = set()
    for text in _strings(value):
        if "{{" in text or "{%" in text:
            try:
                names |= meta.find_undeclared_variables(env.parse(text))
            except jinja2.TemplateSyntaxError:
                continue
    return names


def _role_variables(role: Path) -> dict[str, str]:
    found: dict[str, str] = {}
    specs = _load(role / "meta" / "argument_specs.yml") or {}
    for entry in (specs.get("argument_specs") or {}).values():
        for name in (entry or {}).get("options") or {}:
            found[str(name)] = f"role {role.name} (argument spec)"
    defaults = _load(role / "defaults" / "main.yml")
    if isinstance(defaults, Mapping):
        for name in defaults:
            found.setdefault(str(name), f"role {role.name} (defaults)")
        for name in template_reads(defaults):
            found.setdefault(name, f"role {role.name} (read by its defaults)")
    return found


@functools.cache
def known(root: Path = REPO_ROOT) -> dict[str, str]:
    """name -> what reads it, for every variable an inventory may set."""
    found = {name: "clusterctl (cluster/spec.py)" for name in spec.NAMES}
    roles = root / "roles"  # in the checkout, beside the packages (provision runs its playbooks from there)
    for role in sorted(p for p in roles.iterdir() if p.is_dir()) if roles.is_dir() else []:
        for name, reader in _role_variables(role).items():
            found.setdefault(name, reader)
    playbooks = sorted((root / "playbooks").glob("*.yml")) + sorted((root / "playbooks" / "tasks").glob("*.yml"))
    for playbook in playbooks:
        for name in template_reads(_load(playbook)):
            found.setdefault(name, f"playbook {playbook.relative_to(root)}")
    found.update({name: "the simulator (virtual inventories)" for name in SIMULATOR})
    from cluster.ansible.own_variables import ansible_variables

    for name in ansible_variables():
        found.setdefault(name, "Ansible")
    for name in spec.RETIRED:
        found.pop(name, None)
    return found


def _site_listed(hostvars: Mapping[str, Any]) -> set[str]:
    listed = hostvars.get(SITE_LIST)
    return {str(n) for n in listed} if isinstance(listed, list) else set()


def where(value: Any, inventory: Path, host: str, name: str, hostvars: Mapping[str, Any]) -> str:
    """``FILE:LINE`` (relative to the inventory) of the file that sets ``name`` for ``host``: the origin
    Ansible recorded on the value, else the most specific vars file whose top level sets it."""
    from cluster.ansible import vault

    place = vault.origin(value)
    if place is None:
        place = _scanned_origin(inventory, host, list(hostvars.get("group_names") or []), name)
    if place is None:
        return str(inventory)
    base = inventory if inventory.is_dir() else inventory.parent
    path, _, line = place.partition(":")
    try:
        shown = Path(path).resolve().relative_to(base.resolve()).as_posix()
    except ValueError:
        shown = path
    return f"{shown}:{line}" if line else shown


def _vars_files(base: Path, kind: str, name: str) -> list[Path]:
    direct = [base / kind / f"{name}{suffix}" for suffix in ("", ".yml", ".yaml", ".json")]
    files = [p for p in direct if p.is_file()]
    if (base / kind / name).is_dir():
        files += sorted(p for p in (base / kind / name).rglob("*") if p.is_file() and not p.name.startswith("."))
    return files


def _scanned_origin(inventory: Path, host: str, groups: list[str], name: str) -> str | None:
    """For a value Ansible could not tag (a boolean, null): the host's own vars files first, then its
    groups', then ``all``'s."""
    base = inventory if inventory.is_dir() else inventory.parent
    candidates = _vars_files(base, "host_vars", host)
    for group in [*reversed(groups), "all"]:
        candidates += _vars_files(base, "group_vars", group)
    for path in candidates:
        if (line := _top_level_line(path, name)) is not None:
            return f"{path}:{line}"
    return None


def _top_level_line(path: Path, name: str) -> int | None:
    try:
        node = yaml.compose(path.read_text(), Loader=_KeysOnly)
    except (OSError, yaml.YAMLError):
        return None
    if isinstance(node, yaml.MappingNode):
        for key, _ in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == name:
                return key.start_mark.line + 1
    return None


def with_origin(problem: Problem, hosts: Mapping[str, Mapping[str, Any]], inventory: Path) -> Problem:
    """``problem`` with the ``FILE:LINE`` of the inventory that sets its variable (its ``origin``)."""
    import dataclasses
    import re

    hostvars = hosts.get(problem.host)
    name = re.split(r"[.\[]", problem.variable, maxsplit=1)[0]
    if problem.place_kind != "host" or hostvars is None or name not in hostvars:
        return problem
    place = where(hostvars[name], inventory, problem.host, name, hostvars)
    if place == str(inventory):
        return problem
    return dataclasses.replace(problem, origin=place)


def _grouped(found: dict[tuple[str, str], list[str]], message: Any) -> list[Problem]:
    return [Problem(place, name, None, message(name, hosts), place_kind="file")
            for (place, name), hosts in found.items()]


def unknown_variables(hosts: Mapping[str, Mapping[str, Any]], inventory: Path) -> list[Problem]:
    """One problem per (file, variable) that nothing reads, with its near miss; a retired variable with what
    to do instead. ``hosts``: host -> variables as the inventory loader resolved them."""
    names = known()
    found: dict[tuple[str, str], list[str]] = {}
    for host, hostvars in hosts.items():
        allowed = _site_listed(hostvars)
        for name, value in hostvars.items():
            name = str(name)
            if name in names or name.startswith(SITE_PREFIX) or name in allowed:
                continue
            found.setdefault((where(value, inventory, host, name, hostvars), name), []).append(host)

    def message(name: str, _hosts: list[str]) -> str:
        if name in spec.RETIRED:
            return spec.RETIRED[name]
        near = suggest(name, names)
        # the near miss is the likely fix; without one, how to keep a variable of the site's own
        return f"unknown variable{near}" if near else (
            f"unknown variable: nothing reads it (a site's own variable starts with {SITE_PREFIX!r} or is listed "
            f"in {SITE_LIST})")
    return _grouped(found, message)


def _placeholder_leaves(value: Any) -> bool:
    from cluster.ansible import vault

    if vault.is_encrypted(value):
        try:
            value = vault.decrypted(value)
        except Exception:  # noqa: BLE001 -- undecryptable: the vault check names it, not this one
            return False
    if isinstance(value, str):
        return value.lstrip().startswith(PLACEHOLDER)
    if isinstance(value, Mapping):
        return any(_placeholder_leaves(v) for v in value.values())
    if isinstance(value, list):
        return any(_placeholder_leaves(v) for v in value)
    return False


def sealed_values(hosts: Mapping[str, Mapping[str, Any]]) -> int:
    """How many distinct inline vault values the top-level variables of ``hosts`` hold (a group_vars value
    every host inherits counts once)."""
    from cluster.ansible import vault

    return len({vault.ciphertext(v) for hv in hosts.values() for v in hv.values() if vault.is_encrypted(v)})


def placeholders(hosts: Mapping[str, Mapping[str, Any]], inventory: Path) -> list[Problem]:
    """One problem per file naming its variables whose value, decrypted where the secrets in effect allow,
    is still a :data:`PLACEHOLDER` (the same names in several host_vars files then group into one line);
    the value is never shown."""
    found: dict[str, dict[str, None]] = {}
    for host, hostvars in hosts.items():
        for name, value in hostvars.items():
            if _placeholder_leaves(value):
                place = where(value, inventory, host, str(name), hostvars).partition(":")[0]
                found.setdefault(place, {})[str(name)] = None
    return [Problem(place, ", ".join(names), None,
                    f"{'still placeholders' if len(names) > 1 else 'still a placeholder'} ({PLACEHOLDER}: ...), "
                    "not real values: replace each (inventory/sample/README.md says how)", place_kind="file")
            for place, names in found.items()]
