"""The node's clock offset from NTP, published with the scores so readers can judge score ages across nodes.

Read from ``chronyc tracking`` ("System time : 0.000012 seconds fast of NTP time"; fast = positive), at most
once a minute; None when chrony is not there.
"""

from __future__ import annotations

import re
import subprocess
import time

_SYSTEM_TIME = re.compile(
    r"^System time\s*:\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+) seconds (fast|slow) of NTP time", re.MULTILINE
)


def parse_system_time_offset(text: str) -> float | None:
    match = _SYSTEM_TIME.search(text)
    if not match:
        return None
    value = float(match.group(1))  # the pattern admits only what float() reads
    return value if match.group(2) == "fast" else -value


class ChronyOffset:
    def __init__(
        self, argv: tuple[str, ...] = ("chronyc", "tracking"), every_s: float = 60.0, clock=time.monotonic
    ):
        self.argv, self.every_s, self.clock = argv, every_s, clock
        self.value: float | None = None
        self.read_at: float | None = None

    def __call__(self) -> float | None:
        now = self.clock()
        if self.read_at is not None and now - self.read_at < self.every_s:
            return self.value
        self.read_at = now
        try:
            out = subprocess.run(self.argv, capture_output=True, text=True, timeout=1.0, check=False).stdout
        except (OSError, ValueError, subprocess.SubprocessError):  # ValueError: undecodable output
            self.value = None
            return None
        self.value = parse_system_time_offset(out)
        return self.value
