"""Parser for ``nvidia-smi -q`` (or ``-q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT``): memory health per GPU.

Usage::

    from preflight.parsers import nvsmi_q
    report = nvsmi_q.parse(text)
    for gpu in report.gpus:
        gpu.bus_id, gpu.volatile_uncorrectable, gpu.remap_pending, gpu.retired_pages_pending

Schema (``NvsmiReport.to_json()``, the contract's ``nvsmi-q`` shape)::

    {"gpus": [{"bus_id": "00000000:07:00.0", "ecc_mode_current": "Enabled", "volatile_uncorrectable": 0,
      "aggregate_uncorrectable": 0, "remap_pending": false, "remap_failure": false,
      "retired_pages_pending": false}]}

The contract's JSON has exactly these keys. Preflight's checks read more of the same parse: the
header's ``driver_version`` / ``cuda_version`` (``CUDA Version``, or ``CUDA Driver Version`` where a driver
prints that) and ``attached``, and per GPU ``persistence_mode`` and the NVSwitch ``fabric_state`` /
``fabric_status`` (R530+), the last three as printed (``N/A`` kept: it is not ``Enabled``, nor a trained
fabric), None when not printed. This is the one ``nvidia-smi -q`` reader: :func:`read` / :func:`read_run`
are also the raw step of ``nvsmi-pci`` and ``nvsmi-perf`` (:mod:`preflight.parsers.nvsmi_sections`).

Uncorrectable counts are the sum of the uncorrectable lines under ``ECC Errors`` / ``Volatile`` (or
``Aggregate``), whatever generation printed them:

- R510-R535 on H100/H200 and R550+: ``SRAM Uncorrectable Parity``, ``SRAM Uncorrectable SEC-DED``,
  ``DRAM Uncorrectable`` (the ``Aggregate Uncorrectable SRAM Sources`` section repeats the SRAM errors by
  unit and is not added again);
- R450-R470 on A100: ``SRAM Uncorrectable``, ``DRAM Uncorrectable``;
- R418 and older (V100): ``Double Bit`` / ``Device Memory``, ``Register File``, ... / ``Total`` (Total
  is used when printed, else the lines are summed).

``N/A`` (ECC disabled, a GPU without the feature, e.g. retired pages on A100/H100 which remap rows
instead) is None, never 0. ``Remapped Rows : N/A`` gives remap_pending/remap_failure None.

Real example (A100-SXM4-80GB, driver 510.73.08, a remap pending after a correctable error)::

    GPU 00000000:10:1C.0
        Product Name                          : NVIDIA A100-SXM4-80GB
        ECC Mode
            Current                           : Enabled
            Pending                           : Enabled
        ECC Errors
            Volatile
                SRAM Correctable              : 0
                SRAM Uncorrectable            : 0
                DRAM Correctable              : 177
                DRAM Uncorrectable            : 0
            ...
        Retired Pages
            Single Bit ECC                    : N/A
            Double Bit ECC                    : N/A
            Pending Page Blacklist            : N/A
        Remapped Rows
            Correctable Error                 : 1
            Uncorrectable Error               : 0
            Pending                           : Yes
            Remapping Failure Occurred        : No

Raw step: per GPU, every ``key : value`` under its section path (indentation), as printed. Typed step:
the fields above. Fewer ``GPU`` blocks than ``Attached GPUs``, or a GPU missing a section that the GPUs
before it printed, is a truncated output and raises ParseError naming the last line. In a paste with an
elision marker (``...``, ``[snip]``) the same shortfalls are read as far as they go instead: the GPUs
shown are listed (null where a section was elided) and ``warnings`` names how many GPUs and which
sections are missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_complete,
    last_nonblank,
    lines,
    optional,
    split_runs,
    yes_no,
)

_GPU = re.compile(r"^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_LOG_HEADER = re.compile(r"^=+NVSMI LOG=+\s*$")
_ATTACHED = re.compile(r"^Attached GPUs\s*:\s*(\d+)\s*$")
# What every `nvidia-smi -q` (and `-q -d ECC`) prints for a datacenter GPU, K80 to H200.
_HEALTH_SECTIONS = frozenset({"ECC Mode", "ECC Errors"})
_RETIRED_PENDING_KEYS = ("Pending Page Blacklist", "Pending Page Retirement", "Pending")

Path = tuple[str, ...]
Block = tuple[Line, dict[Path, tuple[str, Line]]]  # a GPU's line and its values by path


@dataclass(frozen=True)
class GpuMemoryHealth:
    bus_id: str
    product_name: str | None
    ecc_mode_current: str | None
    ecc_mode_pending: str | None
    volatile_uncorrectable: int | None
    aggregate_uncorrectable: int | None
    volatile_correctable: int | None
    aggregate_correctable: int | None
    remap_pending: bool | None
    remap_failure: bool | None
    remapped_correctable: int | None
    remapped_uncorrectable: int | None
    retired_pages_pending: bool | None
    # As printed ("Enabled", "N/A"), None when not printed: on an NVSwitch board "N/A" is not a trained
    # fabric, and persistence "N/A" is not "Enabled", so the words are kept for the check to judge.
    persistence_mode: str | None = None
    fabric_state: str | None = None  # R530+ on NVSwitch boards: the GPU's own fabric registration
    fabric_status: str | None = None

    def to_json(self) -> dict:
        return {"bus_id": self.bus_id, "ecc_mode_current": self.ecc_mode_current,
                "volatile_uncorrectable": self.volatile_uncorrectable,
                "aggregate_uncorrectable": self.aggregate_uncorrectable, "remap_pending": self.remap_pending,
                "remap_failure": self.remap_failure, "retired_pages_pending": self.retired_pages_pending}


@dataclass(frozen=True)
class NvsmiReport:
    gpus: list[GpuMemoryHealth]
    driver_version: str | None = None
    cuda_version: str | None = None
    # "Attached GPUs" of the header: more than len(gpus) for `nvidia-smi -q -i N` (one GPU of the node).
    attached: int | None = None
    warnings: tuple[str, ...] = ()  # what an elided paste left out (see the module docstring)

    def gpu(self, bus_id: str) -> GpuMemoryHealth | None:
        """By full (00000000:07:00.0) or short (07:00.0) PCI bus id."""
        wanted = bus_id.lower()
        return next((g for g in self.gpus if g.bus_id.lower().endswith(wanted)), None)

    def to_json(self) -> dict:
        return {"gpus": [gpu.to_json() for gpu in self.gpus]}


@dataclass(frozen=True)
class RawRun:
    """One ``nvidia-smi -q`` output, raw: header ``key : value``, ``Attached GPUs`` and per ``GPU`` block
    every ``key : value`` under its indentation path, as printed. Shared by every ``-q`` kind (nvsmi-q,
    nvsmi-pci, nvsmi-perf): there is one reader of this format."""

    header: dict[str, str]
    attached: tuple[int, Line] | None
    gpus: list[Block]
    end: Line  # the last non-blank line, where a cut output is reported
    elisions: tuple[int, ...] = ()  # the lines of the pasted elision markers dropped inside this output

    @property
    def elided(self) -> bool:
        """A person elided lines of this output (a marker such as ``...``): blocks may be missing there."""
        return bool(self.elisions)

    def elision_after(self, line: Line) -> int:
        """The line of the first elision marker after ``line`` (else the last one)."""
        return next((no for no in self.elisions if no > line.no), self.elisions[-1])


def read(text: str, what: str) -> list[list[Line]]:
    """The runs of ``text`` (several outputs pasted together), each a list of lines; ParseError naming
    ``what`` (``-d PCI``) when there is no GPU block at all (``No devices were found``)."""
    all_lines = lines(text)
    if not any(_GPU.match(line.text.strip()) for line in all_lines):
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, f"no nvidia-smi -q{what} output (a 'GPU 00000000:07:00.0' line)")
    has_header = any(_LOG_HEADER.match(line.text.strip()) for line in all_lines)
    starts = _LOG_HEADER if has_header else _ATTACHED
    return split_runs(all_lines, lambda t: bool(starts.match(t.strip())))


def _tab_width(run: list[Line]) -> int:
    """How wide a tab is in this (pasted) output: 4 or 8 columns, the first that gives nvidia-smi's own shape.

    nvidia-smi indents by spaces, 4 a level; a paste may have tabs for 4 spaces (an editor) or for 8 (``unexpand``,
    a terminal). With the wrong width the levels shift and values land under the wrong path (a null for a value
    that is there), so the width is the one under which every section line (a key without a value) has the
    next line deeper, and no line is more than one level deeper than the line before it."""
    if not any("\t" in line.text for line in run):
        return 4
    content = [line.text for line in run if line.text.strip() and not _LOG_HEADER.match(line.text.strip())]
    for width in (4, 8):
        shape = []
        for text in content:
            expanded = text.expandtabs(width)
            stripped = expanded.strip()
            shape.append((len(expanded) - len(expanded.lstrip()), ":" not in stripped and not _GPU.match(stripped)))
        if all(nxt[0] - cur[0] <= 4 and (not cur[1] or nxt[0] > cur[0]) for cur, nxt in zip(shape, shape[1:], strict=False)):
            return width
    return 4


def read_run(run: list[Line]) -> RawRun:
    header: dict[str, str] = {}
    attached: tuple[int, Line] | None = None
    gpus: list[Block] = []
    stack: list[tuple[int, str]] = []
    tab = _tab_width(run)
    for line in run:
        expanded = line.text.expandtabs(tab)
        stripped = expanded.strip()
        if not stripped or _LOG_HEADER.match(stripped):
            continue
        if _GPU.match(stripped):
            if attached is not None and len(gpus) == attached[0]:
                gpus = []  # the whole output again without its header (pasted twice): keep the later one
            gpus.append((line, {}))
            stack = []
            continue
        indent = len(expanded) - len(expanded.lstrip())
        key, colon, value = stripped.partition(":")
        key = key.strip()
        if not gpus:
            if match := _ATTACHED.match(stripped):
                attached = (int(match.group(1)), line)
            elif colon:
                header[key] = value.strip()
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if not colon:
            stack.append((indent, key))
            continue
        path = tuple(name for _, name in stack) + (key,)
        gpus[-1][1][path] = (value.strip(), line)
    # lines() keeps the original numbers and drops elision lines: a gap is where one was
    elisions = tuple(a.no + 1 for a, b in zip(run, run[1:], strict=False) if b.no - a.no > 1)
    return RawRun(header, attached, gpus, last_nonblank(run), elisions)


def parse(text: str) -> NvsmiReport:
    return last_complete(read(text, ""), _parse_run)


def _parse_run(run: list[Line]) -> NvsmiReport:
    raw = read_run(run)
    gpus, attached, end = raw.gpus, raw.attached, raw.end
    if not gpus:
        raise ParseError(end.no, end.text, "no GPU block in this nvidia-smi -q output")
    warnings: list[str] = []
    sections = {path[0] for path in gpus[0][1]}
    missing = sorted(sections - {path[0] for path in gpus[-1][1]})
    if missing and len(gpus) > 1:
        what = f"GPU {gpus[-1][0].text.split()[1]} ends before its {', '.join(missing)} section(s)"
        if not raw.elided:
            raise ParseError(end.no, end.text, what)
        warnings.append(f"line {raw.elision_after(gpus[-1][0])}: lines elided: {what}: its values there are null")
    # Fewer blocks than attached GPUs is a cut output, except for one whole block: `nvidia-smi -q -i N`, what
    # on-call runs on the one suspect GPU (whole = with the health sections every -q and -q -d ECC prints).
    # Several blocks could be `-i 0,1,2` or a cut exactly between GPUs: that stays an error, unless a person
    # elided lines (a marker the paste shows): then the blocks are read as far as they go, and a warning
    # names what is missing. `attached` is kept, so a caller expecting the whole node (gpu_health) can tell.
    if attached is not None and len(gpus) < attached[0] and (
            len(gpus) != 1 or not _HEALTH_SECTIONS <= {path[0] for path in gpus[0][1]}):
        if not raw.elided:
            raise ParseError(end.no, end.text, f"output ends after {len(gpus)} of {attached[0]} attached GPUs")
    if attached is not None and len(gpus) < attached[0] and raw.elided:
        warnings.append(f"line {raw.elisions[-1]}: lines elided: {len(gpus)} of {attached[0]} attached GPUs shown, "
                        f"no facts about the other {attached[0] - len(gpus)}")
    if raw.elided:
        for line, values in gpus:
            absent = sorted(_HEALTH_SECTIONS - {path[0] for path in values})
            if absent:
                warnings.append(f"line {raw.elision_after(line)}: lines elided: GPU {line.text.split()[1]} shows no "
                                f"{', '.join(absent)} section: its values there are null")
    cuda = raw.header.get("CUDA Version", raw.header.get("CUDA Driver Version"))
    return NvsmiReport([_typed_gpu(line, values) for line, values in gpus],
                       optional(raw.header.get("Driver Version")), optional(cuda),
                       attached[0] if attached else None, tuple(dict.fromkeys(warnings)))


def _typed_gpu(gpu_line: Line, values: dict[Path, tuple[str, Line]]) -> GpuMemoryHealth:
    def text(*path: str) -> str | None:
        return optional(values[path][0]) if path in values else None

    def printed(*path: str) -> str | None:
        return values[path][0] if path in values else None

    def integer(*path: str) -> int | None:
        return _count(values[path]) if path in values else None

    def flag(*path: str) -> bool | None:
        if path not in values:
            return None
        return yes_no(values[path][0], values[path][1], "/".join(path))

    remap_section = values.get(("Remapped Rows",))  # "Remapped Rows : N/A" on GPUs without a remapper
    retired = next((values[("Retired Pages", key)] for key in _RETIRED_PENDING_KEYS
                    if ("Retired Pages", key) in values), None)
    return GpuMemoryHealth(
        bus_id=gpu_line.text.split()[-1],
        product_name=text("Product Name"),
        ecc_mode_current=text("ECC Mode", "Current"),
        ecc_mode_pending=text("ECC Mode", "Pending"),
        volatile_uncorrectable=_ecc_sum(values, "Volatile", uncorrectable=True),
        aggregate_uncorrectable=_ecc_sum(values, "Aggregate", uncorrectable=True),
        volatile_correctable=_ecc_sum(values, "Volatile", uncorrectable=False),
        aggregate_correctable=_ecc_sum(values, "Aggregate", uncorrectable=False),
        remap_pending=None if remap_section else flag("Remapped Rows", "Pending"),
        remap_failure=None if remap_section else flag("Remapped Rows", "Remapping Failure Occurred"),
        remapped_correctable=integer("Remapped Rows", "Correctable Error"),
        remapped_uncorrectable=integer("Remapped Rows", "Uncorrectable Error"),
        retired_pages_pending=yes_no(retired[0], retired[1], "Retired Pages pending") if retired else None,
        persistence_mode=printed("Persistence Mode"),
        fabric_state=printed("Fabric", "State"),
        fabric_status=printed("Fabric", "Status"),
    )


def _ecc_sum(values: dict[Path, tuple[str, Line]], scope: str, uncorrectable: bool) -> int | None:
    """Sum of the (un)correctable counters under ECC Errors/<scope>; None when none is a number."""
    prefix = ("ECC Errors", scope)
    legacy_group = "Double Bit" if uncorrectable else "Single Bit"
    legacy = {path: item for path, item in values.items() if path[:3] == prefix + (legacy_group,)}
    if legacy:
        total = legacy.get(prefix + (legacy_group, "Total"))
        chosen = [total] if total is not None else list(legacy.values())
    else:
        chosen = [item for path, item in values.items()
                  if len(path) == 3 and path[:2] == prefix and _is_counter(path[2], uncorrectable)]
    counts = [count for count in (_count(item) for item in chosen) if count is not None]
    return sum(counts) if counts else None


def _is_counter(key: str, uncorrectable: bool) -> bool:
    if uncorrectable:
        return "Uncorrectable" in key
    return "Correctable" in key and "Uncorrectable" not in key


def _count(item: tuple[str, Line]) -> int | None:
    token, line = item
    if optional(token) is None:
        return None
    if not token.isdigit():
        raise ParseError(line.no, line.text, f"expected a count, got {token!r}")
    return int(token)
