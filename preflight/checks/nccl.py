"""nccl: all_reduce_perf per IU (``-g <iu size>`` on the IU's CUDA_VISIBLE_DEVICES) and per node (all GPUs).

Gates on the out-of-place bus bandwidth of the largest message size, which must be at least
``nccl.min_size_bytes`` (1 GiB): the sweep's "Avg bus bandwidth" averages in small, latency-bound sizes
and says little about the NVLink fabric. Any #wrong or out-of-bounds value -> FAIL; a run that did not
finish (crash, NCCL WARN, killed) -> FAIL with its last error line.

``gather`` runs the benchmarks and parses what they printed (kind ``nccl``); ``evaluate`` (pure) judges
each run from its facts: exit status, timeout, parse result.

Fault codes: NCCL_BUSBW, NCCL_WRONG, NCCL_INCOMPLETE, NCCL_SIZE, NCCL_NO_THRESHOLD, NCCL_OK.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, command_line, excerpt, parse_output
from preflight.parsers.nccl import NcclResult
from preflight.result import CheckResult, Verdict
from preflight.transport import how_it_ended


def all_reduce_argv(gpus: tuple[int, ...], nccl_cfg: dict) -> list[str]:
    # `env` sets CUDA_VISIBLE_DEVICES inside the argv itself, so it needs no shell on either transport.
    return [
        "env",
        f"CUDA_VISIBLE_DEVICES={','.join(str(g) for g in gpus)}",
        "all_reduce_perf",
        "-b",
        str(nccl_cfg["min_size_bytes"]),
        "-e",
        str(nccl_cfg["max_size"]),
        "-f",
        "2",
        "-g",
        str(len(gpus)),
        "-c",
        "1",
    ]


@dataclass(frozen=True)
class NcclRun:
    """One all_reduce_perf run: what came back and, where it could be read, its parse."""

    iu: str | None  # None: the whole-node run
    gpus: tuple[int, ...]
    argv: tuple[str, ...]
    rc: int | None = None
    timed_out: bool = False
    last_line: str = ""
    output: str = ""  # excerpt of stdout + stderr, for a run that crashed before printing results
    parsed: NcclResult | None = None
    error: GatherError | None = None  # the command could not run, or its output could not be read


class Nccl(Check):
    name = "nccl"
    loads_hardware = True
    codes = {
        "NCCL_BUSBW": "out-of-place busbw at the largest size below the profile's floor",
        "NCCL_WRONG": "#wrong or out-of-bounds values (data corruption)",
        "NCCL_INCOMPLETE": "the benchmark did not finish",
        "NCCL_SIZE": "the sweep never reached the gating size",
        "NCCL_NO_THRESHOLD": "the profile has no floor for this GPU count",
    }

    def gather(self, ctx: NodeContext) -> list[NcclRun]:
        node = ctx.node
        runs: list[tuple[str | None, tuple[int, ...]]] = [(iu.id, iu.gpus) for iu in node.ius]
        if node.gpu_count > max((len(g) for _, g in runs), default=0):
            runs.append((None, tuple(range(node.gpu_count))))
        return [self._run(ctx, iu, gpus) for iu, gpus in runs]

    def _run(self, ctx: NodeContext, iu: str | None, gpus: tuple[int, ...]) -> NcclRun:
        argv = tuple(all_reduce_argv(gpus, ctx.profile["nccl"]))
        try:
            result = ctx.run(argv)
        except GatherError as exc:
            return NcclRun(iu, gpus, argv, error=exc)
        facts = NcclRun(iu, gpus, argv, result.rc, result.timed_out, result.last_line(),
                        excerpt(result.stdout + result.stderr))
        if result.timed_out:
            return facts
        try:
            return replace(facts, parsed=parse_output("nccl", result.stdout, command_line(argv)))
        except GatherError as exc:
            return replace(facts, error=exc)

    def evaluate(self, facts: list[NcclRun], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        return [self._one(run, profile["nccl"], node) for run in facts]

    def _one(self, run: NcclRun, cfg: dict[str, Any], node: Node) -> CheckResult:
        iu, gpus, command = run.iu, run.gpus, command_line(run.argv)
        floor = cfg["busbw_min_gbps"].get(len(gpus))
        expected = {"busbw_min_gbps": floor, "min_size_bytes": cfg["min_size_bytes"], "wrong": 0}
        if run.timed_out:
            return self.result(node, Verdict.FAIL, "NCCL_INCOMPLETE",
                               f"all_reduce_perf -g {len(gpus)} timed out; last line: {run.last_line}",
                               iu=iu, command=command, expected=expected)
        if run.parsed is None:
            if run.error is not None and run.rc not in (0, None):  # crashed before printing anything parseable
                return self.result(node, Verdict.FAIL, "NCCL_INCOMPLETE",
                                   f"all_reduce_perf -g {len(gpus)} {how_it_ended(run.rc)}: {run.last_line}",
                                   iu=iu, command=command, output=run.output)
            return self.error(node, run.error or GatherError("no nccl result was read"), iu=iu)
        parsed = run.parsed
        rows = [r for r in parsed.rows if r.oop_busbw_gbps is not None]
        largest = max(rows, key=lambda r: r.size_bytes) if rows else None
        wrong = sum(int(w or 0) for r in parsed.rows for w in (r.oop_wrong, r.ip_wrong))
        found = {
            "size_bytes": largest.size_bytes if largest else None,
            "busbw_gbps": largest.oop_busbw_gbps if largest else None,
            "wrong": wrong,
            "oob_values": parsed.oob_values,
            "avg_busbw_gbps": parsed.avg_busbw_gbps,
            "complete": parsed.complete,
        }
        ev = {"command": command, "expected": expected, "found": found}
        last_error = (parsed.errors[-1] if parsed.errors else "") or run.last_line
        incomplete = self.result(node, Verdict.FAIL, "NCCL_INCOMPLETE",
                                 f"all_reduce_perf -g {len(gpus)} did not finish (exit {run.rc}): {last_error}",
                                 iu=iu, **ev)
        if not parsed.complete:
            return incomplete
        # nccl-tests exits 1 after printing its results when values were wrong: NCCL_WRONG, not a crash.
        if wrong or (parsed.oob_values or 0):
            return self.result(node, Verdict.FAIL, "NCCL_WRONG",
                               f"{wrong} wrong / {parsed.oob_values or 0} out-of-bounds values (data corruption)",
                               iu=iu, **ev)
        if run.rc != 0:
            return incomplete
        if largest is None or largest.size_bytes < cfg["min_size_bytes"]:
            return self.result(node, Verdict.FAIL, "NCCL_SIZE",
                               f"largest size {found['size_bytes']} B < {cfg['min_size_bytes']} B", iu=iu, **ev)
        if floor is None:
            return self.result(node, Verdict.WARN, "NCCL_NO_THRESHOLD",
                               f"busbw {largest.oop_busbw_gbps:g} GB/s; profile has no floor for {len(gpus)} GPUs",
                               iu=iu, **ev)
        size = _human(largest.size_bytes)
        if largest.oop_busbw_gbps < floor:
            return self.result(node, Verdict.FAIL, "NCCL_BUSBW",
                               f"busbw {largest.oop_busbw_gbps:g} GB/s at {size} < {floor:g} ({len(gpus)} GPUs)",
                               iu=iu, **ev)
        return self.result(node, Verdict.PASS, "NCCL_OK",
                           f"busbw {largest.oop_busbw_gbps:g} GB/s at {size} >= {floor:g} ({len(gpus)} GPUs)",
                           iu=iu, **ev)


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


CHECK = Nccl()
