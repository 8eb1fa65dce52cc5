"""Provisioning logic behind ``clusterctl provision``: batches, the plan, and the rollout's progress.

The CLI (``cli/provision.py``) is glue: it validates the inventory, builds a :class:`Plan`, runs the
playbook through ansible-runner and feeds every event to a :class:`Rollout`, which knows per host the
batch, current task and counts, and at the end which hosts were done and where the rollout stopped.

Batches follow Ansible's own ``serial`` rules (``PlaybookExecutor._get_serialized_batches`` with
``pct_to_int``): a percentage is of all hosts in the play, rounded down, at least 1; the last size
repeats until every host is placed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cluster import validate, vault
from cluster.inventory import InventoryError, cluster_of, load_inventory
from cluster.text import plural, suggest

DEFAULT_BATCHES: tuple[int | str, ...] = (1, "10%", "50%", "100%")
# Task names of playbooks/tasks/reboot.yml that the recap reads.
REBOOT_PENDING_TASK = "Reboot pending"
REBOOT_TASK = "Reboot the host"
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


def failure_reason(result: dict, limit: int = 300) -> str:
    """Why a task failed, never empty: its ``msg``; else exit status and stderr/stdout (a command module);
    else, for a ``no_log`` task (Ansible keeps only ``censored``), that the reason is hidden and why."""
    text = str(result.get("msg") or "")
    if not text and result.get("rc") not in (None, 0):
        detail = str(result.get("stderr") or result.get("stdout") or "").strip()
        text = f"exit {result['rc']}" + (f": {detail}" if detail else "")
    if not text and "censored" in result:
        text = ("the reason is hidden (no_log: the task handles secrets); run the task's module by hand on the "
                "host, or check its files and the journal")
    if not text:
        keys = ", ".join(sorted(k for k in result if not k.startswith("_"))) or "none"
        text = f"Ansible returned no message (result keys: {keys})"
    return " ".join(text.split())[:limit]


def unreachable_reason(msg: str, limit: int = 300) -> str:
    """An unreachable host's message, short: ssh's reason is its last line (a changed host key comes
    after a 9-line banner that alone would fill the limit), so a long message keeps its first and last."""
    lines = [line.strip() for line in msg.splitlines() if line.strip() and not set(line.strip()) <= {"@"}]
    if len(msg) <= limit or len(lines) < 2:
        return msg[:limit]
    return f"{lines[0].rstrip('@ ')[:limit // 2]} ... {lines[-1][:limit // 2]}"


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

# A diff line whose key names a secret shows the key, never the value (no_log tasks send no diff at
# all; this covers a secret in a file written without no_log).
_SECRET_LINE = re.compile(
    r"(?i)^(?P<head>[-+ ]?\s*[\"']?[\w.-]*(?:password|passwd|token|secret|gossip_key|encrypt|api_key|private_key)"
    r"[\w.-]*[\"']?\s*[:=]\s*)(?P<value>\S.*)$"
)
MASK = "********"


def mask_secrets(text: str) -> str:
    return "\n".join(
        m.group("head") + MASK if (m := _SECRET_LINE.match(line)) else line for line in text.splitlines()
    )


def _diff_text(entry: Mapping[str, Any]) -> str:
    """One of Ansible's diff dicts (before/after with headers, or ``prepared`` text) as a unified diff."""
    import difflib

    if entry.get("prepared"):
        return mask_secrets(str(entry["prepared"]).rstrip("\n"))
    before, after = entry.get("before"), entry.get("after")
    if not isinstance(before, str) or not isinstance(after, str) or before == after:
        return ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True),
        fromfile=f"before: {entry.get('before_header', '')}", tofile=f"after: {entry.get('after_header', '')}",
    )
    return mask_secrets("".join(lines).rstrip("\n"))


def result_diffs(result: Mapping[str, Any]) -> list[str]:
    """The diffs a task result carries (its own ``diff`` and its loop items'), rendered."""
    entries: list[Any] = []
    for res in [result, *(r for r in result.get("results") or [] if isinstance(r, Mapping))]:
        diff = res.get("diff")
        entries += diff if isinstance(diff, list) else [diff] if isinstance(diff, Mapping) else []
    return [text for entry in entries if isinstance(entry, Mapping) and (text := _diff_text(entry))]


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

    @property
    def label(self) -> str:
        """The status as a person reads it: a host that never started is "not started", not "waiting"."""
        return "not started" if self.status == "waiting" else self.status


@dataclass
class Diff:
    host: str
    task: str
    text: str


@dataclass
class Rollout:
    """Per-host state built from ansible-runner events (``event``, ``event_data``).

    A host's status changes as it happens: running at its first task, failed/unreachable at the failing
    result, ok when the next batch starts (Ansible moves on only once every host of a batch is done) or at
    the recap. ``notices`` gets one line per such change (batch started/finished, host failed, host done):
    the plain, line-per-event output for logs; ``diffs`` the changes a ``--diff`` run reported.
    """

    plan: Plan
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    batches_started: int = 0
    stats: dict[str, dict[str, int]] | None = None
    messages: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    diffs: list[Diff] = field(default_factory=list)
    started: float = 0.0
    batch_started: float = 0.0
    batch_seconds: list[float] = field(default_factory=list)
    clock: Any = None  # a time.monotonic-like callable (tests pass a fake one)
    # host -> why it needs a reboot (playbooks/tasks/reboot.yml's "Reboot pending" task), and the hosts
    # that playbook rebooted (--allow-reboot).
    reboot_pending: dict[str, str] = field(default_factory=dict)
    rebooted: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        import time

        self.clock = self.clock or time.monotonic
        self.started = self.batch_started = self.clock()
        for host in self.plan.hosts:
            self.hosts[host] = HostProgress(host, self.plan.batch_of(host))

    def _host(self, name: str) -> HostProgress:
        if name not in self.hosts:
            self.hosts[name] = HostProgress(name, None)
        return self.hosts[name]

    def elapsed(self) -> float:
        return self.clock() - self.started

    def batch_elapsed(self) -> float:
        return self.clock() - self.batch_started

    def handle(self, event: Mapping[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        host = data.get("host")
        if kind == "playbook_on_play_start":
            if self.batches_started:
                self._batch_done()
            self.batches_started += 1
            self.batch_started = self.clock()
            members = [h for h, p in self.hosts.items() if p.batch == self.batches_started - 1]
            self.notices.append(
                f"batch {self.batches_started}/{len(self.plan.batches)} started: {plural(len(members), 'host')}"
                f" ({', '.join(members[:8])}{', ...' if len(members) > 8 else ''})"
            )
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
            if self.batches_started:
                self._batch_done()
            self._finish()

    def _batch_done(self) -> None:
        """The current batch ended: its hosts still running are done (Ansible starts the next batch, or
        the recap, only after every host of this one finished)."""
        index = self.batches_started - 1
        self.batch_seconds.append(self.batch_elapsed())
        members = [p for p in self.hosts.values() if p.batch == index]
        for progress in members:
            if progress.status == "running":
                progress.status, progress.task = "ok", ""
                self.notices.append(f"{progress.name}: done")
        bad = [p.name for p in members if p.status in ("failed", "unreachable")]
        self.notices.append(
            f"batch {index + 1}/{len(self.plan.batches)} finished in {self.batch_seconds[-1]:.1f}s: "
            f"{sum(1 for p in members if p.status == 'ok')} ok"
            + (f", failed/unreachable: {', '.join(bad)}" if bad else "")
        )

    def _result(self, progress: HostProgress, kind: str, data: Mapping[str, Any]) -> None:
        result = data.get("res") or {}
        if kind == "runner_on_ok":
            progress.ok += 1
            progress.changed += 1 if result.get("changed") else 0
            for text in result_diffs(result) if isinstance(result, Mapping) else []:
                self.diffs.append(Diff(progress.name, str(data.get("task", "")), text))
            if str(data.get("task", "")) == REBOOT_PENDING_TASK:
                self.reboot_pending[progress.name] = str(result.get("msg", "")).removeprefix("reboot pending: ")[:500]
            elif str(data.get("task", "")) == REBOOT_TASK and result.get("changed"):
                self.rebooted.append(progress.name)
        elif kind == "runner_on_skipped":
            progress.skipped += 1
        elif kind == "runner_on_unreachable":
            progress.unreachable += 1
            progress.status = "unreachable"
            message = f"{progress.name}: unreachable: {unreachable_reason(str(result.get('msg', '')))}"
            self.messages.append(message)
            self.notices.append(message)
        elif not data.get("ignore_errors"):
            progress.failed += 1
            progress.status = "failed"
            message = f"{progress.name}: FAILED {data.get('task', '')}: {failure_reason(result)}"
            self.messages.append(message.replace(" FAILED ", " ", 1))
            self.notices.append(message)

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

    def reboot_line(self) -> str | None:
        """One recap line naming the hosts that wait for a reboot (and why), or None."""
        if not self.reboot_pending:
            return None
        hosts = "; ".join(f"{host} ({why})" for host, why in sorted(self.reboot_pending.items()))
        return f"reboot pending on {len(self.reboot_pending)} host(s) (rerun with --allow-reboot): {hosts}"


    def changes(self) -> dict[str, int]:
        """host -> tasks that changed (or, in check mode, would change) something, from the recap."""
        return {h: n for h, n in ((self.stats or {}).get("changed") or {}).items() if n}

    def summary(self, check: bool = False) -> str:
        total = len(self.plan.batches)
        if self.stats is None:
            return "ansible-playbook ended without a recap: nothing was provisioned (see the messages above)"
        if self.failed_batch() is None and not self.bad_hosts():
            if check:
                changes = self.changes()
                would = (f"{plural(sum(changes.values()), 'change')} would be made on "
                         f"{plural(len(changes), 'host')}" + (f" ({', '.join(changes)})" if changes else ""))
                return f"check mode: nothing was changed; {would}"
            return f"rollout complete: {plural(len(self.done_hosts()), 'host')} in {plural(total, 'batch', 'batches')}"
        batch = self.failed_batch()
        where = f"batch {batch + 1}/{total}" if batch is not None else "the run"
        parts = [("failed/unreachable", self.bad_hosts()), ("done", self.done_hosts()),
                 ("cut short", [h for h, p in self.hosts.items() if p.status == "stopped"]),
                 ("not started", self.not_started())]
        prefix = "check mode (nothing was changed): " if check else ""
        return f"{prefix}rollout stopped in {where}: " + "; ".join(
            f"{label}: {', '.join(names)}" for label, names in parts if names
        )


# -- run files --------------------------------------------------------------------------------------
# events.jsonl and the runner's artifacts carry task results (a rendered env file, a diff): private to the
# operator, as ansible-runner keeps its own event files (review L4).
def prepare_run_dir(run_dir: Path) -> Path:
    """``run_dir`` and ``run_dir/runner``, created (or tightened) 0700; returns the resolved path."""
    run_dir = Path(run_dir).resolve()
    for directory in (run_dir, run_dir / "runner"):
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)
    return run_dir


class EventLog:
    """Appends events to ``<run dir>/events.jsonl`` (0600). A failed write (ENOSPC) never stops the run
    or the rollout's bookkeeping: it is remembered in ``error`` for the recap, and later writes are skipped."""

    def __init__(self, path: Path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # an existing file from an earlier run is tightened too
        self.file = os.fdopen(fd, "a")
        self.path = path
        self.error: str | None = None

    def write(self, event: Mapping[str, Any]) -> None:
        if self.error is not None:
            return
        try:
            self.file.write(json.dumps(event, default=str) + "\n")
            self.file.flush()
        except OSError as exc:
            self.error = f"{self.path}: {exc.strerror or exc}; later events were not recorded"

    def close(self) -> None:
        try:
            self.file.close()
        except OSError as exc:
            self.error = self.error or f"{self.path}: {exc.strerror or exc}"

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
