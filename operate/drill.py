"""A fault drill: the drill file's load sent open-loop through the edge (:mod:`operate.loadgen`), its faults
injected on one target at their times and undone after their hold (:mod:`operate.drill_faults`), Consul's
view of the target sampled throughout, then the measures and checks (:mod:`operate.drill_measure`).

Safety: :func:`refusal` says why an inventory may not be drilled (a host without ``drills_allowed: true``);
one target (one unit, or one node) per drill, one fault at a time. Whatever ends the drill (the load's end, a
fault that cannot be injected, Ctrl-C, an exception) every undo recorded so far runs before :func:`run`
returns or raises, and ``restored`` lists what each put back (or why it could not).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rich.console import Group
from rich.table import Table
from rich.text import Text

from cluster.model import Cluster, Node
from common.errors import UsageError
from consul_io import layout
from operate import loadtest
from operate.drill_faults import FaultError, FaultStep, Target
from operate.drill_measure import ConsulSample, FaultWindow, judge, measure, sent_at, timeline
from operate.drill_scenario import CHECKS, Drill
from operate.loadgen import Generator, plan

CONSUL_POLL_S = 0.25
DRILLS_ALLOWED = "drills_allowed"


def refusal(hostvars: dict, node: Node, inventory: str) -> str | None:
    """Why ``node`` may not be drilled (None: it may)."""
    if hostvars.get(DRILLS_ALLOWED) is True:
        return None
    return (f"{inventory}: {node.name}: {DRILLS_ALLOWED} is not true: a drill kills, freezes and stops units "
            f"serving traffic; set '{DRILLS_ALLOWED}: true' for hosts that may be drilled, or pass "
            f"--override-drills-allowed")


def pick_target(cluster: Cluster, drill: Drill, name: str | None, become: dict[str, bool] | None = None) -> Target:
    """The named IU or node; by default the first IU of the first node. A node fault takes the IU's node.
    ``become``: node name -> its ``ansible_become``."""
    nodes = sorted(cluster.nodes(), key=lambda n: n.name)
    ius = {iu.id: (node, iu) for node in nodes for iu in node.ius}
    if name is None:
        if not ius:
            raise UsageError("the inventory declares no IU to drill")
        node, iu = next(iter(ius.values()))
    elif name in ius:
        node, iu = ius[name]
    else:
        by_node = {n.name: n for n in nodes}
        if name not in by_node:
            raise UsageError(f"--target {name!r}: no such IU or node (IUs: {', '.join(list(ius)[:8]) or '-'})")
        node = by_node[name]
        if drill.scope == "unit":
            if not node.ius:
                raise UsageError(f"--target {name!r}: the node has no IU for a unit fault")
            iu = node.ius[0]
        else:
            iu = None
    return Target(node, iu if drill.scope == "unit" else None, bool((become or {}).get(node.name)))


def becomes(hostvars: dict) -> bool:
    """Ansible's truth of ``ansible_become`` (a YAML boolean, or a string such as "yes")."""
    value = hostvars.get("ansible_become", False)
    return value is True or str(value).lower() in ("true", "yes", "on", "1")


class ConsulWatch:
    """Samples the health of the target's IU instances: the worst of their checks' statuses and the status the
    node's agent gives each in its score body (``score_key``: the agent's only output in Consul, its verdict on
    what no check sees, such as a GPU off the bus), or missing when the catalog does not list the instance."""

    def __init__(self, io, ius: tuple[str, ...], clock: Callable[[], float], score_key: str | None = None):
        self.io, self.ius, self.clock, self.score_key = io, ius, clock, score_key
        self.samples: list[ConsulSample] = []
        self.errors = 0
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="drill-consul", daemon=True)

    def _loop(self) -> None:
        while not self.stop_event.wait(CONSUL_POLL_S):
            try:
                _, entries = self.io.health_service()
            except Exception:  # a Consul that does not answer is a sample of nothing, not the end of the drill
                self.errors += 1
                continue
            t = self.clock()
            seen = {}
            for entry in entries:
                sid = (entry.get("Service") or {}).get("ID")
                statuses = {c.get("Status") for c in entry.get("Checks") or []}
                seen[sid] = next((s for s in ("critical", "warning") if s in statuses), "passing")
            for iu, verdict in self._verdicts().items():
                if iu in seen and verdict in ("critical", "warning") and seen[iu] != "critical":
                    seen[iu] = verdict
            self.samples += [ConsulSample(t, iu, seen.get(iu, "missing")) for iu in self.ius]

    def _verdicts(self) -> dict[str, str]:
        """IU -> the status its agent published; {} without a key, a body or one that cannot be read."""
        if self.score_key is None:
            return {}
        try:
            _, text = self.io.kv_read(self.score_key)
            ius = json.loads(text).get("ius") if text else None
        except Exception:  # a body that cannot be read adds nothing to the checks' view
            return {}
        return {iu: str(e.get("status")) for iu, e in (ius or {}).items() if isinstance(e, dict)}

    def __enter__(self) -> ConsulWatch:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(5)


@dataclass
class DrillResult:
    drill: Drill
    target: str
    faulted_ius: tuple[str, ...]
    endpoint: str
    rate: float
    load: loadtest.Result
    windows: list[FaultWindow]
    consul_samples: list[ConsulSample]
    restored: list[str]
    events: list[str] = field(default_factory=list)
    error: str | None = None
    consul_watched: bool = False
    remediations: list[dict] = field(default_factory=list)  # recovery: remediate: each ladder's outcome

    def __post_init__(self):
        self.measures = measure(self.load.outcomes, self.windows, self.faulted_ius, self.consul_samples)
        self.verdicts = judge(self.measures, self.drill.checks)
        self.timeline = timeline(self.load.outcomes, self.faulted_ius, self.load.elapsed_s)

    @property
    def interrupted(self) -> bool:
        return self.load.interrupted

    @property
    def unrestored(self) -> list[str]:
        return [line for line in self.restored if "NOT restored" in line]

    @property
    def passed(self) -> bool:
        return (not self.interrupted and self.error is None and not self.unrestored and
                len(self.windows) == len(self.drill.faults) and all(v.met for v in self.verdicts))

    def as_dict(self) -> dict:
        return {"drill": self.drill.name, "drill_file": self.drill.source, "target": self.target,
                "faulted_ius": list(self.faulted_ius), "endpoint": self.endpoint, "rate_per_s": self.rate,
                "duration_s": self.drill.duration_s, "passed": self.passed, "interrupted": self.interrupted,
                "error": self.error, "restored": self.restored, "events": self.events,
                "consul_watched": self.consul_watched, "recovery": self.drill.recovery,
                "remediations": self.remediations,
                "faults": [m.as_dict() for m in self.measures], "checks": [v.as_dict() for v in self.verdicts],
                "timeline": self.timeline, "load": self.load.as_dict()}

    def render(self) -> Group:
        return Group(measure_table(self), loadtest.verdict_table(self.load), Text(summary_line(self)))


def _fmt(value, unit: str = "") -> str:
    if value is None:
        return "not seen"
    return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"


def measure_table(result: DrillResult) -> Table:
    table = Table(title=f"drill {result.drill.name} on {result.target} at {result.rate:g} req/s "
                        f"({result.endpoint})", title_justify="left")
    for name in ("fault", "measure", "value", "check", "verdict"):
        table.add_column(name, justify="right" if name == "value" else "left")
    by_check = {(v.fault, v.check.removesuffix("_max")): v for v in result.verdicts}
    for i, m in enumerate(result.measures):
        rows = [("route_away_s", m.route_away_s, " s"), ("consul_critical_s", m.consul_critical_s, " s"),
                ("failed_not_streaming", m.failed_not_streaming, ""), ("failed_streaming", m.failed_streaming, ""),
                ("failed_in_flight", m.failed_in_flight, ""),
                ("blast_radius_errors", m.blast_radius_errors, ""), ("served_during_fault", m.served_during_fault, ""),
                ("ttft_p99_baseline_s", m.ttft_p99_baseline_s, " s"), ("ttft_p99_fault_s", m.ttft_p99_fault_s, " s"),
                ("ttft_p99_ratio", m.ttft_p99_ratio, "x"), ("recover_s", m.recover_s, " s"),
                ("serving_again_s", m.serving_again_s, " s")]
        for j, (name, value, unit) in enumerate(rows):
            v = by_check.get((i, name))
            check = f"<= {v.limit:g}" if v else "-"
            verdict = Text("met", style="green") if v and v.met else Text("NOT MET", style="red") if v else Text("")
            shown = _fmt(value, unit) + (" (still routed at the undo)" if name == "route_away_s" and m.still_routed
                                         else "")
            if name == "consul_critical_s" and value is None and not result.consul_watched:
                shown = "not watched"
            label = f"{m.kind} {m.at_s:.1f}-{m.undone_s:.1f} s" if j == 0 else ""
            table.add_row(label, name, shown, check, verdict)
    return table


def summary_line(result: DrillResult) -> str:
    met = sum(v.met for v in result.verdicts)
    parts = [f"{met} of {len(result.verdicts)} checks met", f"{len(result.load.outcomes)} requests"]
    if result.error:
        parts.append(f"stopped: {result.error}")
    if result.interrupted:
        parts.append("interrupted")
    parts.append(f"restored: {len(result.restored) - len(result.unrestored)} of {len(result.restored)}")
    return "; ".join(parts) + (": PASSED" if result.passed else ": FAILED")


async def _wait(stop: asyncio.Event, seconds: float) -> bool:
    """Sleep ``seconds`` unless ``stop`` is set first; True when stopped."""
    if seconds > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), seconds)
    return stop.is_set()


async def run_async(drill: Drill, target: Target, transport, endpoint: str, *, consul_io=None, rate: float | None = None,
                    log: Callable[[str], None] = lambda line: None, remediate: Callable[[], object] | None = None,
                    ) -> DrillResult:
    """``remediate`` (a drill with ``recovery: remediate``): runs clusterctl remediate's ladder on the target
    and returns its :class:`operate.remediate.Outcome`; it runs after each fault's hold, before the fault's
    undo (then a no-op: the unit is running again), and the fault counts as undone when it returns."""
    if drill.recovery == "remediate" and remediate is None:
        raise UsageError(f"{drill.source}: recovery: remediate needs Consul (--consul): the ladder drains the unit")
    model = await loadtest.probe(endpoint)  # unreachable: exit 2 before anything is touched
    rate = rate or drill.rate_per_s
    # the units whose requests count as the faulted ones: none when the edge in front of them all restarts
    faulted = () if drill.scope == "edge" else target.iu_ids
    planned = plan(drill.mix, rate, drill.planned_s, drill.seed)
    generator = Generator(endpoint, model, drill.timeout_s, drill.seed)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    recovered = asyncio.Event()  # the faulted unit answered in full a request sent after the last undo
    load_s = drill.planned_s
    steps: list[FaultStep] = []
    windows: list[FaultWindow] = []
    restored: list[str] = []
    events: list[str] = []
    remediations: list[dict] = []
    error: str | None = None
    interrupted = False

    def note(line: str) -> None:
        events.append(line)
        log(line)

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        generator.stop()
        stop.set()

    def on_done(outcome) -> None:
        if (outcome.ok and outcome.iu in faulted and len(windows) == len(drill.faults)
                and sent_at(outcome) >= windows[-1].undone):
            recovered.set()

    async def faults(start: float) -> None:
        try:
            await schedule_faults(start)
            await end_load(start)
        except BaseException:  # a crash of the schedule ends the load at once; the undos run below
            generator.stop()
            stop.set()
            raise

    async def schedule_faults(start: float) -> None:
        nonlocal error
        for spec in drill.faults:
            if await _wait(stop, start + spec.at_s - loop.time()):
                return
            step = FaultStep(spec.kind, target, transport)
            steps.append(step)
            try:
                await asyncio.to_thread(step.inject)  # runs to its end: an undo never races its inject
            except FaultError as exc:
                error = str(exc)
                note(f"{loop.time() - start:6.1f} s  {spec.kind} on {target.label} failed: {exc}")
                generator.stop()
                stop.set()
                return
            at = loop.time() - start
            note(f"{at:6.1f} s  {spec.kind} on {target.label}: {'; '.join(step.done)}")
            await _wait(stop, start + spec.end_s - loop.time())
            if drill.recovery == "remediate" and not stop.is_set():
                outcome = await asyncio.to_thread(remediate)
                remediations.append(outcome.as_dict())
                note(f"{loop.time() - start:6.1f} s  remediate {target.label}: {outcome.state}: {outcome.message}")
                if not outcome.ok:
                    error = f"remediate: {outcome.message}"
            lines = await asyncio.to_thread(step.undo)
            restored.extend(lines)
            undone = loop.time() - start
            windows.append(FaultWindow(spec.kind, target.label, at, undone))
            note(f"{undone:6.1f} s  undone: {'; '.join(lines)}")

    async def end_load(start: float) -> None:
        """After ``duration_s``: end the load once the faulted unit serves again, or at its recovery deadline."""
        nonlocal load_s
        if stop.is_set() or len(windows) != len(drill.faults):
            return
        deadline = drill.recovery_deadline(windows[-1].at, windows[-1].undone)
        if deadline is None:
            return  # the plan ends at duration_s
        await _wait(stop, start + drill.duration_s - loop.time())
        if not recovered.is_set() and not stop.is_set():
            waits = [asyncio.ensure_future(recovered.wait()), asyncio.ensure_future(stop.wait())]
            await asyncio.wait(waits, timeout=max(0.0, start + deadline - loop.time()),
                               return_when=asyncio.FIRST_COMPLETED)
            for waiting in waits:
                waiting.cancel()
        if stop.is_set():
            return
        load_s = loop.time() - start
        if load_s > drill.duration_s + 1:
            note(f"{load_s:6.1f} s  load ends: {target.label} "
                 + ("served again" if recovered.is_set() else "had not served again by its recovery limit"))
        generator.finish()

    handled = False
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread: no signal handler
        loop.add_signal_handler(signal.SIGINT, on_sigint)
        handled = True
    score_key = layout.score_key(target.node.settings.consul.dc or layout.DEFAULT_DATACENTER, target.node.name)
    watch = ConsulWatch(consul_io, faulted, time.monotonic, score_key) if consul_io is not None else None
    started = time.monotonic()
    try:
        with watch or contextlib.nullcontext():
            load = asyncio.create_task(generator.run(planned, on_done))
            while generator.started is None and not load.done():
                await asyncio.sleep(0)
            schedule = asyncio.create_task(faults(generator.started or loop.time()))
            outcomes = await load
            stop.set()
            await schedule
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
        for step in steps:  # a fault still held (Ctrl-C, an exception): put it back now
            lines = step.undo()
            restored.extend(lines)
            for line in lines:
                log(f"restored: {line}")
    t0 = generator.started or loop.time()
    samples = [ConsulSample(s.t - t0, s.iu, s.status) for s in watch.samples] if watch else []
    result = loadtest.Result(drill.mix, endpoint, rate, min(load_s, drill.planned_s), list(outcomes),
                             time.monotonic() - started, generator.sent if generator.finishing else len(planned),
                             interrupted or generator.stopped and error is None)
    return DrillResult(drill, target.label, faulted, endpoint, rate, result, windows, samples, restored,
                       events, error, watch is not None, remediations)


def run(drill: Drill, target: Target, transport, endpoint: str, **kwargs) -> DrillResult:
    """One drill (keywords: :func:`run_async`)."""
    return asyncio.run(run_async(drill, target, transport, endpoint, **kwargs))


def library_table(drills: list) -> Table:
    """``clusterctl drill --list``: one row per drill of the library."""
    table = Table(title="drill library (operate/drills/)", title_justify="left")
    for name in ("drill", "faults", "load", "checks", "description"):
        table.add_column(name, overflow="fold")
    for d in drills:
        faults = ", ".join(f"{f.kind} at {f.at_s:g} s for {f.hold_s:g} s" for f in d.faults)
        checks = ", ".join(f"{k.removesuffix('_max')} <= {v:g}" for k, v in d.checks.items() if k in CHECKS)
        summary = d.description.split(". ")[0].split(": ")[0].rstrip(".")
        table.add_row(d.name, faults, f"{d.mix.name} {d.rate_per_s:g}/s {d.duration_s:g} s", checks, summary)
    return table
