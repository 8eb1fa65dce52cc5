"""What a preflight run shows while it works, on stderr: a live line on a terminal, plain lines elsewhere.

:class:`LiveProgress` (a terminal): nodes done/total, failures so far and each running node's check and
for how long, redrawn in place. :class:`PlainProgress` (CI logs, ``2> log``, a pipe, where a live line
draws nothing): one line when a check starts on a node (saying how long its previous check took), one
when a node is done (with what failed on it), one per phase, and every ``heartbeat_s`` while checks run
which checks are running where and for how long (a 15-minute dcgm_diag is not silence). A fleet's fast
checks would flood a log: at most ``burst`` check-start lines per ``window_s``; the others are counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from common.text import plural
from preflight.result import CheckResult, Verdict
from preflight.runner import Progress as RunnerProgress

BAD = (Verdict.FAIL, Verdict.ERROR, Verdict.UNREACHABLE)


def elapsed_text(seconds: float) -> str:
    """``45s``, ``2m15s``, ``1h02m``: how long a running check has taken."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class _Tracker(RunnerProgress):
    """Which nodes are pending, the failures so far, and each running node's check and since when (the
    runner's threads report; both views read)."""

    def __init__(self, nodes: list[str] | None, clock: Callable[[], float]):
        self.failures = 0
        self.pending = list(nodes or [])
        self._clock = clock
        self._running: dict[str, tuple[str, float]] = {}  # node -> (check, since)
        self._lock = threading.Lock()

    def node_step(self, node: str, check: str) -> None:
        self._step(node, check)

    def _step(self, node: str, check: str) -> tuple[str, float] | None:
        """Record ``check`` starting on ``node``; returns the check it ran before and when that started."""
        with self._lock:
            previous = self._running.get(node)
            self._running[node] = (check, self._clock())
        return previous

    def _finished(self, node: str, results: list[CheckResult]) -> tuple[str, float] | None:
        with self._lock:
            self.failures += sum(1 for r in results if r.verdict in BAD)
            last = self._running.pop(node, None)
            if node in self.pending:
                self.pending.remove(node)
        return last

    def running_text(self, most: int = 3) -> str:
        """Each running check with the time since its first node started it and up to ``most`` node names."""
        with self._lock:
            running = list(self._running.items())
        groups: dict[str, list[tuple[str, float]]] = {}
        for node, (check, since) in running:
            groups.setdefault(check, []).append((node, since))
        now = self._clock()
        parts = []
        for check, members in sorted(groups.items(), key=lambda item: min(s for _, s in item[1])):
            names = [n for n, _ in members]
            shown = ", ".join(names[:most]) + (f" (+{len(names) - most})" if len(names) > most else "")
            parts.append(f"{check} {elapsed_text(now - min(s for _, s in members))}: {shown}")
        return "; ".join(parts)

    def waiting_text(self, most: int = 3) -> str:
        with self._lock:
            pending = list(self.pending)
        if not pending:
            return "node checks"
        names = ", ".join(pending[:most]) + (f" (+{len(pending) - most})" if len(pending) > most else "")
        return f"waiting on {names}"  # drawn as plain Text by _PhaseColumn: no markup to escape


BAR_WIDTH = 12


class _PhaseColumn(ProgressColumn):
    """The live line's last column, drawn at every refresh (so the time each running check has taken
    keeps counting): each node's current check while node checks run, else the runner's phase."""

    # the live line's other columns at their widest for a fleet of up to 9,999 nodes and failures:
    # "preflight", the bar, "9999/9999", "nodes", "9999 failures", "0:00:00" and the gaps between them
    OTHERS_WIDTH = 9 + BAR_WIDTH + 9 + 5 + 13 + 7 + 6

    def __init__(self, live: LiveProgress):
        # one line, cut with an ellipsis: a folded live line squeezes the bar to nothing and redraws as a block
        width = max(12, live.console.width - self.OTHERS_WIDTH)
        super().__init__(table_column=Column(no_wrap=True, overflow="ellipsis", max_width=width))
        self._live = live

    def render(self, task: Any) -> Text:
        return Text(self._live.running_text() or task.fields.get("phase", ""), no_wrap=True, overflow="ellipsis")


class LiveProgress(_Tracker):
    """nodes done/total, failures so far and what the nodes are doing, redrawn in place while the runner
    works: each running node's current check and for how long (``dcgm_diag 2m15s: r01n01, r01n02``), and
    ``waiting on r02n02`` when one hung node holds up the run."""

    def __init__(self, console: Console, nodes: list[str] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(nodes, clock)
        self.console = console
        self._bar = Progress(
            TextColumn("[bold]preflight[/]"),
            BarColumn(bar_width=BAR_WIDTH),
            MofNCompleteColumn(),
            TextColumn("nodes"),
            TextColumn("{task.fields[failures]}"),
            _PhaseColumn(self),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self._task = None

    def __enter__(self) -> LiveProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._bar.stop()

    def start(self, nodes: int) -> None:
        self._task = self._bar.add_task(
            "nodes", total=nodes, failures=self._failures_text(), phase="node checks"
        )

    def node_done(self, node: str, results: list[CheckResult]) -> None:
        self._finished(node, results)
        self._bar.update(self._task, advance=1, failures=self._failures_text(), phase=self.waiting_text())

    def phase(self, text: str) -> None:
        self._bar.update(self._task, phase=text)

    def _failures_text(self) -> str:
        text = plural(self.failures, "failure")
        return f"[red]{text}[/]" if self.failures else f"[green]{text}[/]"


class PlainProgress(_Tracker):
    """The progress as lines, for a stderr that is not a terminal (see the module's docstring)."""

    def __init__(self, console: Console, nodes: list[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, heartbeat_s: float = 30.0, burst: int = 20,
                 window_s: float = 10.0):
        super().__init__(nodes, clock)
        self.console = console
        self.total, self.done, self.not_shown = len(self.pending), 0, 0
        self.heartbeat_s, self.burst, self.window_s = heartbeat_s, burst, window_s
        self._window: tuple[float, int] = (clock(), 0)  # (start, check-start lines printed in it)
        self._phase = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PlainProgress:
        self._thread = threading.Thread(target=self._beat, name="preflight-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.not_shown:
            self._line(f"({plural(self.not_shown, 'check start')} not shown: more than {self.burst} "
                       f"in {self.window_s:g}s)")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            self.heartbeat()

    def heartbeat(self) -> None:
        running = self.running_text()
        if running:
            self._line(f"still running ({self.done}/{self.total} nodes done): {running}")

    def _line(self, text: str) -> None:
        # one physical line each, never folded, never read as markup (node and check names are data)
        self.console.print(Text(f"preflight: {text}"), soft_wrap=True, highlight=False)

    def start(self, nodes: int) -> None:
        self.total = nodes
        self._line(f"checking {plural(nodes, 'node')}")

    def node_step(self, node: str, check: str) -> None:
        previous = self._step(node, check)
        with self._lock:
            start, printed = self._window
            if self._clock() - start >= self.window_s:
                start, printed = self._clock(), 0
            shown = printed < self.burst
            self._window = (start, printed + shown)
            self.not_shown += not shown
        if shown:
            took = f" ({previous[0]} took {elapsed_text(self._clock() - previous[1])})" if previous else ""
            self._line(f"{node}: {check} started{took}")

    def node_done(self, node: str, results: list[CheckResult]) -> None:
        last = self._finished(node, results)
        with self._lock:
            self.done += 1
            done = self.done
        bad: dict[str, list[str]] = {}
        for r in results:
            if r.verdict in BAD:
                bad.setdefault(r.verdict.value, []).append(r.check)
        verdicts = "; ".join(f"{verdict} {', '.join(sorted(set(checks)))}" for verdict, checks in bad.items())
        took = f" ({last[0]} took {elapsed_text(self._clock() - last[1])})" if last else ""
        self._line(f"{node} done ({done}/{self.total} nodes){took}: {verdicts or 'nothing failed'}")

    def phase(self, text: str) -> None:
        if text != self._phase:
            self._phase = text
            self._line(text)
