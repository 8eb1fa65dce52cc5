"""nccl: all_reduce_perf per IU (``-g <iu size>`` on the IU's CUDA_VISIBLE_DEVICES) and per node (all GPUs).

Gates on the out-of-place bus bandwidth of the largest message size, which must be at least
``nccl.min_size_bytes`` (1 GiB): the sweep's "Avg bus bandwidth" averages in small, latency-bound sizes
and says little about the NVLink fabric. Any #wrong or out-of-bounds value -> FAIL; a run that did not
finish (crash, NCCL WARN, killed) -> FAIL with its last error line.

Fault codes: NCCL_BUSBW, NCCL_WRONG, NCCL_INCOMPLETE, NCCL_SIZE, NCCL_NO_THRESHOLD, NCCL_OK.
"""

from __future__ import annotations

from preflight.checks.base import Check, GatherError, NodeContext, command_line, excerpt, parse_output
from preflight.result import CheckResult, Verdict


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


class Nccl(Check):
    name = "nccl"
    codes = {
        "NCCL_BUSBW": "out-of-place busbw at the largest size below the profile's floor",
        "NCCL_WRONG": "#wrong or out-of-bounds values (data corruption)",
        "NCCL_INCOMPLETE": "the benchmark did not finish",
        "NCCL_SIZE": "the sweep never reached the gating size",
        "NCCL_NO_THRESHOLD": "the profile has no floor for this GPU count",
    }

    def run(self, ctx: NodeContext) -> list[CheckResult]:
        node = ctx.node
        runs: list[tuple[str | None, tuple[int, ...]]] = [(iu.id, iu.gpus) for iu in node.ius]
        if node.gpu_count > max((len(g) for _, g in runs), default=0):
            runs.append((None, tuple(range(node.gpu_count))))
        return [self._one(ctx, iu, gpus) for iu, gpus in runs]

    def _one(self, ctx: NodeContext, iu: str | None, gpus: tuple[int, ...]) -> CheckResult:
        node, cfg = ctx.node, ctx.profile["nccl"]
        argv = all_reduce_argv(gpus, cfg)
        floor = cfg["busbw_min_gbps"].get(len(gpus))
        expected = {"busbw_min_gbps": floor, "min_size_bytes": cfg["min_size_bytes"], "wrong": 0}
        try:
            result = ctx.run(argv)
        except GatherError as exc:
            return self.error(node, exc, iu=iu)
        try:
            if result.timed_out:
                return self.result(
                    node,
                    Verdict.FAIL,
                    "NCCL_INCOMPLETE",
                    f"all_reduce_perf -g {len(gpus)} timed out; last line: {result.last_line()}",
                    iu=iu,
                    command=command_line(argv),
                    expected=expected,
                )
            parsed = parse_output("nccl", result.stdout, command_line(argv))
        except GatherError as exc:
            if result.rc not in (0, None):  # crashed before printing anything parseable
                return self.result(
                    node,
                    Verdict.FAIL,
                    "NCCL_INCOMPLETE",
                    f"all_reduce_perf -g {len(gpus)} exited {result.rc}: {result.last_line()}",
                    iu=iu,
                    command=command_line(argv),
                    output=excerpt(result.stdout + result.stderr),
                )
            return self.error(node, exc, iu=iu)
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
        ev = {"command": command_line(argv), "expected": expected, "found": found}
        last_error = (parsed.errors[-1] if parsed.errors else "") or result.last_line()
        incomplete = self.result(
            node,
            Verdict.FAIL,
            "NCCL_INCOMPLETE",
            f"all_reduce_perf -g {len(gpus)} did not finish (exit {result.rc}): {last_error}",
            iu=iu,
            **ev,
        )
        if not parsed.complete:
            return incomplete
        # nccl-tests exits 1 after printing its results when values were wrong: NCCL_WRONG, not a crash.
        if wrong or (parsed.oob_values or 0):
            return self.result(
                node,
                Verdict.FAIL,
                "NCCL_WRONG",
                f"{wrong} wrong / {parsed.oob_values or 0} out-of-bounds values (data corruption)",
                iu=iu,
                **ev,
            )
        if result.rc != 0:
            return incomplete
        if largest is None or largest.size_bytes < cfg["min_size_bytes"]:
            return self.result(
                node,
                Verdict.FAIL,
                "NCCL_SIZE",
                f"largest size {found['size_bytes']} B < {cfg['min_size_bytes']} B",
                iu=iu,
                **ev,
            )
        if floor is None:
            return self.result(
                node,
                Verdict.WARN,
                "NCCL_NO_THRESHOLD",
                f"busbw {largest.oop_busbw_gbps:g} GB/s; profile has no floor for {len(gpus)} GPUs",
                iu=iu,
                **ev,
            )
        size = _human(largest.size_bytes)
        if largest.oop_busbw_gbps < floor:
            return self.result(
                node,
                Verdict.FAIL,
                "NCCL_BUSBW",
                f"busbw {largest.oop_busbw_gbps:g} GB/s at {size} < {floor:g} ({len(gpus)} GPUs)",
                iu=iu,
                **ev,
            )
        return self.result(
            node,
            Verdict.PASS,
            "NCCL_OK",
            f"busbw {largest.oop_busbw_gbps:g} GB/s at {size} >= {floor:g} ({len(gpus)} GPUs)",
            iu=iu,
            **ev,
        )


def _human(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


CHECK = Nccl()
