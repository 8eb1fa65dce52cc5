"""The progress of a provisioning run, built from ansible-runner events: per host, per batch, the recap.

:class:`Rollout` knows per host the batch, current task and counts, and at the end which hosts were
done, where the rollout stopped, which hosts wait for a reboot, and the file diffs (secrets masked).
It only reads events; :mod:`provision.run` feeds it, and the CLI draws it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common.text import plural
from provision.plan import Plan

# Task names of playbooks/tasks/reboot.yml (and consul-servers-reboot.yml's reboot) that the recap reads.
REBOOT_PENDING_TASK = "Reboot pending"
REBOOT_TASK = "Reboot the host"
# roles/inference_unit's report of running IUs whose configuration changed (inference_unit_restart_on_change off)
RESTART_PENDING_TASK = "Restart pending"


def failure_reason(result: dict, limit: int = 300) -> str:
    """Why a task failed, never empty: its ``msg``; else exit status and stderr/stdout (a command module);
    else, for a ``no_log`` task (Ansible keeps only ``censored``), that the reason is hidden and why. A loop
    task's msg is only "One or more items failed": its first failed item is named, with that item's reason."""
    failed_items = [r for r in result.get("results") or [] if isinstance(r, dict) and r.get("failed")]
    if failed_items:
        first = failed_items[0]
        label = first.get("_ansible_item_label", first.get("item"))
        more = f" (and {plural(len(failed_items) - 1, 'more item')})" if len(failed_items) > 1 else ""
        return " ".join(f"item {label}: {failure_reason(first, limit)}{more}".split())[:limit]
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
    if isinstance(before, Mapping) and isinstance(after, Mapping):  # file/user modules: attributes (mode, owner)
        lines = []
        for key in sorted(set(before) | set(after), key=str):
            if before.get(key) != after.get(key):
                lines += [f"-{key}: {before[key]}"] if key in before else []
                lines += [f"+{key}: {after[key]}"] if key in after else []
        return mask_secrets("\n".join(lines))
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
    # waiting | running | ok | partial (done with one batch, a later one to come) | failed | unreachable |
    # stopped (batch cut short)
    status: str = "waiting"
    task: str = ""
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: int = 0

    @property
    def label(self) -> str:
        """The status as a person reads it: a host that never started is "not started", not "waiting"."""
        return {"waiting": "not started", "partial": "partly done"}.get(self.status, self.status)


@dataclass
class Diff:
    host: str
    task: str
    text: str
    # A change that carries no diff, and why: Ansible hid the result (no_log), or the module sends none
    # (a service restart, a command); listed so that the diffs shown account for every change counted.
    hidden: str = ""


NO_LOG_DIFF = "diff hidden: no_log"
NO_DIFF = "no diff reported"


@dataclass
class Rollout:
    """Per-host state built from ansible-runner events (``event``, ``event_data``).

    A host's status changes as it happens: running at its first task, failed/unreachable at the failing
    result, ok when the next batch starts (Ansible moves on only once every host of a batch is done) or at
    the recap. ``notices`` gets one line per such change (batch started/finished, host failed, host done):
    the plain, line-per-event output for logs; ``diffs`` the changes a ``--diff`` run reported, a changed
task without a diff included (with why it has none).
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
    restart_pending: dict[str, str] = field(default_factory=dict)  # host -> its IUs that keep an old configuration
    _play_starts: int = 0  # play start events seen (plan.play_starts() says what each begins)
    _current: int | None = None  # the batch running now

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
            self._end_batch()
            starts = self.plan.play_starts()
            index = starts[self._play_starts] if self._play_starts < len(starts) else None
            self._play_starts += 1
            if index is not None:  # None: a play that matches no host (Ansible says so next)
                self._start_batch(index)
        elif kind == "runner_on_start" and host:
            progress = self._host(host)
            progress.status = "running" if progress.status in ("waiting", "partial") else progress.status
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
            self._end_batch()
            self._finish()

    def _start_batch(self, index: int) -> None:
        self.batches_started = index + 1
        self._current = index
        self.batch_started = self.clock()
        members = self.plan.batches[index] if index < len(self.plan.batches) else ()
        for name in members:
            self._host(name).batch = index
        play = self.plan.play_of(index)
        first_of_play = play is not None and play.batches[0] == index and len(self.plan.plays) > 1
        self.notices.append(
            f"batch {index + 1}/{len(self.plan.batches)} started: {plural(len(members), 'host')}"
            f" ({', '.join(members[:8])}{', ...' if len(members) > 8 else ''})"
            + (f", play {play.name!r}" if first_of_play and play else "")
        )

    def _end_batch(self) -> None:
        """The current batch ended: its hosts still running are done (Ansible starts the next batch, or
        the recap, only after every host of this one finished); a host that has a later batch (a Consul
        server: its own play first, then its batch of the main play) is partly done until that one ends."""
        index = self._current
        if index is None:
            return
        self._current = None
        self.batch_seconds.append(self.batch_elapsed())
        members = [p for p in self.hosts.values() if p.batch == index]
        for progress in members:
            later = self._provisioned_later(progress.name, index)
            if progress.status == "running" or progress.status == "partial" and not later:
                # (partial and no later batch: its last batch ran no task for it, e.g. every one skipped)
                progress.status, progress.task = ("partial" if later else "ok"), ""
                self.notices.append(f"{progress.name}: {'partly done' if later else 'done'}")
        bad = [p.name for p in members if p.status in ("failed", "unreachable")]
        self.notices.append(
            f"batch {index + 1}/{len(self.plan.batches)} finished in {self.batch_seconds[-1]:.1f}s: "
            f"{sum(1 for p in members if p.status == 'ok')} ok"
            + (f", {partly} partly done" if (partly := sum(1 for p in members if p.status == "partial")) else "")
            + (f", failed/unreachable: {', '.join(bad)}" if bad else "")
        )

    def _provisioned_later(self, host: str, index: int) -> bool:
        """Whether a batch after ``index`` runs roles on ``host`` (a Consul server's batch of the main play,
        after its servers-together play); the servers' reboot play runs none: a reboot it did not get is
        in the recap's reboot-pending line, not a host left half provisioned."""
        return any(play is None or play.roles for b in self.plan.batches_of(host) if b > index
                   for play in [self.plan.play_of(b)])

    def _result(self, progress: HostProgress, kind: str, data: Mapping[str, Any]) -> None:
        result = data.get("res") or {}
        if kind == "runner_on_ok":
            progress.ok += 1
            progress.changed += 1 if result.get("changed") else 0
            texts = result_diffs(result) if isinstance(result, Mapping) else []
            for text in texts:
                self.diffs.append(Diff(progress.name, str(data.get("task", "")), text))
            if result.get("changed") and not texts:
                hidden = NO_LOG_DIFF if "censored" in result else NO_DIFF
                self.diffs.append(Diff(progress.name, str(data.get("task", "")), "", hidden))
            if str(data.get("task", "")) == RESTART_PENDING_TASK:
                self.restart_pending[progress.name] = str(result.get("msg", "")).removeprefix("restart pending: ")[:500]
            elif str(data.get("task", "")) == REBOOT_PENDING_TASK:
                self.reboot_pending[progress.name] = str(result.get("msg", "")).removeprefix("reboot pending: ")[:500]
            elif str(data.get("task", "")) == REBOOT_TASK and result.get("changed"):
                self.rebooted.append(progress.name)
                # a Consul server reported pending in its batch, rebooted by the last play
                self.reboot_pending.pop(progress.name, None)
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
            elif seen and progress.status != "partial":
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

    def partly_done(self) -> list[str]:
        return [h for h, p in self.hosts.items() if p.status == "partial"]

    def failed_batch(self) -> int | None:
        batches = [self.hosts[h].batch for h in self.bad_hosts() if self.hosts[h].batch is not None]
        return min(batches) if batches else None

    def succeeded(self, runner_rc: int) -> bool:
        return (runner_rc == 0 and self.stats is not None and not self.bad_hosts() and not self.not_started()
                and not self.partly_done())

    def reboot_line(self) -> str | None:
        """One recap line naming the hosts that wait for a reboot (and why), or None."""
        if not self.reboot_pending:
            return None
        hosts = "; ".join(f"{host} ({why})" for host, why in sorted(self.reboot_pending.items()))
        return f"reboot pending on {plural(len(self.reboot_pending), 'host')} (rerun with --allow-reboot): {hosts}"


    def restart_line(self) -> str | None:
        """One recap line naming the hosts whose running IUs keep an old configuration, or None."""
        if not self.restart_pending:
            return None
        hosts = "; ".join(f"{host}: {ius}" for host, ius in sorted(self.restart_pending.items()))
        return f"IU restart pending on {plural(len(self.restart_pending), 'host')}: {hosts}"

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
                 ("partly done (their later batch never started)", self.partly_done()),
                 ("not started", self.not_started())]
        prefix = "check mode (nothing was changed): " if check else ""
        return f"{prefix}rollout stopped in {where}: " + "; ".join(
            f"{label}: {', '.join(names)}" for label, names in parts if names
        )
