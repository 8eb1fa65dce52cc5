"""Provisioning logic behind ``clusterctl provision``: batches, the plan, and the rollout's progress.

The CLI (``cli/provision.py``) is glue: it validates the inventory, builds a :class:`Plan`, runs the
playbook through ansible-runner and feeds every event to a :class:`Rollout`, which knows per host the
batch, current task and counts, and at the end which hosts were done and where the rollout stopped.

Batches follow Ansible's own ``serial`` rules (``PlaybookExecutor._get_serialized_batches`` with
``pct_to_int``): a percentage is of all hosts in the play, rounded down, at least 1; the last size
repeats until every host is placed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import validate, vault
from cluster.inventory import InventoryError, cluster_of, load_inventory

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
    loaded = load_inventory(inventory, limit, secrets)
    cluster_of(loaded)
    # The playbook reads every variable, the model only its own: a vault value that will not decrypt (no or
    # the wrong password) is an inventory error here, before any host, not a failed task in batch 1.
    if problems := vault.undecryptable(loaded.selected):
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


# ------------------------------------------------------------------------------------------ progress

@dataclass
class HostProgress:
    name: str
    batch: int | None
    status: str = "waiting"  # waiting | running | ok | failed | unreachable | stopped (batch cut short)
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0


@dataclass
class Rollout:
    """Per-host state built from ansible-runner events (``event``, ``event_data``)."""

    plan: Plan
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    batches_started: int = 0
    stats: dict[str, dict[str, int]] | None = None
    messages: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for host in self.plan.hosts:
            self.hosts[host] = HostProgress(host, self.plan.batch_of(host))

    def _host(self, name: str) -> HostProgress:
        if name not in self.hosts:
            self.hosts[name] = HostProgress(name, None)
        return self.hosts[name]

    def handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_play_start":
            self.batches_started += 1
        elif kind == "runner_on_start" and host:
            progress = self._host(host)
            progress.status = "running" if progress.status == "waiting" else progress.status
            progress.task = str(data.get("task", ""))
        elif kind in ("runner_on_ok", "runner_on_failed", "runner_on_skipped", "runner_on_unreachable") and host:
            self._result(self._host(host), kind, data)
        elif kind in ("verbose", "error") and "ERROR" in str(event.get("stdout", "")):
            # playbook-level errors (syntax, undefined variables in play keywords) come as plain output
            self.messages.append(str(event["stdout"]).strip()[:500])
        elif kind == "playbook_on_stats":
            self.stats = {
                key: dict(data.get(key) or {})
                for key in ("ok", "changed", "failures", "dark", "skipped", "rescued", "ignored")
            }
            self._finish()

    def _result(self, progress: HostProgress, kind: str, data: Mapping[str, Any]) -> None:
        result = data.get("res") or {}
        if kind == "runner_on_ok":
            progress.ok += 1
            progress.changed += 1 if result.get("changed") else 0
        elif kind == "runner_on_skipped":
            progress.skipped += 1
        elif kind == "runner_on_unreachable":
            progress.unreachable += 1
            progress.status = "unreachable"
            self.messages.append(f"{progress.name}: unreachable: {str(result.get('msg', ''))[:300]}")
        elif not data.get("ignore_errors"):
            progress.failed += 1
            progress.status = "failed"
            self.messages.append(f"{progress.name}: {data.get('task', '')}: {str(result.get('msg', ''))[:300]}")

    def _finish(self) -> None:
        stats = self.stats or {}
        for name, progress in self.hosts.items():
            seen = any(name in (stats.get(k) or {}) for k in ("ok", "failures", "dark", "skipped"))
            if (stats.get("dark") or {}).get(name):
                progress.status = "unreachable"
            elif (stats.get("failures") or {}).get(name):
                progress.status = "failed"
            elif seen:
                progress.status = "ok"
            progress.task = "" if progress.status == "ok" else progress.task
        failed_batch = self.failed_batch()
        if failed_batch is None:
            return
        # The failed batch was cut short at the failing task: its other hosts are not done.
        for progress in self.hosts.values():
            if progress.batch == failed_batch and progress.status == "ok":
                progress.status = "stopped"

    # -- the outcome -----------------------------------------------------------------------------

    def bad_hosts(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.status in ("failed", "unreachable")]

    def done_hosts(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.status == "ok"]

    def not_started(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.status == "waiting"]

    def failed_batch(self) -> int | None:
        batches = [self.hosts[h].batch for h in self.bad_hosts() if self.hosts[h].batch is not None]
        return min(batches) if batches else None

    def succeeded(self, runner_rc: int) -> bool:
        return runner_rc == 0 and self.stats is not None and not self.bad_hosts() and not self.not_started()

    def summary(self) -> str:
        total = len(self.plan.batches)
        if self.stats is None:
            return "ansible-playbook ended without a recap: nothing was provisioned (see the messages above)"
        if self.failed_batch() is None and not self.bad_hosts():
            return f"rollout complete: {len(self.done_hosts())} host(s) in {total} batch(es)"
        batch = self.failed_batch()
        where = f"batch {batch + 1}/{total}" if batch is not None else "the run"
        return (
            f"rollout stopped in {where}: failed/unreachable: {', '.join(self.bad_hosts()) or '-'}; "
            f"done: {', '.join(self.done_hosts()) or '-'}; "
            f"cut short: {', '.join(h for h, p in self.hosts.items() if p.status == 'stopped') or '-'}; "
            f"not started: {', '.join(self.not_started()) or '-'}"
        )
