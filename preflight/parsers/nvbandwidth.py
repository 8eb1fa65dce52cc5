"""Parser for NVIDIA nvbandwidth (``nvbandwidth -t <testcase> ...``): one bandwidth matrix per testcase.

Usage::

    report = nvbandwidth.parse(text)
    report.test("host_to_device_memcpy_ce").rows   # {0: [55.1, 55.2, ...]} (row -> one value per column)

Schema (kind ``nvbandwidth``)::

    {"version": "v0.6", "driver_version": "550.54.15",
     "tests": [{"name": "host_to_device_memcpy_ce", "title": "memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)",
                "columns": [0, 1], "rows": {"0": [55.1, 55.2]}, "sum_gbps": 110.3, "waived": false}]}

Real example (nvbandwidth v0.2, NVIDIA/nvbandwidth#15; the same layout in v0.6-v0.8)::

    Running host_to_device_memcpy_ce.
    memcpy CE CPU(row) -> GPU(column) bandwidth (GB/s)
              0         1         2         3         4         5         6         7
    0     25.50     24.26     23.90     26.30     26.28     26.38     26.09     26.31

    SUM host_to_device_memcpy_ce 205.04

``N/A`` cells (a GPU to itself in device-to-device tests) are None. A testcase nvbandwidth skips prints
``Waived:`` after ``Running ...`` and has no matrix (``waived: true``). Errors: no ``Running`` line; a
testcase whose matrix or ``SUM`` line never came (the run was cut or crashed: the last line is named);
a row with a different number of cells than the column header; a cell that is not a number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parsers.common import Line, ParseError, first_nonblank, last_nonblank, lines, to_float

_RUNNING = re.compile(r"^Running (\S+?)\.?\s*$")
_TITLE = re.compile(r"^memcpy .*bandwidth \(GB/s\)\s*$")
_COLUMNS = re.compile(r"^\s*\d+(\s+\d+)*\s*$")
_ROW = re.compile(r"^\s*(\d+)\s+(\S.*)$")
_SUM = re.compile(r"^SUM (\S+) ([0-9.]+)\s*$")
_VERSION = re.compile(r"^nvbandwidth Version: (\S+)")
_DRIVER = re.compile(r"^Driver Version: (\S+)")


@dataclass
class BandwidthTest:
    name: str
    title: str | None = None
    columns: list[int] = field(default_factory=list)
    rows: dict[int, list[float | None]] = field(default_factory=dict)
    sum_gbps: float | None = None
    waived: bool = False

    def to_json(self) -> dict:
        return {"name": self.name, "title": self.title, "columns": self.columns,
                "rows": {str(k): v for k, v in self.rows.items()}, "sum_gbps": self.sum_gbps, "waived": self.waived}


@dataclass(frozen=True)
class NvBandwidthReport:
    tests: list[BandwidthTest]
    version: str | None
    driver_version: str | None

    def test(self, name: str) -> BandwidthTest | None:
        return next((t for t in self.tests if t.name == name), None)

    def to_json(self) -> dict:
        return {"version": self.version, "driver_version": self.driver_version,
                "tests": [t.to_json() for t in self.tests]}


def parse(text: str) -> NvBandwidthReport:
    all_lines = lines(text)
    tests: list[tuple[Line, BandwidthTest]] = []
    version = driver = None
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped:
            continue
        if m := _VERSION.match(stripped):
            version = m.group(1)
        elif m := _DRIVER.match(stripped):
            driver = m.group(1)
        elif m := _RUNNING.match(stripped):
            tests.append((line, BandwidthTest(m.group(1))))
        elif not tests:
            continue  # the banner: CUDA versions, device list, notes
        elif stripped.startswith("Waived"):
            tests[-1][1].waived = True
        elif _TITLE.match(stripped):
            tests[-1][1].title = stripped
        elif (test := tests[-1][1]).title and not test.columns and _COLUMNS.match(stripped):
            test.columns = [int(c) for c in stripped.split()]
        elif m := _SUM.match(stripped):
            test.sum_gbps = to_float(m.group(2), line, "SUM")
        elif test.columns and (m := _ROW.match(line.text)):
            cells = m.group(2).split()
            if len(cells) != len(test.columns):
                raise ParseError(line.no, line.text, f"row {m.group(1)} of {test.name} has {len(cells)} cells "
                                                     f"for {len(test.columns)} columns")
            test.rows[int(m.group(1))] = [None if c == "N/A" else to_float(c, line, "bandwidth") for c in cells]
        # anything else (the closing NOTE lines, a CUDA warning) is not part of a matrix
    if not tests:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no nvbandwidth output (a 'Running <testcase>.' line)")
    end = last_nonblank(all_lines)
    for _line, test in tests:
        if not test.waived and (not test.rows or test.sum_gbps is None):
            raise ParseError(end.no, end.text, f"output ends before the results of {test.name}")
    return NvBandwidthReport([t for _, t in tests], version, driver)
