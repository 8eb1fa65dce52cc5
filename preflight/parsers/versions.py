"""Parsers for the two version reporters the versions check reads: ``nv-fabricmanager --version`` and
``ofed_info -s``.

Usage::

    from preflight.parsers import versions
    versions.parse_fabricmanager(text).version      # '550.90.07'
    versions.parse_ofed_info(text).version          # 'MLNX_OFED_LINUX-23.10-1.1.9.0'

Schemas (kinds ``fabricmanager-version`` and ``ofed-info``)::

    {"version": "550.90.07"}
    {"version": "MLNX_OFED_LINUX-23.10-1.1.9.0", "distribution": "MLNX_OFED_LINUX", "release": "23.10-1.1.9.0"}

``nv-fabricmanager --version`` prints ``Fabric Manager version is : <driver branch version>`` (NVIDIA
Fabric Manager User Guide, "Fabric Manager Startup Options": ``-v, --version``). ``ofed_info -s`` prints
the short release name followed by a colon (the ``ofed_info`` script of MLNX_OFED / DOCA-OFED:
``MLNX_OFED_LINUX-23.10-1.1.9.0:``; DOCA-OFED 24.10+ names its packages ``OFED-internal-24.10-1.1.4:``).

Real examples::

    Fabric Manager version is : 550.90.07

    MLNX_OFED_LINUX-23.10-1.1.9.0:

Strict: no version line, a version that is not dotted numbers (fabric manager), a release line without
its colon (a cut output) or without a numbered release are ParseErrors naming the line. Prompt lines
before the tool's line (a paste) are skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import ParseError, first_nonblank, is_prompt, lines

_FM = re.compile(r"^Fabric Manager version is\s*:\s*(.*)$", re.IGNORECASE)
_FM_VERSION = re.compile(r"^\d+(?:\.\d+){1,3}$")
_OFED = re.compile(r"^([A-Za-z][A-Za-z_]*(?:-[A-Za-z][A-Za-z_]*)*)-(\d[\w.+~-]*):$")


@dataclass(frozen=True)
class FabricManagerVersion:
    version: str

    def to_json(self) -> dict:
        return {"version": self.version}


@dataclass(frozen=True)
class OfedInfo:
    distribution: str
    release: str

    @property
    def version(self) -> str:
        return f"{self.distribution}-{self.release}"

    def to_json(self) -> dict:
        return {"version": self.version, "distribution": self.distribution, "release": self.release}


def parse_fabricmanager(text: str) -> FabricManagerVersion:
    all_lines = lines(text)
    for line in all_lines:
        match = _FM.match(line.text.strip())
        if match:
            token = match.group(1).strip()
            if not _FM_VERSION.match(token):
                raise ParseError(line.no, line.text, f"fabric manager version {token!r} is not N.N.N")
            return FabricManagerVersion(token)
    first = first_nonblank(all_lines)
    raise ParseError(first.no, first.text, "no 'Fabric Manager version is : N.N.N' line")


def parse_ofed_info(text: str) -> OfedInfo:
    all_lines = lines(text)
    content = [line for line in all_lines if line.text.strip() and not is_prompt(line.text.strip())]
    if not content:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no ofed_info -s output (a 'MLNX_OFED_LINUX-23.10-1.1.9.0:' line)")
    line = content[-1]  # the last reading when several were pasted
    stripped = line.text.strip()
    match = _OFED.match(stripped)
    if not match:
        if " " in stripped:  # a release name has no spaces: a shell's or another tool's message
            raise ParseError(line.no, line.text, "not an ofed_info -s release line")
        why = "ends without its ':' (cut?)" if not stripped.endswith(":") else "has no numbered release"
        raise ParseError(line.no, line.text, f"ofed_info -s line {why}")
    return OfedInfo(match.group(1), match.group(2))
