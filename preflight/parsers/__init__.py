"""Parsers for the outputs preflight gathers: pure functions ``text -> small dataclass``.

``PARSERS`` maps each kind (the names ``clusterctl preflight parse`` and the JSON contract use) to its
``parse`` function; ``parse(kind, text)`` dispatches; ``to_contract_json(kind, result)`` gives the exact
shape of ``docs/contracts/parse-json.md``. Every parser raises ``ParseError`` (line number, line,
message) on input it cannot read, never another exception.

Pasted outputs (from tickets and runbooks) are read through :func:`common.paste_lines`: hand annotations
after a value (``Yes   <===``, ``none  # comment``, ``(this one)``) and elision lines (``...``, ``[snip]``)
are removed, shell prompt lines (``$ cmd``, ``user@host:~$ cmd``, ``[root@host ~]# cmd``) are skipped by the
parsers, and each is reported; non-breaking spaces are read as spaces, and reported. ``paste_warnings(text)``
returns those reports.

A parser that reads past damage in the tool's own lines says so in its result's ``warnings`` (a tuple of
``line N: ...`` strings, the same form): a row whose cell count is wrong (no facts are taken from it), an
elided section (what is missing is named), a missing header (the data was complete without it). Garbage is
still a ParseError: a warning is for output read as far as it goes, never for a guess.
``parse_warnings(text, result)`` is both lists in line order, and ``to_contract_json(kind, result,
warnings)`` puts it under a top-level ``"warnings"`` key (a list of strings, ``[]`` when nothing was
ignored), as ``docs/contracts/parse-json.md`` specifies. Checks note the same list in their evidence.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from preflight.parsers.common import ParseError, paste_lines

# kind -> (module of this package, function). Imported on first use: importing every parser costs ~0.15 s,
# paid by each process that needs one of them (a stub tool on a simulated machine, importing
# preflight.parsers.cpulist, runs dozens of times per preflight node).
_KINDS: dict[str, tuple[str, str]] = {
    "topo": ("topo", "parse"),
    "ibstat": ("ibstat", "parse"),
    "ibping": ("ibping", "parse"),
    "perftest": ("perftest", "parse"),
    "nccl": ("nccl", "parse"),
    "chrony": ("chrony", "parse"),
    "cpupower": ("cpupower", "parse"),
    "nvsmi-q": ("nvsmi_q", "parse"),
    # preflight depth: PCIe, GPU bandwidth, NVLink, clock events, DCGM diag, IB link health
    "nvsmi-pci": ("nvsmi_sections", "parse_pci"),
    "nvsmi-perf": ("nvsmi_sections", "parse_perf"),
    "nvlink-status": ("nvlink", "parse_status"),
    "nvlink-errors": ("nvlink", "parse_errors"),
    "nvbandwidth": ("nvbandwidth", "parse"),
    "dcgm-diag": ("dcgm_diag", "parse"),
    "sysfs": ("ib_health", "parse_sysfs"),
    "mlxlink": ("ib_health", "parse_mlxlink"),
    "kernel-links": ("ib_health", "parse_kernel_links"),
    # structured outputs the checks read (dcqcn, numa_pinning, cstates, gpu_health, versions)
    "mlnx-qos": ("mlnx_qos", "parse"),
    "systemctl-show": ("systemctl_show", "parse"),
    "cpulist": ("cpulist", "parse"),
    "cmdline": ("cmdline", "parse"),
    "kernel-xids": ("kernel_log", "parse_xids"),
    "fabricmanager-version": ("versions", "parse_fabricmanager"),
    "ofed-info": ("versions", "parse_ofed_info"),
    "os-release": ("os_release", "parse"),
    "mokutil-sb-state": ("secure_boot", "parse"),
    # one-word outputs (cstates, ib_link_health, dcqcn, gpu_health, versions)
    "pm-qos": ("single_value", "parse_pm_qos"),
    "date-epoch": ("single_value", "parse_epoch"),
    "ecn-switch": ("single_value", "parse_ecn_switch"),
    "systemctl-is-active": ("single_value", "parse_is_active"),
    "dpkg-version": ("single_value", "parse_dpkg_version"),
}


class _Parsers(Mapping[str, Callable[[str], Any]]):
    """``PARSERS``: a read-only mapping kind -> parse function that imports each parser module on first use."""

    def __getitem__(self, kind: str) -> Callable[[str], Any]:
        module, function = _KINDS[kind]
        return getattr(importlib.import_module(f"{__name__}.{module}"), function)

    def __iter__(self) -> Iterator[str]:
        return iter(_KINDS)

    def __len__(self) -> int:
        return len(_KINDS)


PARSERS: Mapping[str, Callable[[str], Any]] = _Parsers()

__all__ = ["PARSERS", "ParseError", "parse", "parse_warnings", "paste_warnings", "to_contract_json"]


def parse(kind: str, text: str) -> Any:
    """Parse ``text`` as output of ``kind``; KeyError for an unknown kind, ParseError for bad text."""
    return PARSERS[kind](text)


def paste_warnings(text: str) -> list[str]:
    """What the parsers ignore in ``text`` as paste additions, one line each (see the module docstring)."""
    return paste_lines(text)[1]


def parse_warnings(text: str, result: Any) -> list[str]:
    """Every warning of one parse of ``text``: what the paste added and what the parser read past (the
    result's own ``warnings``), in line order."""
    found = paste_warnings(text) + list(getattr(result, "warnings", ()))
    return sorted(found, key=_line_no)


def _line_no(warning: str) -> int:
    match = re.match(r"line (\d+)", warning)
    return int(match.group(1)) if match else 0


def to_contract_json(kind: str, result: Any, warnings: list[str] | None = None) -> dict:
    """The contract's JSON object for a parse result of ``kind`` (with ``warnings`` when given)."""
    if kind not in PARSERS:
        raise KeyError(kind)
    data = result.to_json()
    if warnings is not None:
        data["warnings"] = list(warnings)
    return data
