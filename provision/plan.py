"""The plan of a ``clusterctl provision`` run: batches, the playbook's roles and tags, the validated inventory.

Batches follow Ansible's own ``serial`` rules (``PlaybookExecutor._get_serialized_batches`` with
``pct_to_int``): a percentage is of all hosts in the play, rounded down, at least 1; the last size
repeats until every host is placed. :func:`make_plan` validates the inventory, the tags and the vault
values before any host is contacted (an :class:`InventoryError`, exit 2).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cluster import validate, vault
from cluster.inventory import InventoryError, cluster_of, load_inventory
from cluster.text import suggest

DEFAULT_BATCHES: tuple[int | str, ...] = (1, "10%", "50%", "100%")
REPO_ROOT = Path(__file__).resolve().parents[1]
PLAYBOOK_DIR = REPO_ROOT / "playbooks"
_BATCH = re.compile(r"^(?:(\d+)|(\d{1,3})%)$")


class BatchError(InventoryError):
    """A bad --batches value (usage error, exit 2)."""


def parse_batches(text: str) -> list[int | str]:
    """``"1,10%,100%"`` -> ``[1, "10%", "100%"]``: positive counts or percentages 1-100%."""
    sizes: list[int | str] = []
    for raw in text.split(","):
        item = raw.strip()
        match = _BATCH.match(item)
        if not match:
            raise BatchError(f"--batches: {item!r} is not a host count or a percentage (e.g. 1,10%,100%)")
        if match.group(1) is not None:
            count = int(match.group(1))
            if count < 1:
                raise BatchError(f"--batches: {item!r}: a batch needs at least one host")
            sizes.append(count)
        else:
            pct = int(match.group(2))
            if not 1 <= pct <= 100:
                raise BatchError(f"--batches: {item!r}: a percentage must be 1%..100%")
            sizes.append(f"{pct}%")
    return sizes


def batch_size(size: int | str, total: int) -> int:
    """Ansible's ``pct_to_int``: percentages round down but never below one host."""
    if isinstance(size, str) and size.endswith("%"):
        return int(int(size[:-1]) / 100.0 * total) or 1
    return int(size)


def split_batches(hosts: Sequence[str], sizes: Sequence[int | str]) -> list[list[str]]:
    """The batches Ansible will run for ``hosts`` (in play order) with ``serial: sizes``."""
    remaining = list(hosts)
    total = len(remaining)
    batches: list[list[str]] = []
    index = 0
    while remaining:
        count = batch_size(sizes[index], total)
        batches.append(remaining[:count])
        remaining = remaining[count:]
        index = min(index + 1, len(sizes) - 1)
    return batches


@dataclass(frozen=True)
class RoleStep:
    role: str
    tags: tuple[str, ...]


def playbook_roles(playbook: Path) -> list[RoleStep]:
    """Roles of a playbook's plays in order (import_playbook followed), with their tags."""
    steps: list[RoleStep] = []
    for play in yaml.safe_load(playbook.read_text()) or []:
        if "import_playbook" in play:
            steps += playbook_roles(playbook.parent / play["import_playbook"])
            continue
        for entry in play.get("roles", []):
            name = entry if isinstance(entry, str) else entry.get("role") or entry.get("name")
            tags = () if isinstance(entry, str) else tuple(entry.get("tags", ()))
            steps.append(RoleStep(str(name), tags))
    return steps


# Tags Ansible itself gives meaning to; valid in --tags whatever the playbook declares.
SPECIAL_TAGS = ("all", "always", "never", "tagged", "untagged")


def _tags_in(node: Any) -> set[str]:
    """Every value of a ``tags:`` key anywhere in a parsed playbook/tasks document."""
    found: set[str] = set()
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key == "tags":
                found |= {str(t) for t in (value if isinstance(value, list) else [value])}
            else:
                found |= _tags_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _tags_in(item)
    return found


def known_tags(playbook: Path) -> list[str]:
    """The tags ``--tags`` can select in ``playbook``: role names and every tag its plays, roles and
    tasks declare (imported playbooks and the roles' task files included)."""
    found = set(SPECIAL_TAGS)
    for step in playbook_roles(playbook):
        found |= {step.role, *step.tags}
        for tasks in (PLAYBOOK_DIR.parent / "roles" / step.role / "tasks").glob("*.yml"):
            found |= _tags_in(yaml.safe_load(tasks.read_text()))
    seen: set[Path] = set()
    pending = [playbook]
    while pending:
        path = pending.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        document = yaml.safe_load(path.read_text()) or []
        found |= _tags_in(document)
        pending += [path.parent / p["import_playbook"] for p in document if isinstance(p, dict) and "import_playbook" in p]
    return sorted(found)


def check_tags(playbook: Path, tags: Sequence[str]) -> None:
    """An unknown tag is a usage error listing the known ones: Ansible would run only the ``always``
    tasks and report success."""
    known = known_tags(playbook)
    for tag in tags:
        if tag not in known:
            listed = ", ".join(t for t in known if t not in SPECIAL_TAGS)
            if not listed:
                raise InventoryError(f"--tags: unknown tag {tag!r}: {playbook.name} declares no tags "
                                     "(run it without --tags)")
            raise InventoryError(f"--tags: unknown tag {tag!r}{suggest(tag, known)} (known: {listed})")


def selected_roles(steps: Sequence[RoleStep], tags: Sequence[str]) -> list[RoleStep]:
    if not tags:
        return list(steps)
    wanted = set(tags)
    return [s for s in steps if wanted & set(s.tags) or s.role in wanted]


def resolve_playbook(name: str) -> Path:
    path = Path(name)
    if path.exists():
        return path.resolve()
    candidate = PLAYBOOK_DIR / name
    if candidate.exists():
        return candidate
    raise InventoryError(f"playbook {name!r} not found (looked in . and {PLAYBOOK_DIR})")


@dataclass(frozen=True)
class Plan:
    inventory: Path
    playbook: Path
    hosts: tuple[str, ...]
    batches: tuple[tuple[str, ...], ...]
    batch_sizes: tuple[int | str, ...]
    roles: tuple[RoleStep, ...]
    limit: str | None = None
    tags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # Consul security settings the inventory weakens (validate.security_warnings)

    def batch_of(self, host: str) -> int | None:
        for index, batch in enumerate(self.batches):
            if host in batch:
                return index
        return None

    def to_json(self) -> dict[str, Any]:
        return {
            "inventory": str(self.inventory),
            "playbook": str(self.playbook),
            "limit": self.limit,
            "tags": list(self.tags),
            "roles": [s.role for s in self.roles],
            "batch_sizes": list(self.batch_sizes),
            "batches": [list(b) for b in self.batches],
        }


def make_plan(
    inventory: str | Path,
    playbook: str = "site.yml",
    limit: str | None = None,
    tags: Sequence[str] = (),
    batch_sizes: Sequence[int | str] = DEFAULT_BATCHES,
    serial_one: bool = False,
    vault_secrets: vault.VaultSecrets | None = None,
) -> Plan:
    """Validate the inventory (InventoryError, exit 2, before any host is contacted) and plan the run.

    ``vault_secrets`` (from ``--vault-password-file``) decrypt vault-encrypted vars files and values;
    None: the ones Ansible's configuration names (ANSIBLE_VAULT_PASSWORD_FILE...), read once here.
    """
    secrets = vault.configured_vault_secrets() if vault_secrets is None else vault_secrets
    check_tags(resolve_playbook(playbook), tags)  # a typo costs nothing: before the inventory is read
    loaded = load_inventory(inventory, limit, secrets, check_vault=True)
    cluster_of(loaded)
    # The playbook reads every variable, the model only its own: a vault value that will not decrypt (no or
    # the wrong password) is an inventory error here, before any host, not a failed task in batch 1.
    if problems := loaded.undecryptable:
        raise InventoryError(f"{inventory}: " + "\n".join(problems))
    # Play order is inventory order (the model sorts by rack): take it from Ansible's own host list.
    hosts = tuple(loaded.selected)
    path = resolve_playbook(playbook)
    sizes = (1,) if serial_one else tuple(batch_sizes)
    return Plan(
        inventory=Path(inventory).resolve(),
        playbook=path,
        hosts=hosts,
        batches=tuple(tuple(b) for b in split_batches(hosts, sizes)),
        batch_sizes=sizes,
        roles=tuple(selected_roles(playbook_roles(path), tags)),
        limit=limit,
        tags=tuple(tags),
        warnings=tuple(validate.security_warnings(loaded.selected)),
    )
