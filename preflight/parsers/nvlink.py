"""Parsers for ``nvidia-smi nvlink -s`` (link state and speed) and ``nvidia-smi nvlink -e`` (error counters).

Kinds:

``nvlink-status``::

    {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-...",
      "links": [{"link": 0, "active": true, "speed_gbps": 26.562}]}]}

``nvlink-errors``::

    {"gpus": [{"index": 0, "name": "...", "uuid": "GPU-...",
      "links": [{"link": 0, "counters": {"replay": 0, "recovery": 0, "crc": 0}}]}]}

Real examples (H100 SXM, driver 550; the inactive link as in Azure/azhpc-diagnostics#73 on V100)::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4c4d4bd6-4d0d-a2a1-5d38-0d5e2a3cd0f4)
    \t Link 0: 26.562 GB/s
    \t Link 3: <inactive>

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4c4d4bd6-4d0d-a2a1-5d38-0d5e2a3cd0f4)
    \t Link 0: Replay Errors: 0
    \t Link 0: Recovery Errors: 0
    \t Link 0: CRC Errors: 0

Older drivers print ``Data CRC Errors`` and ``Flit CRC Errors`` instead of ``CRC Errors`` (counter names
are kept as printed, lower-cased with ``_``: ``data_crc``, ``flit_crc``). Counters print ``N/A`` on a
link that is down (None).

Errors: no ``GPU N:`` line; a GPU header with no link lines after it (output cut after the header); in
``-e``, a link with fewer counters than the first link printed (cut mid-link); a line that is neither,
including one before the first header (only a pasted shell prompt may be there, reported as a paste
warning): a header spelled in a way the parser did not take would otherwise drop that GPU and its links.
Headers are read with any spaces or tabs around the index (``GPU  0:``, ``GPU\t0:``, ``GPU 0:\t``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_nonblank,
    lines,
    optional,
    shell_prompt,
    to_number,
)

# Any spaces or tabs around the index and after the colon (`GPU  0:`, `GPU\t0:`, `GPU 0:\t` in a paste).
_GPU = re.compile(r"^GPU\s+(\d+)\s*:\s*(.*?)(?:\s*\(UUID:\s*(GPU-[0-9a-fA-F-]+)\))?\s*$")
# Whitespace between the words is any run of spaces or tabs: a pasted table often has tabs or collapsed spaces.
_STATUS = re.compile(r"^Link\s+(\d+)\s*:\s*(?:<inactive>|([0-9.]+)\s*GB/s)\s*$")
_ERRORS = re.compile(r"^Link\s+(\d+)\s*:\s*([A-Za-z ]+?)\s+Errors\s*:\s*(\S+)\s*$")


@dataclass(frozen=True)
class NvLink:
    link: int
    active: bool | None = None
    speed_gbps: float | None = None
    counters: dict[str, int | None] = field(default_factory=dict)

    def to_json(self, errors: bool) -> dict:
        if errors:
            return {"link": self.link, "counters": dict(self.counters)}
        return {"link": self.link, "active": self.active, "speed_gbps": self.speed_gbps}


@dataclass(frozen=True)
class NvLinkGpu:
    index: int
    name: str
    uuid: str | None
    links: list[NvLink]


@dataclass(frozen=True)
class NvLinkReport:
    gpus: list[NvLinkGpu]
    errors: bool  # from `-e` (counters) rather than `-s` (state)

    def gpu(self, index: int) -> NvLinkGpu | None:
        return next((g for g in self.gpus if g.index == index), None)

    def to_json(self) -> dict:
        return {"gpus": [{"index": g.index, "name": g.name, "uuid": g.uuid,
                          "links": [link.to_json(self.errors) for link in g.links]} for g in self.gpus]}


def _gpus(text: str, what: str, link_line: re.Pattern) -> tuple[list[tuple[Line, list[tuple[Line, re.Match]]]], Line]:
    all_lines = lines(text)
    gpus: list[tuple[Line, list[tuple[Line, re.Match]]]] = []
    stray: Line | None = None  # the first line ahead of the first GPU header (only a pasted prompt may be there)
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped:
            continue
        if _GPU.match(stripped):
            gpus.append((line, []))
            continue
        match = link_line.match(stripped)
        if match and gpus:
            gpus[-1][1].append((line, match))
        elif gpus:
            raise ParseError(line.no, line.text, f"not a line of nvidia-smi nvlink {what}")
        elif stray is None and not shell_prompt(stripped):
            stray = line
    if not gpus:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, f"no nvidia-smi nvlink {what} output (a 'GPU 0: ...' line)")
    if stray is not None:
        # A GPU header the pattern did not take would lose that GPU and its links without a word.
        raise ParseError(stray.no, stray.text, f"not a line of nvidia-smi nvlink {what} (before the first "
                                               "'GPU N:' header)")
    end = last_nonblank(all_lines)
    for gpu_line, links in gpus:
        if not links:
            raise ParseError(end.no, end.text, f"output ends without the links of GPU {_header(gpu_line)[0]}")
    return gpus, end


def _header(line: Line) -> tuple[int, str, str | None]:
    match = _GPU.match(line.text.strip())
    assert match is not None
    return int(match.group(1)), match.group(2), match.group(3)


def parse_status(text: str) -> NvLinkReport:
    gpus, _ = _gpus(text, "-s", _STATUS)
    out = []
    for gpu_line, links in gpus:
        parsed = [NvLink(int(m.group(1)), m.group(2) is not None,
                         float(to_number(m.group(2), line, "link speed")) if m.group(2) else None)
                  for line, m in links]
        out.append(NvLinkGpu(*_header(gpu_line), parsed))
    return NvLinkReport(out, errors=False)


def parse_errors(text: str) -> NvLinkReport:
    gpus, end = _gpus(text, "-e", _ERRORS)
    out = []
    expected: set[str] | None = None
    for gpu_line, rows in gpus:
        by_link: dict[int, dict[str, int | None]] = {}
        for line, m in rows:
            name = m.group(2).strip().lower().replace(" ", "_")
            token = optional(m.group(3))
            if token is not None and not token.isdigit():
                raise ParseError(line.no, line.text, f"{m.group(2)} Errors is not a count ({token!r})")
            by_link.setdefault(int(m.group(1)), {})[name] = int(token) if token is not None else None
        for link, counters in by_link.items():
            expected = expected or set(counters)
            if set(counters) != expected:
                gpu = f"GPU {_header(gpu_line)[0]}"
                raise ParseError(end.no, end.text, f"{gpu} link {link} has counters {sorted(counters)}, "
                                                   f"expected {sorted(expected)} (output cut mid-link?)")
        out.append(NvLinkGpu(*_header(gpu_line), [NvLink(n, counters=c) for n, c in sorted(by_link.items())]))
    return NvLinkReport(out, errors=True)
