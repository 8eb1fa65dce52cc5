"""Parser for NVIDIA nccl-tests (``all_reduce_perf``, ``all_gather_perf``, ``reduce_scatter_perf``,
``broadcast_perf``, ``reduce_perf``, ``alltoall_perf``, ``sendrecv_perf``, ...).

Usage::

    from preflight.parsers import nccl
    result = nccl.parse(text)
    result.complete                     # printed "Avg bus bandwidth"
    result.largest_row().oop_busbw_gbps # the number preflight gates on, not the sweep average
    result.wrong_total(), result.oob_values, result.errors

Schema (``NcclResult.to_json()``, the contract's ``nccl`` shape)::

    {"test": "all_reduce_perf", "complete": true,
     "rows": [{"size_bytes": 8, "count": 2, "type": "float", "redop": "sum", "root": -1,
       "oop_time_us": 10.1, "oop_algbw_gbps": 0.0, "oop_busbw_gbps": 0.0, "oop_wrong": 0,
       "ip_time_us": 9.8, "ip_algbw_gbps": 0.0, "ip_busbw_gbps": 0.0, "ip_wrong": 0}],
     "oob_values": 0, "avg_busbw_gbps": 12.3, "errors": ["..."]}

Formats:

- current nccl-tests: ``root`` and ``#wrong`` columns; recent releases add ``# Collective test
  starting/concluded: <name>`` lines, from which ``test`` is read (other outputs name the test only in
  a pasted command line, else ``test`` is None).
- older nccl-tests (outputs seen up to 2022): no ``root`` column (``root`` None) and an ``error`` column
  with the maximum error as a float (``0e+00``, ``1e-07``); it maps to ``*_wrong`` as printed.
- ``#wrong`` is ``N/A`` with ``-c 0`` (no validation) -> None; tests without a reduction print ``none``
  as redop (some builds leave it blank -> None).
- Launcher prefixes (``[1,0]<stdout>:`` from ``mpirun --tag-output``, ``0: `` from ``srun -l``) are
  stripped; NCCL INFO/WARN lines interleaved with the table are skipped, WARN lines kept in ``errors``.

``complete`` means the run printed its ``Avg bus bandwidth`` line; wrong values and out-of-bounds counts
are reported, not folded into it. A crashed run (``Test NCCL failure``, MPI/srun abort) is returned with
``complete: false`` and its error lines. Of several runs in one paste the last complete one is returned
(else the last one). Text with no nccl-tests output, or a row cut short, raises ParseError.

Real example (8x H100 SXM, single node, abridged)::

    # nThread 1 nGpus 8 minBytes 8 maxBytes 17179869184 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
    #
    #                                                              out-of-place                       in-place
    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
    #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     17179869184    4294967296     float     sum      -1    62951  272.91  477.59      0    62890  273.17  478.05      0
    # Out of bounds values : 0 OK
    # Avg bus bandwidth    : 165.034
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from preflight.parsers.common import Line, ParseError, first_nonblank, lines, optional

_COLLECTIVE = re.compile(r"^#?\s*Collective test (starting|concluded):\s*(\S+)")
_NTHREAD = re.compile(r"^#?\s*nThread\s+\d+\s+nGpus\s+\d+")
_COLUMNS = re.compile(r"^#?\s*size\s+count\s+type\s+")
_OOB = re.compile(r"^#?\s*Out of bounds values\s*:\s*(\d+)\s*(\S*)")
_AVG = re.compile(r"^#?\s*Avg bus bandwidth\s*:\s*(\S+)")
_COMMAND = re.compile(r"\b(\w+_perf)\b")
_ERROR = re.compile(
    r"NCCL WARN|Test NCCL failure|Test CUDA failure|Cuda failure|CUDA failure|Test failure|FAILED"
    r"|NCCL error|srun: error|exited on signal|Segmentation fault|Bus error|MPI_ABORT|terminated by signal"
)
_TYPES = frozenset({"int8", "uint8", "int32", "uint32", "int64", "uint64", "half", "float", "double",
                    "bfloat16", "fp8_e4m3", "fp8_e5m2", "int", "char"})


@dataclass(frozen=True)
class NcclRow:
    size_bytes: int
    count: int
    type: str
    redop: str | None
    root: int | None
    oop_time_us: float | None
    oop_algbw_gbps: float | None
    oop_busbw_gbps: float | None
    oop_wrong: int | float | None
    ip_time_us: float | None
    ip_algbw_gbps: float | None
    ip_busbw_gbps: float | None
    ip_wrong: int | float | None

    def to_json(self) -> dict:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class NcclResult:
    test: str | None
    complete: bool
    rows: list[NcclRow] = field(default_factory=list)
    oob_values: int | None = None
    avg_busbw_gbps: float | None = None
    errors: list[str] = field(default_factory=list)
    n_gpus: int | None = None  # from the "# nThread 1 nGpus 8" header

    def largest_row(self) -> NcclRow | None:
        return max(self.rows, key=lambda row: row.size_bytes) if self.rows else None

    def wrong_total(self) -> float:
        """Sum of every #wrong (or old-format error) value printed; N/A counts as 0."""
        return sum(value or 0 for row in self.rows for value in (row.oop_wrong, row.ip_wrong))

    def to_json(self) -> dict:
        return {"test": self.test, "complete": self.complete, "rows": [row.to_json() for row in self.rows],
                "oob_values": self.oob_values, "avg_busbw_gbps": self.avg_busbw_gbps,
                "errors": list(self.errors)}


def parse(text: str) -> NcclResult:
    all_lines = lines(text)
    results = [_parse_run(run) for run in _runs(all_lines)]
    useful = [result for result in results if result is not None]
    if not useful:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no nccl-tests output (no '# nThread' header, table or Avg line)")
    complete = [result for result in useful if result.complete]
    return complete[-1] if complete else useful[-1]


def _runs(all_lines: list[Line]) -> list[list[Line]]:
    """A run starts at "# Collective test starting:" (newer nccl-tests) or at its "# nThread" header; a
    "starting" line followed by its own nThread header is one run."""
    runs: list[list[Line]] = [[]]
    has_header = has_start = False
    for line in all_lines:
        collective = _COLLECTIVE.match(line.text)
        starting = bool(collective and collective.group(1) == "starting")
        nthread = bool(_NTHREAD.match(line.text))
        if (starting and (has_header or has_start)) or (nthread and has_header):
            # The command line pasted just above a header belongs to the run it started.
            carried: list[Line] = []
            while runs[-1] and (not runs[-1][-1].text.strip() or _is_command(runs[-1][-1].text)):
                carried.insert(0, runs[-1].pop())
            runs.append(carried)
            has_header = has_start = False
        has_header = has_header or nthread
        has_start = has_start or starting
        runs[-1].append(line)
    return runs


def _is_command(text: str) -> bool:
    stripped = text.strip()
    return not stripped.startswith("#") and bool(_COMMAND.search(stripped)) and not _ERROR.search(stripped)


def _parse_run(run: list[Line]) -> NcclResult | None:
    """None when the run holds nothing from nccl-tests."""
    test = n_gpus = oob = avg = None
    complete = False
    header: Line | None = None
    rows: list[NcclRow] = []
    errors: list[str] = []
    marker = False
    for line in run:
        text = line.text
        stripped = text.strip()
        if not stripped:
            continue
        if match := _COLLECTIVE.match(stripped):
            test, marker = match.group(2), True
        elif match := _NTHREAD.match(stripped):
            marker = True
            words = stripped.split()
            after = words.index("nGpus") + 1 if "nGpus" in words else len(words)
            if after >= len(words) or not words[after].isdigit():  # else int()/IndexError (found by fuzzing)
                raise ParseError(line.no, line.text, "nGpus is not followed by a number")
            n_gpus = int(words[after])
        elif _COLUMNS.match(stripped):
            header, marker = line, True
        elif match := _OOB.match(stripped):
            oob, marker = int(match.group(1)), True
            if match.group(2) == "FAILED":
                errors.append(stripped)
        elif match := _AVG.match(stripped):
            complete = True
            avg = _opt_float(match.group(1), line, "Avg bus bandwidth")
            marker = True
        elif header is not None and _looks_like_row(stripped):
            rows.append(_row(line, header))
        elif _ERROR.search(stripped):
            errors.append(stripped)
            marker = marker or "NCCL" in stripped or "Test " in stripped
        elif test is None and not stripped.startswith("#") and (match := _COMMAND.search(stripped)):
            test = match.group(1)  # a pasted command line: "$ ./build/all_reduce_perf -b 8 -e 8G -g 8"
    if not marker and not rows:
        return None
    return NcclResult(test, complete, rows, oob, avg, errors, n_gpus)


def _looks_like_row(text: str) -> bool:
    tokens = text.split()
    return len(tokens) >= 3 and tokens[0].isdigit() and tokens[1].isdigit() and not tokens[2][0].isdigit()


def _row(line: Line, header: Line) -> NcclRow:
    has_root = " root " in f" {header.text} "
    tokens = line.text.split()
    expected = 4 + (1 if has_root else 0) + 8
    if len(tokens) == expected - 1 and tokens[2] in _TYPES and _is_int(tokens[3]):
        tokens.insert(3, "")  # a blank redop column (tests without a reduction op on some builds)
    if len(tokens) != expected:
        raise ParseError(line.no, line.text, f"nccl-tests row has {len(tokens)} values, expected {expected}")
    size, count, dtype, redop = tokens[:4]
    rest = tokens[4:]
    root = None
    if has_root:
        root = int(rest[0]) if _is_int(rest[0]) else None
        rest = rest[1:]
    return NcclRow(
        size_bytes=_int(size, line, "size"), count=_int(count, line, "count"), type=dtype,
        redop=optional(redop),
        root=root,
        oop_time_us=_opt_float(rest[0], line, "time"), oop_algbw_gbps=_opt_float(rest[1], line, "algbw"),
        oop_busbw_gbps=_opt_float(rest[2], line, "busbw"), oop_wrong=_wrong(rest[3], line),
        ip_time_us=_opt_float(rest[4], line, "time"), ip_algbw_gbps=_opt_float(rest[5], line, "algbw"),
        ip_busbw_gbps=_opt_float(rest[6], line, "busbw"), ip_wrong=_wrong(rest[7], line),
    )


def _is_int(token: str) -> bool:
    return bool(re.fullmatch(r"-?\d+", token))


def _int(token: str, line: Line, what: str) -> int:
    if not _is_int(token):
        raise ParseError(line.no, line.text, f"{what} is not an integer ({token!r})")
    return int(token)


def _float(token: str, line: Line, what: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(line.no, line.text, f"{what} is not a number ({token!r})") from None


def _opt_float(token: str, line: Line, what: str) -> float | None:
    """None for N/A and for inf/nan (algbw of a 0 us time): JSON has no such numbers."""
    if optional(token) is None:
        return None
    value = _float(token, line, what)
    return value if math.isfinite(value) else None


def _wrong(token: str, line: Line) -> int | float | None:
    """#wrong is a count (int); the old "error" column is a float such as 0e+00; N/A is None."""
    if optional(token) is None:
        return None
    if _is_int(token):
        return int(token)
    return _float(token, line, "#wrong/error")


# ------------------------------------------------------------------------------- library version

_LIBRARY_CODE = re.compile(r"nccl-library=(\d+)")
_LIBRARY_PRINTED = re.compile(r"NCCL version (\d+\.\d+\.\d+)")


def version_from_code(code: int) -> str:
    """NCCL_VERSION_CODE -> x.y.z (major*10000 + minor*100 + patch since 2.9, major*1000 + ... before;
    NCCL's nccl.h.in ``NCCL_VERSION(X,Y,Z)``)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def library_version(text: str) -> str | None:
    """The NCCL library an nccl-tests run used: ``NCCL version 2.21.5+cuda12.4`` (NCCL_DEBUG=INFO's line),
    else the header's ``nccl-library=21903`` code (nccl-tests >= 2.13); None when it printed neither.
    Not part of the ``nccl`` contract JSON: the versions check reads it from a run's output."""
    printed = _LIBRARY_PRINTED.search(text)
    if printed:
        return printed.group(1)
    code = _LIBRARY_CODE.search(text)
    return version_from_code(int(code.group(1))) if code else None
