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

from cluster import servers, validate
from cluster.ansible import vault
from cluster.ansible.inventory import InventoryError, cluster_of, load_inventory
from cluster.validate import problem_lines as format_problems
from common.text import suggest

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


def playbook_plays(playbook: Path) -> list[dict[str, Any]]:
    """The plays of a playbook in the order Ansible runs them (``import_playbook`` followed)."""
    plays: list[dict[str, Any]] = []
    for play in yaml.safe_load(playbook.read_text()) or []:
        if imported := _imported(play):
            plays += playbook_plays(playbook.parent / imported)
        else:
            plays.append(play)
    return plays


def _imported(entry: Any) -> str | None:
    """The file an ``import_playbook`` entry (short or FQCN) names, else None."""
    if not isinstance(entry, Mapping):
        return None
    name = entry.get("import_playbook") or entry.get("ansible.builtin.import_playbook")
    return str(name) if name else None


def play_roles(play: Mapping[str, Any]) -> list[RoleStep]:
    steps: list[RoleStep] = []
    for entry in play.get("roles", []):
        name = entry if isinstance(entry, str) else entry.get("role") or entry.get("name")
        tags = () if isinstance(entry, str) else tuple(entry.get("tags", ()))
        steps.append(RoleStep(str(name), tags))
    return steps


def playbook_roles(playbook: Path) -> list[RoleStep]:
    """Roles of a playbook's plays in order (import_playbook followed), with their tags."""
    return [step for play in playbook_plays(playbook) for step in play_roles(play)]


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
        pending += [path.parent / imported for p in document if (imported := _imported(p))]
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
    known = sorted(p.name for p in PLAYBOOK_DIR.glob("*.yml"))
    raise InventoryError(f"playbook {name!r} not found (looked in . and {PLAYBOOK_DIR}){suggest(name, known)} "
                         f"(playbooks: {', '.join(known)})")


# A play's hosts the plan can follow: names (``all``, a group, a host) joined by ``:``, each one optionally
# ``!`` (leave out) or ``&`` (only those also in); Ansible's globs and regular expressions are not
# re-implemented here.
_SIMPLE_PATTERN = re.compile(r"^[!&]?[A-Za-z0-9_.-]+$")


def _matching(name: str, everyone: Sequence[str], groups: Mapping[str, Sequence[str]]) -> list[str]:
    """One name's hosts in their order (``all``: inventory order; a group: the group's; a host: itself)."""
    return list(everyone) if name == "all" else list(groups.get(name) or ([name] if name in everyone else []))


def play_hosts(pattern: Any, everyone: Sequence[str], groups: Mapping[str, Sequence[str]],
               selected: Sequence[str], where: str) -> list[str]:
    """The hosts a play with ``hosts: pattern`` runs on, in its order, filtered by the ``--limit`` selection,
    as Ansible's ``InventoryManager.get_hosts`` forms them: the plain names first (their hosts in order, each
    once), then every ``&`` name keeps only its hosts, then every ``!`` name takes its hosts out
    (``order_patterns``, ``_evaluate_patterns``). A group the inventory lacks matches nothing."""
    text = str(pattern or "").strip()
    terms = [t.strip() for t in text.split(":")] if text else []
    if not terms or not all(_SIMPLE_PATTERN.match(t) for t in terms):
        raise InventoryError(f"{where}: hosts {text!r}: the plan follows hosts, groups and all joined by ':' "
                             "(each optionally '!' or '&'), not this pattern")
    plain = [t for t in terms if t[0] not in "!&"] or ["all"]  # only exclusions: Ansible starts from all
    hosts: list[str] = []
    for term in plain:
        hosts += [h for h in _matching(term, everyone, groups) if h not in hosts]
    for term in (t for t in terms if t[0] == "&"):
        hosts = [h for h in hosts if h in set(_matching(term[1:], everyone, groups))]
    for term in (t for t in terms if t[0] == "!"):
        hosts = [h for h in hosts if h not in set(_matching(term[1:], everyone, groups))]
    chosen = set(selected)
    return [host for host in hosts if host in chosen]


def play_serial(serial: Any, sizes: Sequence[int | str], where: str) -> list[int | str]:
    """A play's batch sizes: none = every host at once; the batched playbooks' template = the run's
    ``sizes`` (``clusterctl_batches``); a literal count, percentage or list of them as written."""
    if serial is None:
        return ["100%"]
    if isinstance(serial, str) and "clusterctl_batches" in serial:
        return list(sizes)
    values = serial if isinstance(serial, list) else [serial]
    if values and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 or isinstance(v, str) and _BATCH.match(v)
                      for v in values):
        return [v if isinstance(v, int) or v.endswith("%") else int(v) for v in values]
    raise InventoryError(f"{where}: serial {serial!r}: the plan cannot tell the batches this gives")


@dataclass(frozen=True)
class PlayPlan:
    """One play as Ansible will run it: its name, roles, and its batches (indexes into ``Plan.batches``;
    none when it matches no host, which Ansible still announces with a play start)."""

    name: str
    roles: tuple[RoleStep, ...]
    batches: tuple[int, ...]
    sizes: tuple[int | str, ...] = ()  # its serial, as the plan read it (play_serial)


@dataclass(frozen=True)
class Plan:
    inventory: Path
    playbook: Path
    hosts: tuple[str, ...]
    batches: tuple[tuple[str, ...], ...]  # every play's batches, in the order they run
    batch_sizes: tuple[int | str, ...]
    roles: tuple[RoleStep, ...]
    limit: str | None = None
    tags: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()  # Consul security settings the inventory weakens (validate.security_warnings)
    plays: tuple[PlayPlan, ...] = ()
    consul_servers: tuple[servers.ConsulServer, ...] = ()  # the inventory's, as the model lists them

    def batch_of(self, host: str) -> int | None:
        """The first batch ``host`` runs in."""
        for index, batch in enumerate(self.batches):
            if host in batch:
                return index
        return None

    def batches_of(self, host: str) -> list[int]:
        return [index for index, batch in enumerate(self.batches) if host in batch]

    def play_of(self, batch: int) -> PlayPlan | None:
        return next((play for play in self.plays if batch in play.batches), None)

    def play_starts(self) -> list[int | None]:
        """What each ``playbook_on_play_start`` event Ansible sends begins: a batch (its index), or None for a
        play that matches no host (Ansible announces it, then reports no hosts matched). A plan without its
        plays (built by hand) is one play: every start begins the next batch."""
        if not self.plays:
            return list(range(len(self.batches)))
        starts: list[int | None] = []
        for play in self.plays:
            starts += list(play.batches) or [None]
        return starts

    def to_json(self) -> dict[str, Any]:
        return {
            "inventory": str(self.inventory),
            "playbook": str(self.playbook),
            "limit": self.limit,
            "tags": list(self.tags),
            "roles": [s.role for s in self.roles],
            "batch_sizes": list(self.batch_sizes),
            "batches": [list(b) for b in self.batches],
            "plays": [{"name": p.name, "roles": [s.role for s in p.roles], "batches": list(p.batches)}
                      for p in self.plays],
            "consul_servers": [s.to_json() for s in self.consul_servers],
        }


def make_plan(
    inventory: str | Path,
    playbook: str = "site.yml",
    limit: str | None = None,
    tags: Sequence[str] = (),
    batch_sizes: Sequence[int | str] = DEFAULT_BATCHES,
    vault_secrets: vault.VaultSecrets | None = None,
) -> Plan:
    """Validate the inventory (InventoryError, exit 2, before any host is contacted) and plan the run:
    each play's hosts and batches as Ansible will form them (:func:`play_hosts`, :func:`play_serial`).

    ``vault_secrets`` (from ``--vault-password-file``) decrypt vault-encrypted vars files and values;
    None: the ones Ansible's configuration names (ANSIBLE_VAULT_PASSWORD_FILE...), read once here.
    """
    secrets = vault.configured_vault_secrets() if vault_secrets is None else vault_secrets
    check_tags(resolve_playbook(playbook), tags)  # a typo costs nothing: before the inventory is read
    loaded = load_inventory(inventory, limit, secrets, check_vault=True)
    cluster = cluster_of(loaded)
    # The playbook reads every variable, the model only its own: a vault value that will not decrypt (no or
    # the wrong password) is an inventory error here, before any host, not a failed task in batch 1.
    if problems := loaded.undecryptable:
        raise InventoryError(f"{inventory}: " + "\n".join(problems))
    if loaded.placeholders:  # decrypted now: a copied sample's REPLACE-ME would reach the nodes as secrets
        raise InventoryError(f"{inventory}: " + "\n".join(format_problems(loaded.placeholders)), loaded.placeholders)
    path = resolve_playbook(playbook)
    everyone = list(loaded.everyone)
    batches: list[list[str]] = []
    plays: list[PlayPlan] = []
    for number, play in enumerate(playbook_plays(path), 1):
        where = f"{path.name}: play {number} ({play.get('name', 'unnamed')})"
        hosts = play_hosts(play.get("hosts"), everyone, loaded.groups, list(loaded.selected), where)
        first, sizes = len(batches), play_serial(play.get("serial"), batch_sizes, where)
        batches += split_batches(hosts, sizes)
        plays.append(PlayPlan(str(play.get("name", f"play {number}")), tuple(selected_roles(play_roles(play), tags)),
                              tuple(range(first, len(batches))), tuple(sizes)))
    return Plan(
        inventory=Path(inventory).resolve(),
        playbook=path,
        # the hosts some play runs on: a playbook of one group (edges.yml) leaves the others out of the run
        hosts=tuple(h for h in everyone if h in loaded.selected and any(h in b for b in batches)),
        batches=tuple(tuple(b) for b in batches),
        batch_sizes=tuple(batch_sizes),
        roles=tuple(step for play in plays for step in play.roles),
        limit=limit,
        tags=tuple(tags),
        warnings=tuple(validate.security_warnings(loaded.selected)),
        plays=tuple(plays),
        consul_servers=cluster.consul_servers,
    )
