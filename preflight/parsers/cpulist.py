"""Parser (and the one formatter) for the kernel's CPU list format: ``0-47,96-143``.

Usage::

    from preflight.parsers import cpulist
    cpulist.parse("0-47,96-143\\n").cpus          # (0, 1, ..., 47, 96, ..., 143)
    cpulist.cpus_of("0-47 96-143", line)         # the same list inside another tool's value (systemctl)
    cpulist.format_cpus({0, 1, 2, 5})            # '0-2,5'

Schema (``CpuList.to_json()``, kind ``cpulist``: ``cat /sys/devices/system/node/node<N>/cpulist``)::

    {"cpus": [0, 1, 2, 3], "cpulist": "0-3", "count": 4}

The format is the kernel's ``bitmap_list_string()`` (lib/vsprintf.c, printed by ``%*pbl``; documented in
Documentation/ABI/stable/sysfs-devices-node and Documentation/admin-guide/cputopology.rst): ranges
``a-b`` and single CPUs joined by commas, ascending, one line. ``systemctl show`` prints the same sets
with spaces between the ranges (systemd's ``cpu_set_to_range_string()``); both separators are read.

Real example (HGX H100, dual Xeon 8480+, 56 cores x 2 threads per socket, NUMA node 1)::

    56-111,168-223

A CPU-less NUMA node (GPU memory of a GH200, CXL memory) prints an empty line: its file is a single
``\\n`` and parses to no CPUs. No output at all, a range running backwards (``47-0``), a token that is
not a number and a second non-blank line are ParseErrors naming the line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, only_line

_TOKEN = re.compile(r"^(\d+)(?:-(\d+))?$")
# No real machine has more; a bigger number is a corrupted token, not a CPU (and would cost a huge range).
MAX_CPU = 1 << 16


@dataclass(frozen=True)
class CpuList:
    cpus: tuple[int, ...]

    def to_json(self) -> dict:
        return {"cpus": list(self.cpus), "cpulist": format_cpus(self.cpus), "count": len(self.cpus)}


def cpus_of(text: str, line: Line) -> frozenset[int]:
    """The CPUs of one list value (commas or spaces between ranges); ParseError naming ``line`` if bad."""
    cpus: set[int] = set()
    for token in text.replace(",", " ").split():
        match = _TOKEN.match(token)
        if not match:
            raise ParseError(line.no, line.text, f"CPU list token {token!r} is not N or N-M")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low or high >= MAX_CPU:
            raise ParseError(line.no, line.text, f"CPU range {token!r} is not ascending below {MAX_CPU}")
        cpus.update(range(low, high + 1))
    return frozenset(cpus)


def format_cpus(cpus: Iterable[int]) -> str:
    """Kernel cpulist format of a set of CPUs: ``0-47,96-143`` ('' for none)."""
    ordered = sorted(set(cpus))
    ranges: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        ranges.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(ranges)


def parse(text: str) -> CpuList:
    if text in ("\n", "\r\n"):
        return CpuList(())  # the kernel's empty bitmap: a NUMA node without CPUs
    line = only_line(text, "CPU list", "0-47,96-143")
    if " " in line.text.strip():  # the sysfs file never has spaces (that is systemctl's spelling)
        raise ParseError(line.no, line.text, "a kernel cpulist separates ranges with commas, not spaces")
    return CpuList(tuple(sorted(cpus_of(line.text, line))))
