"""Parser for ``nvidia-smi topo -m`` (``--matrix``) and ``nvidia-smi topo -mp``.

Usage::

    from preflight.parsers import topo
    topology = topo.parse(text)
    topology.link("GPU0", "GPU1")        # 'NV18'
    topology.nvlinks("GPU0", "GPU1")     # 18 (0 where the path is PCIe: PIX, NODE, SYS, ...)
    topology.link_kind("GPU0", "NIC0")   # 'pcie' ('nvlink', 'self' for X)
    topology.gpus[0].numa_affinity       # '0' (None on drivers that do not print the column)

Schema (``Topology.to_json()``, the contract's ``topo`` shape)::

    {"gpus":  [{"name": "GPU0", "cpu_affinity": "0-47,96-143", "numa_affinity": "0", "gpu_numa_id": "N/A"}],
     "nics":  [{"name": "NIC0", "device": "mlx5_0"}],
     "links": {"GPU0": {"GPU0": "X", "GPU1": "NV18", "NIC0": "PIX"}, "NIC0": {...}}}

The JSON is the contract's shape, key for key (scripts outside the project read it); the NVLink counts the
gpu_topology check needs (``nvlinks``, ``nvlink_matrix``: the ``NV#`` tokens of ``links`` as numbers, 0 for a
PCIe-only path) are methods of the typed result, not keys of the JSON.

Formats seen across drivers (fixtures in tests/fixtures/preflight/topo/):

- older drivers (A100 DGX on R470): NIC columns named by device (``mlx5_0``), trailing columns ``CPU
  Affinity`` and ``NUMA Affinity``; the oldest (V100 era) print only ``CPU Affinity``.
- current drivers (H100/H200 on R535/R550): NIC columns named ``NIC0..`` with a ``NIC Legend:`` mapping
  them to devices, and a third trailing column ``GPU NUMA ID`` (``N/A`` on x86 hosts).
- ``-mp``: the same matrix with PCIe paths only (no ``NV#``).
- Cells are tab separated on some builds and space aligned on others; NIC rows leave the affinity
  columns empty.

Real example (H100 SXM5 HGX, driver 535, abridged to two GPUs and one NIC)::

            GPU0    GPU1    NIC0    CPU Affinity    NUMA Affinity   GPU NUMA ID
    GPU0     X      NV18    PIX     0-55,112-167    0               N/A
    GPU1    NV18     X      NODE    0-55,112-167    0               N/A
    NIC0    PIX     NODE     X

    NIC Legend:

      NIC0: mlx5_0

Raw step: header labels and each row's tokens as printed. Typed step: affinity columns by name, NIC
devices from the header or the legend. A matrix whose rows stop before every column label has its row
(a truncated paste) raises ParseError naming the last line read.

A damaged row (a paste that lost a tab runs two cells together, ``NV18NV18``, and shifts every later cell
one column left, so that the CPU affinity would be read from the NUMA column) is found by its cell count:
a GPU row has one cell per column label and per affinity column, a NIC row one per column label (its
affinity cells are empty), and every matrix cell is a link token. No fact is taken from a damaged row: its
GPU is listed with null affinities, its row is absent from ``links``, and a ``warnings`` entry names it.
``link``/``nvlinks`` read a pair from the other device's row then (the matrix is symmetric).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from preflight.parsers.common import Line, ParseError, last_complete, last_nonblank, lines, split_runs

# Trailing columns, in the order drivers print them; their headers contain spaces.
AFFINITY_COLUMNS = {"CPU Affinity": "cpu_affinity", "NUMA Affinity": "numa_affinity", "GPU NUMA ID": "gpu_numa_id"}
_DEVICE_LABEL = re.compile(r"^(GPU\d+|NIC\d+|mlx\d+_\d+|mlx\d+_bond_\d+|[a-z][a-z0-9]*_\d+)$")
_LEGEND_ENTRY = re.compile(r"^\s*(NIC\d+):\s*(\S+)\s*$")
_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)$")
_NVLINK = re.compile(r"^NV(\d+)$")  # a bonded set of N NVLinks


def _is_header(text: str) -> bool:
    """The header starts with GPU0 like GPU0's row does, but its next token is a label, not a link."""
    tokens = text.split()
    return bool(tokens) and tokens[0] == "GPU0" and (len(tokens) == 1 or not _LINK.match(tokens[1]))


@dataclass(frozen=True)
class TopoGpu:
    name: str
    cpu_affinity: str | None
    numa_affinity: str | None
    gpu_numa_id: str | None

    @property
    def index(self) -> int:
        return int(self.name[3:])

    @property
    def numa_node(self) -> int | None:
        """NUMA Affinity as an int; None when the column is absent or not a single node (N/A, "0-1")."""
        return int(self.numa_affinity) if self.numa_affinity and self.numa_affinity.isdigit() else None

    def to_json(self) -> dict:
        return {"name": self.name, "cpu_affinity": self.cpu_affinity, "numa_affinity": self.numa_affinity,
                "gpu_numa_id": self.gpu_numa_id}


@dataclass(frozen=True)
class TopoNic:
    name: str  # column label as printed: NIC0 (new drivers) or mlx5_0 (old drivers)
    device: str | None  # RDMA device: the label itself on old drivers, from the legend on new ones

    def to_json(self) -> dict:
        return {"name": self.name, "device": self.device}


@dataclass(frozen=True)
class Topology:
    gpus: list[TopoGpu]
    nics: list[TopoNic]
    links: dict[str, dict[str, str]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()  # damaged rows read past (see the module docstring)

    def token(self, row: str, column: str) -> str | None:
        """The token at ``row``/``column``, or at ``column``/``row`` when ``row`` was not read (a damaged
        row: the matrix is symmetric); None for labels the matrix does not have."""
        found = self.links.get(row, {}).get(column)
        return found if found is not None else self.links.get(column, {}).get(row)

    def link(self, row: str, column: str) -> str:
        """The token printed at ``row``/``column`` (labels as printed: GPU0, NIC0, mlx5_0)."""
        found = self.token(row, column)
        if found is None:
            raise KeyError(f"{row}/{column}")
        return found

    def link_kind(self, row: str, column: str) -> str | None:
        """``self`` (X), ``nvlink`` (NV#) or ``pcie`` (PIX, PXB, PHB, NODE, SYS, SOC); None for labels the
        matrix does not have."""
        token = self.token(row, column)
        return None if token is None else _kind(token)

    def nvlinks(self, row: str, column: str) -> int:
        """The number of NVLinks between two devices (``NV18`` -> 18); 0 for a PCIe path or unknown labels."""
        return _nvlink_count(self.token(row, column))

    def nvlink_matrix(self) -> dict[str, dict[str, int]]:
        """GPU -> other GPU -> NVLinks between them (0: PCIe only), for every pair of the matrix's GPUs."""
        names = [gpu.name for gpu in self.gpus]
        return {a: {b: self.nvlinks(a, b) for b in names if b != a} for a in names}

    def gpu(self, name: str) -> TopoGpu | None:
        return next((gpu for gpu in self.gpus if gpu.name == name), None)

    def nic_by_device(self, device: str) -> TopoNic | None:
        return next((nic for nic in self.nics if nic.device == device), None)

    def to_json(self) -> dict:
        return {"gpus": [gpu.to_json() for gpu in self.gpus], "nics": [nic.to_json() for nic in self.nics],
                "links": {row: dict(cols) for row, cols in self.links.items()}}


def _nvlink_count(token: str | None) -> int:
    match = _NVLINK.match(token or "")
    return int(match.group(1)) if match else 0


def _kind(token: str) -> str:
    return "self" if token == "X" else "nvlink" if _NVLINK.match(token) else "pcie"


def parse(text: str) -> Topology:
    """Parse the last complete matrix in ``text``; ParseError when there is none."""
    all_lines = lines(text)
    if not any(_is_header(line.text) for line in all_lines):
        first = next((line for line in all_lines if line.text.strip()), Line(0, ""))
        raise ParseError(first.no, first.text, "no nvidia-smi topo matrix (a header line starting with GPU0)")
    return last_complete(split_runs(all_lines, _is_header), _parse_run)


def _split_header(text: str) -> tuple[list[str], list[str]]:
    """Device column labels and trailing affinity column names of a header line."""
    rest = text
    trailing: list[str] = []
    positions = sorted((rest.find(name), name) for name in AFFINITY_COLUMNS if name in rest)
    if positions:
        rest = text[: positions[0][0]]
        trailing = [name for _, name in positions]
    return rest.split(), trailing


def _parse_run(run: list[Line]) -> Topology:
    start = next(i for i, line in enumerate(run) if _is_header(line.text))
    header = run[start]
    columns, trailing = _split_header(header.text)
    for label in columns:
        if not _DEVICE_LABEL.match(label):
            raise ParseError(header.no, header.text, f"unexpected column label {label!r} in the topo header")

    raw_rows: dict[str, list[str]] = {}
    damaged: list[str] = []
    warnings: list[str] = []
    last_read = header
    legend: dict[str, str] = {}
    for line in run[start + 1:]:
        tokens = line.text.split()
        if not tokens:
            continue
        if tokens[0] in columns and tokens[0] not in raw_rows and tokens[0] not in damaged:
            problem = _damage(tokens, columns, trailing)
            if problem is None and len(tokens) < 1 + len(columns):
                raise ParseError(line.no, line.text,
                                 f"row {tokens[0]} has {len(tokens) - 1} cells, expected {len(columns)}")
            if problem is not None:
                damaged.append(tokens[0])
                warnings.append(f"line {line.no}: row {tokens[0]} {problem} (cells run together?): no facts "
                                f"taken from it")
            else:
                raw_rows[tokens[0]] = tokens[1:]
            last_read = line
            continue
        entry = _LEGEND_ENTRY.match(line.text)
        if entry:
            legend[entry.group(1)] = entry.group(2)
        # Anything else (the link legend, a prompt, interleaved log lines) is not part of the matrix.

    missing = [label for label in columns if label not in raw_rows and label not in damaged]
    if missing:
        end = last_nonblank(run) if not raw_rows and not damaged else last_read
        raise ParseError(end.no, end.text, f"topo matrix ends without rows for {', '.join(missing)}")
    return _typed(columns, trailing, raw_rows, legend, tuple(warnings))


def _damage(tokens: list[str], columns: list[str], trailing: list[str]) -> str | None:
    """Why a row's cells cannot be placed in their columns, or None for a well-formed (or short) row."""
    cells = tokens[1:]
    bad = next((cell for cell in cells[: len(columns)] if not _LINK.match(cell)), None)
    if bad is not None:
        return f"has {bad!r} where a link token belongs"
    expected = len(columns) + (len(trailing) if tokens[0].startswith("GPU") else 0)
    if len(cells) >= len(columns) and len(cells) not in (expected, len(columns) + len(trailing)):
        return f"has {len(cells)} cells, expected {expected}"
    return None


def _typed(columns: list[str], trailing: list[str], raw_rows: dict[str, list[str]],
           legend: dict[str, str], warnings: tuple[str, ...] = ()) -> Topology:
    links = {row: dict(zip(columns, raw_rows[row][: len(columns)], strict=True)) for row in columns
             if row in raw_rows}
    gpus = []
    for label in columns:
        if not label.startswith("GPU"):
            continue
        extra = raw_rows.get(label, [])[len(columns):]
        values = {AFFINITY_COLUMNS[name]: (extra[i] if i < len(extra) else None) for i, name in enumerate(trailing)}
        gpus.append(TopoGpu(label, values.get("cpu_affinity"), values.get("numa_affinity"),
                            values.get("gpu_numa_id")))
    nics = []
    for label in columns:
        if label.startswith("GPU"):
            continue
        device = legend.get(label) if label.startswith("NIC") else label
        nics.append(TopoNic(label, device))
    return Topology(gpus, nics, links, warnings)
