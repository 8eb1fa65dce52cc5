"""Run the selected checks on every node in parallel, then the rack-wide checks per rack.

Phase 1 (a pool of ``parallel`` workers, one task per node): a probe command decides whether the host
answers (UNREACHABLE for every check if not), then the node checks run one after another and the rack
and bracket checks gather their per-node part. Phase 2: per rack (racks concurrently), the rack checks
run on the nodes that answered. Phase 3 (per node again): the bracket checks take their second reading
(counters after the load tests of phases 1 and 2) and judge. A host that hangs costs one command timeout: later commands on it are not started.
Nothing a check raises escapes: it becomes an ERROR result naming the check.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from cluster.errors import ExitCode
from cluster.model import Cluster, Node
from preflight.checks import Check
from preflight.checks.base import GatherError, HostUnreachable, NodeContext, RackContext, RunOptions
from preflight.result import CheckResult, Verdict
from preflight.transport import Transport

PROBE = ["uname", "-r"]
PASSING = (Verdict.PASS, Verdict.SKIP)


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
        for position, check in enumerate(self.checks):
            self.progress.node_step(node.name, check.name)
            try:
                if check.scope == "node":
                    results += check.run(ctx)
                else:
                    self._store_fact(check, node, self._gather(check, ctx))
            except HostUnreachable as exc:
                results += self._unreachable(node, self.checks[position:], f"stopped answering: {exc}")
                self.progress.node_done(node.name, results)
                return node.name, results, False
            except GatherError as exc:
                results.append(check.error(node, exc))
            except Exception as exc:  # a bug in one check must not cost the other checks or nodes
                results.append(
                    check.result(
                        node,
                        Verdict.ERROR,
                        "INTERNAL",
                        f"internal error in {check.name}: {type(exc).__name__}: {exc}",
                    )
                )
        self.progress.node_done(node.name, results)
        return node.name, results, True

    def _finish(self, ctx: NodeContext, checks: list[Check]) -> list[CheckResult]:
        results: list[CheckResult] = []
        for position, check in enumerate(checks):
            before = self._facts[check.name].get(ctx.node.name)
            if before is None and ctx.node.name not in self._facts[check.name]:
                continue  # the node stopped answering before this check's first reading
            try:
                results += check.finish(ctx, before)
            except HostUnreachable as exc:
                return results + self._unreachable(ctx.node, checks[position:], f"stopped answering: {exc}")
            except GatherError as exc:
                results.append(check.error(ctx.node, exc))
            except Exception as exc:
                results.append(check.result(ctx.node, Verdict.ERROR, "INTERNAL",
                                            f"internal error in {check.name}: {type(exc).__name__}: {exc}"))
        return results

    def _gather(self, check: Check, ctx: NodeContext) -> Any:
        try:
            return check.gather(ctx)
        except GatherError as exc:
            return exc

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
            return check.run_rack(ctx)
        except Exception as exc:
            return [
                check.result(
                    c.node,
                    Verdict.ERROR,
                    "INTERNAL",
                    f"internal error in {check.name}: {type(exc).__name__}: {exc}",
                )
                for c in contexts
            ]

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
