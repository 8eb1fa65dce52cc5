"""time_sync: chrony synchronised, |system time offset| under the profile's limit, leap status Normal.

``gather``: ``chronyc tracking`` (kind ``chrony``); ``evaluate`` (pure) judges the tracking report.

Fault codes: CLOCK_UNSYNCED, CLOCK_OFFSET, LEAP_STATUS, TIME_OK.
"""

from __future__ import annotations

from typing import Any

from cluster.model import Node
from preflight.checks.base import Check, NodeContext
from preflight.parsers.chrony import Tracking
from preflight.result import CheckResult, Verdict

TRACKING = ["chronyc", "tracking"]


class TimeSync(Check):
    name = "time_sync"
    codes = {
        "CLOCK_UNSYNCED": "chrony has no reference (stratum 0 / reference 00000000)",
        "CLOCK_OFFSET": "|system time offset| above the profile's max_offset_ms",
        "LEAP_STATUS": "leap status not Normal (e.g. 'Not synchronised')",
    }

    def gather(self, ctx: NodeContext) -> Tracking:
        return ctx.parsed("chrony", TRACKING)

    def evaluate(self, facts: Tracking, profile: dict[str, Any], node: Node) -> list[CheckResult]:
        tracking = facts
        limit_ms = profile["time_sync"]["max_offset_ms"]
        offset_ms = tracking.system_time_offset_s * 1000.0
        evidence = {
            "expected": {"max_offset_ms": limit_ms, "leap_status": "Normal"},
            "found": {
                "offset_ms": round(offset_ms, 6),
                "leap_status": tracking.leap_status,
                "reference": tracking.reference,
                "stratum": tracking.stratum,
            },
        }
        unsynced = tracking.stratum == 0 or str(tracking.reference).startswith("00000000")
        if unsynced:
            return [
                self.result(
                    node,
                    Verdict.FAIL,
                    "CLOCK_UNSYNCED",
                    f"chrony not synchronised (reference {tracking.reference})",
                    **evidence,
                )
            ]
        if tracking.leap_status != "Normal":
            return [
                self.result(
                    node, Verdict.FAIL, "LEAP_STATUS", f"leap status {tracking.leap_status}", **evidence
                )
            ]
        if abs(offset_ms) > limit_ms:
            direction = "fast" if offset_ms > 0 else "slow"
            return [
                self.result(
                    node,
                    Verdict.FAIL,
                    "CLOCK_OFFSET",
                    f"clock {abs(offset_ms):.3f} ms {direction} of NTP, limit {limit_ms:g} ms",
                    **evidence,
                )
            ]
        return [
            self.result(
                node,
                Verdict.PASS,
                "TIME_OK",
                f"offset {offset_ms:+.3f} ms via {tracking.reference}",
                **evidence,
            )
        ]


CHECK = TimeSync()
