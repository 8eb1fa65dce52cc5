"""The frame every check runs in: ``gather(ctx) -> facts`` then ``evaluate(facts, profile, node)``.

``gather`` is the only place that runs commands (through the transport, via ``ctx``) or reads Consul, and
it reads every output with a registered parser (``ctx.parsed``: :mod:`preflight.parsers`, the kinds of
``clusterctl preflight parse``). ``evaluate`` is pure: it gets the facts, the node's profile and the node,
runs nothing, parses nothing, and returns the results; its tests build the facts directly. Rack checks
gather per node; their ``run_rack`` hands the rack's facts to ``evaluate`` once per node (versions: what
each node's gather read; ib_pairs: the pair tests between hosts, run first by its ``gather_rack``); bracket
checks take a second reading in ``finish`` and hand both to ``evaluate``.

A check never lets an exception escape: a command that fails, times out or prints something the parser
rejects becomes an ERROR result with an excerpt of what came back; a host that stops answering becomes
UNREACHABLE. Commands are cached per node by argv, so two checks reading ``ibstat`` run it once, also
when they ask at the same moment (the runner runs a node's readings side by side).
"""

from __future__ import annotations

import shlex
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from cluster.model import Node
from preflight.result import CheckResult, Verdict
from preflight.transport import OUTPUT_CAP_BYTES, CommandResult, Transport

EXCERPT_CHARS = 400


class GatherError(Exception):
    """A command could not give us what the check needs: the check's verdict is ERROR."""

    def __init__(self, reason: str, **evidence: Any):
        super().__init__(reason)
        self.reason = reason
        self.evidence = evidence


class HostUnreachable(Exception):
    pass


@dataclass(frozen=True)
class RunOptions:
    timeout: float = 120.0  # per command
    probe_timeout: float = 15.0  # the first command on a host; a host that does not answer it is UNREACHABLE
    ib_matrix: str = "ring"  # ring | full
    depth: str | None = None  # quick | standard | full; None: each node's profile default (depth.default)
    dcgm_level: int | None = None  # --dcgm-level: overrides the depth's DCGM level


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[:limit] + " ..."


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(str(a) for a in argv)


def gpus_short(what: str, listed: Sequence[int], gpu_count: int) -> str | None:
    """``<what> lists 6 of 8 GPUs (missing: GPU6, GPU7)`` when an output lists fewer GPUs than the node has,
    else None. ``listed``: the indices it shows (``range(len(gpus))`` for the outputs that list GPUs in index
    order without printing it: nvidia-smi numbers the GPUs it sees). A GPU nobody read is not a healthy GPU."""
    if len(listed) >= gpu_count:
        return None
    seen = set(listed)
    missing = ", ".join(f"GPU{i}" for i in range(gpu_count) if i not in seen)
    return f"{what} lists {len(listed)} of {gpu_count} GPUs (missing: {missing})"


@dataclass
class NodeContext:
    node: Node
    profile: dict[str, Any]
    transport: Transport
    options: RunOptions
    _cache: dict[tuple[str, ...], CommandResult] = field(default_factory=dict, repr=False)
    _running: dict[tuple[str, ...], threading.Event] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    hung_on: str | None = None  # the command that timed out; later commands on this host are not started

    def run(self, argv: Sequence[str], timeout: float | None = None, cache: bool = True) -> CommandResult:
        key = tuple(str(a) for a in argv)
        if not cache:
            return self._run(key, timeout, store=False)
        while True:
            with self._lock:
                hit = self._cache.get(key)
                running = self._running.get(key) if hit is None else None
                if hit is None and running is None:
                    self._running[key] = mine = threading.Event()
                    break
            if hit is not None:
                return _whole(hit, key)
            # Another check started this command: wait for its result instead of running it twice (its
            # run ends, at the latest, with the command's timeout; if it stored nothing, try again).
            running.wait()
        try:
            return self._run(key, timeout, store=True)
        finally:
            with self._lock:
                del self._running[key]
            mine.set()

    def _run(self, key: tuple[str, ...], timeout: float | None, store: bool) -> CommandResult:
        """Run ``key`` on the host; ``store``: keep the result for later callers (under :meth:`run`'s claim)."""
        if self.hung_on is not None:
            # A host that let one command hang would make every later one wait for its timeout too.
            raise GatherError(
                f"not run: `{self.hung_on}` timed out earlier on this host", command=command_line(key)
            )
        result = self.transport.run(self.node, key, timeout or self.options.timeout)
        if result.unreachable:
            raise HostUnreachable(result.last_line() or "connection failed")
        if result.timed_out:
            self.hung_on = command_line(key)
        if store:
            with self._lock:
                self._cache[key] = result
        return _whole(result, key)

    def cached_outputs(self, program: str) -> list[str]:
        """stdout of the commands already run here whose argv contains ``program``."""
        with self._lock:
            return [r.stdout for argv, r in self._cache.items() if program in argv]

    def depth(self) -> tuple[str, dict[str, int]]:
        """The depth this run uses on this node and its settings (profile ``depth.levels``)."""
        name = self.options.depth or self.profile["depth"]["default"]
        return name, dict(self.profile["depth"]["levels"][name])

    def output(self, argv: Sequence[str], timeout: float | None = None, cache: bool = True) -> str:
        """stdout of a command that must succeed; anything else is a GatherError naming the command.

        ``cache=False`` for readings taken twice (counters before and after the load tests)."""
        return self.completed(argv, timeout, cache).stdout

    def completed(self, argv: Sequence[str], timeout: float | None = None, cache: bool = True) -> CommandResult:
        """The whole result (stderr too) of a command that must succeed, as :meth:`output` requires it: for a
        tool that says on stderr, exit 0, that it did not see everything (journalctl's permission hint)."""
        result = self.run(argv, timeout, cache=cache)
        if result.timed_out:
            raise GatherError(
                f"`{command_line(argv)}` timed out after {timeout or self.options.timeout:g}s",
                command=command_line(argv),
                partial_output=excerpt(result.stdout),
            )
        if result.rc != 0:
            raise GatherError(
                f"`{command_line(argv)}` {result.ended()}: {result.last_line()}",
                command=command_line(argv),
                stderr=excerpt(result.stderr),
            )
        return result

    def parsed(self, kind: str, argv: Sequence[str], timeout: float | None = None, cache: bool = True) -> Any:
        return parse_output(kind, self.output(argv, timeout, cache), command_line(argv))


def _whole(result: CommandResult, argv: Sequence[str]) -> CommandResult:
    """``result``, unless the transport truncated it at its cap: partial output is never
    judged (an XID past the cap would vanish silently), the check is an ERROR naming the command and the cap."""
    if result.truncated:
        cap = f"{OUTPUT_CAP_BYTES / 2**20:g} MiB"
        raise GatherError(
            f"`{command_line(argv)}` output over {cap}, truncated: not judged on partial output",
            command=command_line(argv),
            partial_output=excerpt(result.stdout),
        )
    return result


# The warnings of the parses one check's gather made (see noting_parse_warnings); None outside a gather.
_PARSE_WARNINGS: ContextVar[list[str] | None] = ContextVar("parse_warnings", default=None)


def parse_output(kind: str, text: str, command: str) -> Any:
    """Parse with the shared parsers; a ParseError becomes a GatherError with the offending excerpt. The
    parse's warnings (:func:`preflight.parsers.parse_warnings`) go to the gather noting them."""
    from preflight import parsers

    try:
        result = parsers.parse(kind, text)
    except parsers.ParseError as exc:
        raise GatherError(
            f"cannot parse `{command}` output: {exc}", command=command, output=excerpt(text)
        ) from None
    noted = _PARSE_WARNINGS.get()
    if noted is not None:
        noted += [f"`{command}` {warning}" for warning in parsers.parse_warnings(text, result)]
    return result


@contextmanager
def noting_parse_warnings() -> Iterator[list[str]]:
    """The warnings of every :func:`parse_output` made inside the block (in this thread), in order."""
    noted: list[str] = []
    token = _PARSE_WARNINGS.set(noted)
    try:
        yield noted
    finally:
        _PARSE_WARNINGS.reset(token)


def with_parse_warnings(results: list[CheckResult], warnings: Sequence[str]) -> list[CheckResult]:
    """``results`` judged on parses that read past something (a damaged row, an elision, a missing header):
    each carries the warnings as evidence ``parse_warnings``, and a PASS says in its reason that it was
    read with warnings, so that no verdict passes silently on facts that were not all there."""
    if not warnings:
        return results
    note = f" (read with {len(warnings)} parse warning{'s' if len(warnings) > 1 else ''})"
    return [replace(r, reason=r.reason + (note if r.verdict is Verdict.PASS else ""),
                    evidence={**r.evidence, "parse_warnings": list(warnings)}) for r in results]


@dataclass
class RackContext:
    rack: str
    nodes: list[NodeContext]  # the reachable nodes of the rack, in inventory order
    facts: dict[str, Any]  # node name -> what this check's gather() returned (or a GatherError)
    pool: Executor
    options: RunOptions

    def map(self, fn: Callable[[Any], Any], items: Sequence[Any]) -> list[Any]:
        return list(self.pool.map(fn, items))


class Check:
    """One area of the node: ``name`` is what ``--checks``/``--skip`` and the results use."""

    name: ClassVar[str]
    # node: run() per node; rack: gather() per node then run_rack() per rack; bracket: gather() per node with
    # the node checks ("before"), then finish() per node after the rack checks ("after" the load tests).
    scope: ClassVar[str] = "node"
    codes: ClassVar[dict[str, str]] = {}  # stable fault code -> what it means
    # A check that loads the GPUs or links (a bandwidth test, DCGM's diagnostic, NCCL) runs alone on its node,
    # after every reading: a reading taken during another check's load would judge that load (a throttle
    # counter, an idle link's generation), and two loads side by side would halve each other's bandwidth.
    loads_hardware: ClassVar[bool] = False
    # The checks whose cached outputs this one reads (``ctx.cached_outputs``, a cached argv): it runs after
    # them where they load the hardware; readings share a command's one run anyway.
    reads_outputs_of: ClassVar[tuple[str, ...]] = ()

    def run(self, ctx: NodeContext) -> list[CheckResult]:  # scope "node"
        """gather (the only place that runs commands), then the pure evaluate; a GatherError is ERROR. The
        results note the warnings of the parses the gather made (:func:`with_parse_warnings`)."""
        with noting_parse_warnings() as warnings:
            try:
                facts = self.gather(ctx)
            except GatherError as exc:
                return [self.error(ctx.node, exc)]
        return with_parse_warnings(self.evaluate(facts, ctx.profile, ctx.node), warnings)

    def evaluate(self, facts: Any, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        """Judge ``facts`` (what gather returned): pure, no command, no parsing."""
        raise NotImplementedError

    def gather(self, ctx: NodeContext) -> Any:
        """Run the commands and parse their outputs into facts (scope "rack": the per-node part, run with the
        node checks). A GatherError means the facts could not be had: the verdict is ERROR."""
        return None

    def run_rack(self, ctx: RackContext) -> list[CheckResult]:  # scope "rack"
        raise NotImplementedError

    def finish(self, ctx: NodeContext, before: Any) -> list[CheckResult]:  # scope "bracket"
        raise NotImplementedError

    # Helpers that fill in rack/node/check so evaluation code only states verdict, reason and evidence.
    def result(
        self, node: Node, verdict: Verdict, code: str, reason: str, iu: str | None = None, **evidence: Any
    ) -> CheckResult:
        return CheckResult(node.rack, node.name, iu, self.name, verdict, reason, {"code": code, **evidence})

    def outcome(
        self,
        node: Node,
        problems: list[tuple[Verdict, str, str]],
        ok_code: str,
        ok_reason: str,
        iu: str | None = None,
        **evidence: Any,
    ) -> CheckResult:
        """PASS with ``ok_reason`` when there are no problems, else the worst one (+N more), listing all."""
        if not problems:
            return self.result(node, Verdict.PASS, ok_code, ok_reason, iu=iu, **evidence)
        verdict, code, reason = verdict_of(problems)
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        return self.result(node, verdict, code, reason + more, iu=iu, problems=[p[2] for p in problems], **evidence)

    def error(self, node: Node, exc: GatherError, iu: str | None = None) -> CheckResult:
        """ERROR with code GATHER, or the code the gather named in its evidence (e.g. DCGM_NO_HOSTENGINE)."""
        evidence = dict(exc.evidence)
        code = evidence.pop("code", "GATHER")
        return self.result(node, Verdict.ERROR, code, exc.reason, iu=iu, **evidence)


def verdict_of(problems: list[tuple[Verdict, str, str]]) -> tuple[Verdict, str, str]:
    """The worst (verdict, code, reason) of a list of findings; FAIL before WARN."""
    for wanted in (Verdict.FAIL, Verdict.WARN):
        for verdict, code, reason in problems:
            if verdict is wanted:
                return verdict, code, reason
    raise ValueError("no problems")
