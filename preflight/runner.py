"""Run the selected checks on every node in parallel, then the rack-wide checks per rack.

Phase 1 (a pool of ``parallel`` workers, one task per node): a probe command decides whether the host
answers (UNREACHABLE for every check if not), then the node checks run and the rack and bracket checks
gather their per-node part, in the stages of :func:`node_stages`: first every reading, up to
``READINGS_AT_ONCE`` side by side over the node's one connection; then the checks that load the hardware,
one at a time; then the readings of their outputs. Phase 2: per rack (racks concurrently), the rack checks
run on the nodes that answered. Phase 3 (per node again): the bracket checks take their second reading
(counters after the load tests of phases 1 and 2), side by side, and judge. A host that hangs costs one
command timeout: later commands on it are not started. Nothing a check raises escapes: it becomes an ERROR
result naming the check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cluster.model import Cluster, Node
from common.errors import ExitCode
from preflight.checks import Check
from preflight.checks.base import (
    GatherError,
    HostUnreachable,
    NodeContext,
    RackContext,
    RunOptions,
    noting_parse_warnings,
    with_parse_warnings,
)
from preflight.result import CheckResult, Verdict
from preflight.transport import Transport

PROBE = ["uname", "-r"]
PASSING = (Verdict.PASS, Verdict.SKIP)
# A node's readings (nvidia-smi, sysfs, chronyc, ...) are independent and mostly wait on their tools, so they
# run side by side as channels of the node's one SSH connection. Two: with 4, the 18-machine fault matrix on a
# loaded 2-core controller twice saw a command's channel close with no exit status (rc -1, no output), cause
# not found; with 2 it passed under the same load, and one node's run is still ~35% shorter
# (docs/decisions/0012-preflight-readings-at-once.md).
READINGS_AT_ONCE = 2


@dataclass(frozen=True)
class Stage:
    checks: tuple[Check, ...]
    at_once: int

    @property
    def label(self) -> str:
        """What the progress shows running on a node: the check, or how many run side by side."""
        return self.checks[0].name if len(self.checks) == 1 else f"{len(self.checks)} readings"


def node_stages(checks: Sequence[Check]) -> list[Stage]:
    """The order phase 1 runs ``checks`` on a node in: the readings (bracket checks' first reading included)
    side by side; then each check that loads the hardware alone, in registry order; then the checks that
    read a load test's output. Empty stages are left out; the report keeps the registry order."""
    loads = tuple(c for c in checks if c.loads_hardware)
    load_names = {c.name for c in loads}
    after = tuple(c for c in checks if not c.loads_hardware and load_names & set(c.reads_outputs_of))
    readings = tuple(c for c in checks if not c.loads_hardware and c not in after)
    stages = [Stage(readings, READINGS_AT_ONCE), *(Stage((c,), 1) for c in loads), Stage(after, READINGS_AT_ONCE)]
    return [s for s in stages if s.checks]


class Progress:
    """What the runner reports while it works (the CLI draws it; tests may count it)."""

    def start(self, nodes: int) -> None: ...

    def node_done(self, node: str, results: list[CheckResult]) -> None: ...

    def phase(self, text: str) -> None: ...

    def node_step(self, node: str, check: str) -> None:
        """``check`` starts on ``node`` (long tests -- dcgm_diag, gpu_bandwidth -- show which node waits)."""


@dataclass
class RunOutcome:
    results: list[CheckResult]
    started: float
    finished: float
    options: RunOptions
    checks: list[str]
    released: dict[str, list[str]] = field(
        default_factory=dict
    )  # node -> IU services taken out of maintenance (preflight.release fills it)

    @property
    def duration(self) -> float:
        return self.finished - self.started


def exit_code(results: Sequence[CheckResult], strict: bool = False) -> ExitCode:
    """0 all passed (WARN allowed unless strict), 1 any FAIL, 3 unreachable/ERROR and no FAIL."""
    verdicts = {r.verdict for r in results}
    if Verdict.FAIL in verdicts or (strict and Verdict.WARN in verdicts):
        return ExitCode.FAILED
    if verdicts & {Verdict.UNREACHABLE, Verdict.ERROR}:
        return ExitCode.UNREACHABLE
    return ExitCode.OK


def node_passed(results: Sequence[CheckResult], strict: bool = False) -> bool:
    allowed = PASSING if strict else (*PASSING, Verdict.WARN)
    return bool(results) and all(r.verdict in allowed for r in results)


class Runner:
    def __init__(
        self,
        cluster: Cluster,
        checks: Sequence[Check],
        profiles: dict[str, dict[str, Any]],
        transport: Transport,
        options: RunOptions,
        parallel: int = 32,
        progress: Progress | None = None,
    ):
        self.cluster = cluster
        self.checks = list(checks)
        self.profiles = profiles
        self.transport = transport
        self.options = options
        self.parallel = max(1, parallel)
        self.progress = progress or Progress()
        self._facts: dict[str, dict[str, Any]] = {c.name: {} for c in self.checks if c.scope != "node"}
        self._facts_lock = threading.Lock()
        # (check, node) -> the warnings of the parses its gather made (rack and bracket checks; node checks
        # note their own in Check.run): their results carry them as node checks' do
        self._parse_warnings: dict[tuple[str, str], list[str]] = {}

    def run(self) -> RunOutcome:
        started = time.time()
        nodes = list(self.cluster.nodes())
        self.progress.start(len(nodes))
        contexts = {
            n.name: NodeContext(n, self.profiles[n.name], self.transport, self.options) for n in nodes
        }
        results: list[CheckResult] = []
        reachable: set[str] = set()
        with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="preflight-node") as pool:
            for name, node_results, answered in pool.map(lambda n: self._node(contexts[n.name]), nodes):
                results += node_results
                if answered:
                    reachable.add(name)
        rack_checks = [c for c in self.checks if c.scope == "rack"]
        if rack_checks:
            self.progress.phase("rack checks: " + ", ".join(c.name for c in rack_checks))
            # A rack check's unit of work is one rail of one node pair: up to `parallel` pairs at once, all
            # their rails together (rails are independent links).
            rails = max((len(n.nics) for n in nodes), default=1) or 1
            with (
                ThreadPoolExecutor(
                    max_workers=self.parallel * rails, thread_name_prefix="preflight-rack-work"
                ) as work,
                ThreadPoolExecutor(
                    max_workers=max(1, len(self.cluster.racks)), thread_name_prefix="preflight-rack"
                ) as racks,
            ):
                jobs = [(rack, check) for rack in self.cluster.racks for check in rack_checks]
                for rack_results in racks.map(
                    lambda job: self._rack(
                        job[0], job[1], [contexts[n.name] for n in job[0].nodes if n.name in reachable], work
                    ),
                    jobs,
                ):
                    results += rack_results
        bracket = [c for c in self.checks if c.scope == "bracket"]
        if bracket:
            self.progress.phase("after the load tests: " + ", ".join(c.name for c in bracket))
            with ThreadPoolExecutor(max_workers=self.parallel, thread_name_prefix="preflight-after") as pool:
                for node_results in pool.map(
                    lambda n: self._finish(contexts[n.name], bracket), [n for n in nodes if n.name in reachable]
                ):
                    results += node_results
        outcome = RunOutcome(
            self._ordered(results), started, time.time(), self.options, [c.name for c in self.checks]
        )
        return outcome

    def _node(self, ctx: NodeContext) -> tuple[str, list[CheckResult], bool]:
        node = ctx.node
        probe = self.transport.run(node, PROBE, self.options.probe_timeout)
        if probe.unreachable or probe.timed_out or probe.rc is None:
            why = (
                f"no answer within {self.options.probe_timeout:g}s"
                if probe.timed_out
                else probe.last_line() or "connection failed"
            )
            results = self._unreachable(node, self.checks, why)
            self.progress.node_done(node.name, results)
            return node.name, results, False
        results: list[CheckResult] = []
        stages = node_stages(self.checks)
        for position, stage in enumerate(stages):
            self.progress.node_step(node.name, stage.label)
            done, left, stopped = self._side_by_side(ctx, stage.checks, stage.at_once,
                                                     lambda check: self._phase_one(check, ctx))
            results += done
            if stopped is not None:
                left += [c for later in stages[position + 1:] for c in later.checks]
                results += self._unreachable(node, left, f"stopped answering: {stopped}")
                self.progress.node_done(node.name, results)
                return node.name, results, False
        self.progress.node_done(node.name, results)
        return node.name, results, True

    @staticmethod
    def _side_by_side(
        ctx: NodeContext, checks: Sequence[Check], at_once: int, one: Callable[[Check], list[CheckResult]]
    ) -> tuple[list[CheckResult], list[Check], str | None]:
        """``one(check)`` for each of ``checks``, up to ``at_once`` at a time, nothing escaping: a GatherError
        is the check's ERROR, any other exception (a bug in one check) its INTERNAL ERROR. Returns the results,
        the checks not finished because the host stopped answering (during them, or before they started: they
        are then not started), and why it stopped, if it did."""
        stopped: list[str] = []

        def guarded(check: Check) -> list[CheckResult] | None:
            if stopped:
                return None
            try:
                return one(check)
            except HostUnreachable as exc:
                stopped.append(str(exc))
                return None
            except GatherError as exc:
                return [check.error(ctx.node, exc)]
            except Exception as exc:  # a bug in one check must not cost the other checks or nodes
                return [internal_error(check, ctx.node, exc)]

        if at_once == 1 or len(checks) == 1:
            outcomes = [guarded(c) for c in checks]
        else:
            with ThreadPoolExecutor(at_once, thread_name_prefix=f"preflight-{ctx.node.name}") as pool:
                outcomes = list(pool.map(guarded, checks))
        done = [r for results in outcomes if results is not None for r in results]
        left = [c for c, results in zip(checks, outcomes, strict=True) if results is None]
        return done, left, (stopped[0] if stopped else None)

    def _phase_one(self, check: Check, ctx: NodeContext) -> list[CheckResult]:
        """A node check's results, or a rack/bracket check's per-node part stored (no results yet)."""
        if check.scope == "node":
            return check.run(ctx)
        self._store_fact(check, ctx.node, self._gather(check, ctx))
        return []

    def _finish(self, ctx: NodeContext, checks: list[Check]) -> list[CheckResult]:
        """The bracket checks' second readings, judged with their first."""
        # a node that stopped answering before a check's first reading gets no second one
        read = [c for c in checks if ctx.node.name in self._facts[c.name]]
        results, left, stopped = self._side_by_side(ctx, read, READINGS_AT_ONCE, lambda check: self._noted(
            check, ctx.node, lambda: check.finish(ctx, self._facts[check.name][ctx.node.name])))
        if stopped is not None:
            results += self._unreachable(ctx.node, left, f"stopped answering: {stopped}")
        return results

    def _gather(self, check: Check, ctx: NodeContext) -> Any:
        with noting_parse_warnings() as noted:
            try:
                return check.gather(ctx)
            except GatherError as exc:
                return exc
            finally:
                with self._facts_lock:
                    self._parse_warnings[(check.name, ctx.node.name)] = noted

    def _noted(self, check: Check, node: Node, judge: Callable[[], list[CheckResult]]) -> list[CheckResult]:
        """``judge()``'s results (a bracket check's finish) noting its gather's and its own parse warnings."""
        with noting_parse_warnings() as noted:
            results = judge()
        return with_parse_warnings(results, self._parse_warnings.get((check.name, node.name), []) + noted)

    def _store_fact(self, check: Check, node: Node, value: Any) -> None:
        with self._facts_lock:
            self._facts[check.name][node.name] = value

    def _rack(
        self, rack, check: Check, contexts: list[NodeContext], work: ThreadPoolExecutor
    ) -> list[CheckResult]:
        if not contexts:
            return []
        ctx = RackContext(rack.name, contexts, self._facts[check.name], work, self.options)
        try:
            return [noted for result in check.run_rack(ctx)
                    for noted in with_parse_warnings([result], self._parse_warnings.get((check.name, result.node), []))]
        except Exception as exc:
            return [internal_error(check, c.node, exc) for c in contexts]

    def _unreachable(self, node: Node, checks: Sequence[Check], why: str) -> list[CheckResult]:
        return [
            c.result(
                node, Verdict.UNREACHABLE, "HOST_UNREACHABLE", f"host unreachable: {why}", address=node.address
            )
            for c in checks
        ]

    def _ordered(self, results: list[CheckResult]) -> list[CheckResult]:
        order = {c.name: i for i, c in enumerate(self.checks)}
        return sorted(results, key=lambda r: (r.rack, r.node, order.get(r.check, 99), r.iu or ""))


def internal_error(check: Check, node: Node, exc: Exception) -> CheckResult:
    """ERROR ``INTERNAL`` for ``node``: ``check`` raised what no check should (a bug), named with the check."""
    return check.result(node, Verdict.ERROR, "INTERNAL", f"internal error in {check.name}: {type(exc).__name__}: {exc}")


def run_preflight(
    cluster: Cluster,
    checks: Sequence[Check],
    profiles: dict[str, dict[str, Any]],
    transport: Transport,
    options: RunOptions,
    parallel: int = 32,
    progress: Progress | None = None,
) -> RunOutcome:
    """Judge every node; nothing is changed on the cluster (``preflight.release`` releases afterwards)."""
    return Runner(cluster, checks, profiles, transport, options, parallel, progress).run()
