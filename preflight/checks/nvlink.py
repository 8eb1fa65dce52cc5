"""nvlink: every NVLink of every GPU up at the expected speed, and no link erroring during the load tests.

A bracket check: ``gather`` runs with the node checks, before gpu_bandwidth, dcgm_diag and nccl load the
fabric (``nvidia-smi nvlink -s`` and a first ``nvidia-smi nvlink -e``); ``finish`` runs after the rack
checks and reads ``-e`` again. Counters are cumulative since the driver loaded, so only what grew while
preflight ran is judged: a link that is up but erroring under load FAILs, old history does not.

Judgement (``evaluate``, pure): fewer active links than ``gpu.nvlink_min`` -> FAIL ``NVLINK_INACTIVE``
(azurehpc check_nvlink_status: any inactive link fails); an active link slower than ``nvlink.speed_gbps``
-> FAIL ``NVLINK_SPEED``; replay / recovery errors grown by more than ``nvlink.replay_max`` /
``recovery_max`` -> FAIL ``NVLINK_REPLAY`` / ``NVLINK_RECOVERY``; CRC errors (``crc``, or ``data_crc`` +
``flit_crc`` on older drivers) growing faster than ``nvlink.crc_max_per_s`` -> FAIL ``NVLINK_CRC``; a
``-e`` reading that lists fewer GPUs than the node has -> FAIL ``NVLINK_COUNTERS_MISSING`` naming them
(``-s`` listing fewer: ``NVLINK_INACTIVE``).

Fault codes: NVLINK_INACTIVE, NVLINK_SPEED, NVLINK_REPLAY, NVLINK_RECOVERY, NVLINK_CRC, NVLINK_COUNTERS_MISSING,
NVLINK_OK.
"""

from __future__ import annotations

import time
from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, GatherError, NodeContext, gpus_short
from preflight.parsers.nvlink import NvLinkReport
from preflight.result import CheckResult, Verdict

STATUS = ["nvidia-smi", "nvlink", "-s"]
ERRORS = ["nvidia-smi", "nvlink", "-e"]
SPEED_TOLERANCE = 0.99  # nvidia-smi prints the speed rounded to 3 decimals
_CRC = ("crc", "data_crc", "flit_crc")


def counter_deltas(before: NvLinkReport, after: NvLinkReport) -> dict[tuple[int, int], dict[str, int]]:
    """(gpu, link) -> counter -> growth between the two readings (counters N/A in either are left out)."""
    deltas: dict[tuple[int, int], dict[str, int]] = {}
    for gpu in after.gpus:
        earlier = before.gpu(gpu.index)
        old = {link.link: link.counters for link in earlier.links} if earlier else {}
        for link in gpu.links:
            grown = {}
            for name, value in link.counters.items():
                start = old.get(link.link, {}).get(name)
                if value is not None and start is not None:
                    grown[name] = value - start
            deltas[(gpu.index, link.link)] = grown
    return deltas


class NvLinkCheck(Check):
    name = "nvlink"
    scope = "bracket"
    codes = {
        "NVLINK_INACTIVE": "a GPU has fewer active NVLinks than the profile's gpu.nvlink_min",
        "NVLINK_SPEED": "an active NVLink runs below the profile's speed",
        "NVLINK_REPLAY": "replay errors grew on a link during the load tests",
        "NVLINK_RECOVERY": "recovery errors grew on a link during the load tests",
        "NVLINK_CRC": "CRC errors grew faster than the profile allows during the load tests",
        "NVLINK_COUNTERS_MISSING": "nvidia-smi nvlink -e lists fewer GPUs than the node has (their errors unread)",
    }

    def gather(self, ctx: NodeContext) -> dict[str, Any]:
        return {"status": ctx.parsed("nvlink-status", STATUS),
                "before": ctx.parsed("nvlink-errors", ERRORS, cache=False), "t0": time.monotonic()}

    def finish(self, ctx: NodeContext, before: Any) -> list[CheckResult]:
        if isinstance(before, GatherError):
            return [self.error(ctx.node, before)]
        try:
            after = ctx.parsed("nvlink-errors", ERRORS, cache=False)
        except GatherError as exc:
            return [self.error(ctx.node, exc)]
        facts = {**before, "after": after, "elapsed_s": max(time.monotonic() - before["t0"], 1e-3)}
        return self.evaluate(facts, ctx.profile, ctx.node)

    def evaluate(self, facts: dict[str, Any], profile: dict[str, Any], node: Node) -> list[CheckResult]:
        cfg, links_min = profile["nvlink"], profile["gpu"]["nvlink_min"]
        status: NvLinkReport = facts["status"]
        problems: list[tuple[Verdict, str, str]] = []
        active: dict[int, int] = {}
        for gpu in status.gpus:
            up = [link for link in gpu.links if link.active]
            active[gpu.index] = len(up)
            if len(up) < links_min:
                down = [str(link.link) for link in gpu.links if not link.active]
                problems.append((Verdict.FAIL, "NVLINK_INACTIVE", f"GPU{gpu.index}: {len(up)} of {links_min} "
                                 f"NVLinks active (inactive: {', '.join(down) or 'not listed'})"))
            slow = [link for link in up if link.speed_gbps is not None
                    and link.speed_gbps < cfg["speed_gbps"] * SPEED_TOLERANCE]
            if slow:
                problems.append((Verdict.FAIL, "NVLINK_SPEED", f"GPU{gpu.index} link {slow[0].link} at "
                                 f"{slow[0].speed_gbps:g} GB/s < {cfg['speed_gbps']:g}" +
                                 (f" (+{len(slow) - 1} links)" if len(slow) > 1 else "")))
        if short := gpus_short("nvidia-smi nvlink -s", [g.index for g in status.gpus], node.gpu_count):
            problems.append((Verdict.FAIL, "NVLINK_INACTIVE", short))
        for when in ("before", "after"):
            counters: NvLinkReport = facts[when]
            if short := gpus_short(f"nvidia-smi nvlink -e {when} the load tests", [g.index for g in counters.gpus],
                                   node.gpu_count):
                problems.append((Verdict.FAIL, "NVLINK_COUNTERS_MISSING", short))
        grown = {}
        for (gpu, link), deltas in counter_deltas(facts["before"], facts["after"]).items():
            crc = sum(deltas.get(name, 0) for name in _CRC)
            rate = crc / facts["elapsed_s"]
            where = f"GPU{gpu} link {link}"
            if any(deltas.values()):
                grown[where] = deltas
            if deltas.get("replay", 0) > cfg["replay_max"]:
                problems.append((Verdict.FAIL, "NVLINK_REPLAY", f"{where}: +{deltas['replay']} replay errors"))
            if deltas.get("recovery", 0) > cfg["recovery_max"]:
                problems.append((Verdict.FAIL, "NVLINK_RECOVERY", f"{where}: +{deltas['recovery']} recovery errors"))
            if rate > cfg["crc_max_per_s"]:
                problems.append((Verdict.FAIL, "NVLINK_CRC", f"{where}: {rate:.0f} CRC errors/s"))
        ok = f"{len(status.gpus)} GPUs x {min(active.values(), default=0)} NVLinks active, no errors during the run"
        return [self.outcome(node, problems, "NVLINK_OK", ok,
                             expected={"links_per_gpu": links_min, "speed_gbps": cfg["speed_gbps"],
                                       "replay_max": cfg["replay_max"], "recovery_max": cfg["recovery_max"],
                                       "crc_max_per_s": cfg["crc_max_per_s"]},
                             found={"active_links": active, "errors_grown": grown,
                                    "window_s": round(facts["elapsed_s"], 1)})]


CHECK = NvLinkCheck()
