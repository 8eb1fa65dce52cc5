"""gpu_bandwidth: nvbandwidth copy-engine bandwidth per GPU against the SKU's floors.

Runs ``nvbandwidth -t host_to_device_memcpy_ce device_to_host_memcpy_ce device_to_device_memcpy_read_ce
-i <samples>``: the three testcases azurehpc-health-checks gates on, pinned by name so that a value means
the same thing on every host and nvbandwidth version (the SM-copy variants and bidirectional tests give
other numbers). ``samples`` comes from the depth (``depth.levels.<depth>.nvbandwidth_samples``).

Judgement (``evaluate``, pure): each GPU's host-to-device and device-to-host value >= the profile's
``gpu_bandwidth.h2d_min_gbps`` / ``d2h_min_gbps``; each device-to-device read pair >=
``d2d_read_min_gbps`` (null in the profile: reported, not gated). A testcase nvbandwidth waived or did
not print is a FAIL ``GPU_BW_MISSING`` (a PCIe/NVLink that cannot even be measured is not healthy).

Fault codes: GPU_BW_H2D, GPU_BW_D2H, GPU_BW_D2D, GPU_BW_MISSING, GPU_BW_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext
from preflight.parsers.nvbandwidth import NvBandwidthReport
from preflight.result import CheckResult, Verdict

H2D, D2H, D2D = "host_to_device_memcpy_ce", "device_to_host_memcpy_ce", "device_to_device_memcpy_read_ce"
TESTS = {H2D: ("GPU_BW_H2D", "h2d_min_gbps", "H2D"), D2H: ("GPU_BW_D2H", "d2h_min_gbps", "D2H"),
         D2D: ("GPU_BW_D2D", "d2d_read_min_gbps", "D2D read")}


# Budget per sample of the three testcases on 8 GPUs (56 device-to-device pairs): --timeout still applies
# when it is longer. An estimate with headroom (nvbandwidth documents no duration), not a measurement.
SECONDS_PER_SAMPLE = 30.0


def argv(samples: int) -> list[str]:
    return ["nvbandwidth", "-t", H2D, D2H, D2D, "-i", str(samples)]


class GpuBandwidth(Check):
    name = "gpu_bandwidth"
    loads_hardware = True
    codes = {
        "GPU_BW_H2D": "host-to-device copy bandwidth of a GPU below the floor",
        "GPU_BW_D2H": "device-to-host copy bandwidth of a GPU below the floor",
        "GPU_BW_D2D": "device-to-device read bandwidth of a GPU pair below the floor",
        "GPU_BW_MISSING": "nvbandwidth waived or did not print a pinned testcase",
    }

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        depth, settings = ctx.depth()
        samples = settings["nvbandwidth_samples"]
        timeout = max(ctx.options.timeout, SECONDS_PER_SAMPLE * samples)
        return {"report": ctx.parsed("nvbandwidth", argv(samples), timeout), "depth": depth, "samples": samples,
                "gpus": ctx.node.gpu_count}

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        report: NvBandwidthReport = facts["report"]
        cfg = profile["gpu_bandwidth"]
        problems: list[tuple[Verdict, str, str]] = []
        found: dict[str, Any] = {}
        for test, (code, key, label) in TESTS.items():
            floor = cfg[key]
            result = report.test(test)
            if result is None or result.waived:
                if test != D2D or floor is not None:
                    problems.append((Verdict.FAIL, "GPU_BW_MISSING",
                                     f"nvbandwidth {'waived' if result else 'did not run'} {test}"))
                continue
            values = {}
            for row, cells in result.rows.items():
                for column, value in zip(result.columns, cells, strict=True):
                    if value is None:
                        continue
                    where = f"GPU{column}" if test != D2D else f"GPU{row}<-GPU{column}"
                    values[where] = value
                    if floor is not None and value < floor:
                        problems.append((Verdict.FAIL, code, f"{label} {where} {value:g} GB/s < {floor:g}"))
            found[label] = {"min_gbps": min(values.values()) if values else None, "sum_gbps": result.sum_gbps,
                            "per_gpu": values}
            if test != D2D and len(values) < facts["gpus"]:
                problems.append((Verdict.FAIL, "GPU_BW_MISSING",
                                 f"{label}: nvbandwidth measured {len(values)} of {facts['gpus']} GPUs"))
        lows = {label: f["min_gbps"] for label, f in found.items() if f["min_gbps"] is not None}
        summary = ", ".join(f"{label} >= {v:g}" for label, v in lows.items())
        return [self.outcome(node, problems, "GPU_BW_OK", f"copy-engine bandwidth {summary} GB/s",
                             expected={k: cfg[k] for k in ("h2d_min_gbps", "d2h_min_gbps", "d2d_read_min_gbps")},
                             found=found, depth=facts["depth"], samples=facts["samples"])]


CHECK = GpuBandwidth()
