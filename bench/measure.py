"""What a bench reads about a process and the host it runs on: CPU time (``/proc/PID/stat``), sockets
(``/proc/PID/fd``), the hypervisor's steal (``/proc/stat``), and the percentile its tables print."""

from __future__ import annotations

import os
from pathlib import Path


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ticks(stat: Path = Path("/proc/stat")) -> list[int] | None:
    """The host's aggregate CPU time in ticks (user, nice, system, idle, iowait, irq, softirq, steal, ...), or
    None where /proc/stat has no such line."""
    try:
        fields = stat.read_text().split("\n", 1)[0].split()
    except OSError:
        return None
    return [int(v) for v in fields[1:]] if len(fields) > 8 and fields[0] == "cpu" else None


def steal_share(before: list[int] | None, after: list[int] | None) -> float | None:
    """The share of the host's CPU time between two :func:`cpu_ticks` readings that the hypervisor took."""
    if before is None or after is None:
        return None
    delta = [b - a for a, b in zip(before[:8], after[:8], strict=True)]  # guest time is inside user already
    return delta[7] / sum(delta) if sum(delta) > 0 else 0.0

def tcp_connections(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except OSError:
            pass
    return count


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, int(round(p / 100 * len(ordered))) - 1))] if ordered else float("nan")

