"""Parser for perftest clients: ``ib_write_lat``, ``ib_write_bw``, ``ib_read_*``, ``ib_send_*``.

Usage::

    from preflight.parsers import perftest
    result = perftest.parse(text)
    result.test                      # 'ib_write_lat'
    result.rows[-1].t_typical_us     # 1.05
    perftest.parse(bw_text).rows[-1].bw_avg, .bw_unit      # 392.41, 'Gb/sec'

Schema (``PerftestResult.to_json()``, the contract's ``perftest`` shape)::

    {"test": "ib_write_lat", "rows": [{"bytes": 2, "iterations": 1000, "t_min_us": 0.98, "t_max_us": 3.51,
      "t_typical_us": 1.02, "t_avg_us": 1.03, "t_stdev_us": 0.05, "p99_us": 1.21, "p999_us": 3.51}]}
    {"test": "ib_write_bw", "rows": [{"bytes": 65536, "iterations": 5000, "bw_peak": 392.95,
      "bw_avg": 392.41, "msg_rate_mpps": 0.748466, "bw_unit": "Gb/sec"}]}

Latency columns by version: old perftest (3.x, e.g. CentOS 7) prints ``t_min t_max t_typical``; 4.x and
later add ``t_avg t_stdev`` and the ``99% percentile`` / ``99.9% percentile`` columns; absent columns are
None (columns are matched by header name, not position). Bandwidth is in
``MB/sec`` by default and ``Gb/sec`` with ``--report_gbits``; ``bw_unit`` says which, as printed.

Real example (``ib_write_lat -d mlx5_0 -F r01n02``, ConnectX-7 NDR)::

    ---------------------------------------------------------------------------------------
                        RDMA_Write Latency Test
     Dual-port       : OFF          Device         : mlx5_0
     ...
    ---------------------------------------------------------------------------------------
     #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec]
     2       1000          0.98           3.51         1.02               1.03             0.05            1.21                    3.51
    ---------------------------------------------------------------------------------------

A run counts when its table is closed by the dashed line perftest prints after the last row; output
without a table (``Couldn't connect to ...``) or cut before that line raises ParseError naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, last_complete, last_nonblank, lines, to_number

_TITLE = re.compile(r"^\s*(RDMA_Write|RDMA_Read|Send|Atomic\s+\S+)\b.*\b(Latency|BW)\s+Test\s*$")
_TEST_NAMES = {"RDMA_Write": "write", "RDMA_Read": "read", "Send": "send", "Atomic": "atomic"}
_HEADER = re.compile(r"^\s*#bytes\s+#iterations\s")
_DASHES = re.compile(r"^\s*-{20,}\s*$")
# Latency header names in the order perftest prints them -> row field.
LATENCY_COLUMNS = (
    ("t_min[usec]", "t_min_us"), ("t_max[usec]", "t_max_us"), ("t_typical[usec]", "t_typical_us"),
    ("t_avg[usec]", "t_avg_us"), ("t_stdev[usec]", "t_stdev_us"), ("99% percentile[usec]", "p99_us"),
    ("99.9% percentile[usec]", "p999_us"),
)
_BW_UNIT = re.compile(r"BW[ _]peak\[([^\]]+)\]")


@dataclass(frozen=True)
class LatencyRow:
    bytes: int
    iterations: int
    t_min_us: float | None = None
    t_max_us: float | None = None
    t_typical_us: float | None = None
    t_avg_us: float | None = None
    t_stdev_us: float | None = None
    p99_us: float | None = None
    p999_us: float | None = None

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "iterations": self.iterations, "t_min_us": self.t_min_us,
                "t_max_us": self.t_max_us, "t_typical_us": self.t_typical_us, "t_avg_us": self.t_avg_us,
                "t_stdev_us": self.t_stdev_us, "p99_us": self.p99_us, "p999_us": self.p999_us}


@dataclass(frozen=True)
class BandwidthRow:
    bytes: int
    iterations: int
    bw_peak: float
    bw_avg: float
    msg_rate_mpps: float | None
    bw_unit: str  # "MB/sec" or "Gb/sec", as printed

    @property
    def bw_avg_gbps(self) -> float:
        """Average bandwidth in Gbit/s whatever the unit printed (perftest's MB is 2^20 bytes)."""
        if self.bw_unit == "Gb/sec":
            return self.bw_avg
        return self.bw_avg * 1048576 * 8 / 1e9

    def to_json(self) -> dict:
        return {"bytes": self.bytes, "iterations": self.iterations, "bw_peak": self.bw_peak,
                "bw_avg": self.bw_avg, "msg_rate_mpps": self.msg_rate_mpps, "bw_unit": self.bw_unit}


@dataclass(frozen=True)
class PerftestResult:
    test: str | None  # ib_write_lat, ib_read_bw, ...; None when the title block was not pasted
    kind: str  # "lat" or "bw"
    rows: list[LatencyRow] | list[BandwidthRow]
    device: str | None = None
    link_type: str | None = None

    def to_json(self) -> dict:
        return {"test": self.test, "rows": [row.to_json() for row in self.rows]}


def parse(text: str) -> PerftestResult:
    all_lines = lines(text)
    starts = _TITLE if any(_TITLE.match(line.text) for line in all_lines) else _HEADER
    runs: list[list[Line]] = [[]]
    for line in all_lines:
        if starts.match(line.text) and any(starts.match(item.text) for item in runs[-1]):
            runs.append([])
        runs[-1].append(line)
    return last_complete(runs, _parse_run)


def _parse_run(run: list[Line]) -> PerftestResult:
    test = device = link_type = None
    header: Line | None = None
    raw_rows: list[Line] = []
    closed = False
    for line in run:
        text = line.text
        if header is None:
            if title := _TITLE.match(text):
                operation = _TEST_NAMES[title.group(1).split()[0]]
                test = f"ib_{operation}_{'lat' if title.group(2) == 'Latency' else 'bw'}"
            elif _HEADER.match(text):
                header = line
            elif "Device" in text and device is None:
                device = _setting(text, "Device")
            if "Link type" in text:
                link_type = _setting(text, "Link type")
            continue
        if _DASHES.match(text):
            if raw_rows:
                closed = True
                break
            continue
        if text.strip() and text.split()[0].isdigit():
            raw_rows.append(line)
        # Other lines inside the table (warnings such as "Requested mtu is higher than active mtu") are
        # not rows and are skipped.
    if header is None:
        end = last_nonblank(run)
        raise ParseError(end.no, end.text, "no perftest result table (a line starting with #bytes #iterations)")
    if not closed:
        end = raw_rows[-1] if raw_rows else header
        raise ParseError(end.no, end.text, "perftest table ends before its closing dashed line")
    is_latency = "t_min" in header.text
    rows = [_latency_row(line, header) if is_latency else _bandwidth_row(line, header) for line in raw_rows]
    return PerftestResult(test, "lat" if is_latency else "bw", rows, device, link_type)


def _setting(text: str, name: str) -> str | None:
    match = re.search(re.escape(name) + r"\s*:\s*(\S+)", text)
    return match.group(1) if match else None


def _latency_row(line: Line, header: Line) -> LatencyRow:
    fields = [key for name, key in LATENCY_COLUMNS if name in header.text]
    tokens = line.text.split()
    if len(tokens) != 2 + len(fields):
        raise ParseError(line.no, line.text, f"latency row has {len(tokens)} values, expected {2 + len(fields)}")
    values = {key: float(to_number(token, line, key)) for key, token in zip(fields, tokens[2:], strict=True)}
    return LatencyRow(int(to_number(tokens[0], line, "#bytes")), int(to_number(tokens[1], line, "#iterations")),
                      **values)


def _bandwidth_row(line: Line, header: Line) -> BandwidthRow:
    unit = _BW_UNIT.search(header.text)
    if unit is None:
        raise ParseError(header.no, header.text, "bandwidth header without a BW peak[unit] column")
    has_rate = "MsgRate" in header.text
    tokens = line.text.split()
    expected = 5 if has_rate else 4
    if len(tokens) != expected:
        raise ParseError(line.no, line.text, f"bandwidth row has {len(tokens)} values, expected {expected}")
    return BandwidthRow(
        bytes=int(to_number(tokens[0], line, "#bytes")),
        iterations=int(to_number(tokens[1], line, "#iterations")),
        bw_peak=float(to_number(tokens[2], line, "BW peak")),
        bw_avg=float(to_number(tokens[3], line, "BW average")),
        msg_rate_mpps=float(to_number(tokens[4], line, "MsgRate")) if has_rate else None,
        bw_unit=unit.group(1),
    )
