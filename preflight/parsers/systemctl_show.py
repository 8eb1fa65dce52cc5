"""Parser for ``systemctl show [-p A,B,...] UNIT...``: unit properties as systemd reports them live.

Usage::

    from preflight.parsers import systemctl_show
    unit = systemctl_show.parse(text).units[0]
    unit.get("LoadState"), unit.cpu_affinity, unit.numa_policy, unit.numa_mask

Schema (``UnitShow.to_json()``, kind ``systemctl-show``)::

    {"units": [{"properties": {"LoadState": "loaded", "CPUAffinity": "0-47 96-143", "NUMAPolicy": "bind",
       "NUMAMask": "0"}, "load_state": "loaded", "cpu_affinity": [0, ..., 143], "numa_policy": "bind",
       "numa_mask": [0]}]}

The format is systemctl(1) ``show``: one ``Name=value`` line per property, in the order asked (or
systemd's order without ``-p``), and an empty line between the units when several are shown
(systemd src/systemctl/systemctl-show.c, ``show_one()`` / ``print_property()``). Values are as printed;
an unset property prints ``Name=``. ``CPUAffinity`` and ``NUMAMask`` are CPU/NUMA-node sets printed by
``cpu_set_to_range_string()`` (``0-47 96-143``), read with :func:`preflight.parsers.cpulist.cpus_of`;
absent or empty they are ``[]`` (no pinning), typed fields of properties not shown are null.

Real example (Ubuntu 22.04, systemd 249, a vLLM unit pinned to NUMA node 0 by a drop-in)::

    LoadState=loaded
    CPUAffinity=0-47 96-143
    NUMAPolicy=bind
    NUMAMask=0

A line that is not ``Name=value`` (systemctl's ``Running in chroot, ignoring command 'show'``, a
``Failed to connect to bus`` message on stdout, a cut line) is a ParseError naming it: an unreadable
answer never reads as "no properties".
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, first_nonblank, is_prompt, lines
from preflight.parsers.cpulist import cpus_of

# systemd property names: CamelCase letters and digits (D-Bus member names, org.freedesktop.systemd1).
_PROPERTY = re.compile(r"^([A-Z][A-Za-z0-9]*)=(.*)$")


@dataclass(frozen=True)
class UnitShow:
    properties: dict[str, str]  # raw: every property as printed
    cpu_affinity: tuple[int, ...] | None  # typed: the sets, None when the property was not shown
    numa_mask: tuple[int, ...] | None

    def get(self, name: str) -> str | None:
        return self.properties.get(name)

    @property
    def load_state(self) -> str | None:
        return self.properties.get("LoadState")

    @property
    def numa_policy(self) -> str | None:
        return self.properties.get("NUMAPolicy") or None

    def to_json(self) -> dict:
        return {"properties": dict(self.properties), "load_state": self.load_state,
                "cpu_affinity": _listed(self.cpu_affinity), "numa_policy": self.numa_policy,
                "numa_mask": _listed(self.numa_mask)}


def _listed(cpus: tuple[int, ...] | None) -> list[int] | None:
    return list(cpus) if cpus is not None else None


@dataclass(frozen=True)
class SystemctlShow:
    units: list[UnitShow]

    def to_json(self) -> dict:
        return {"units": [unit.to_json() for unit in self.units]}


def parse(text: str) -> SystemctlShow:
    all_lines = lines(text)
    blocks: list[list[tuple[str, str, Line]]] = [[]]
    for line in all_lines:
        stripped = line.text.strip()
        if is_prompt(stripped):
            continue  # pasted with the command that printed it
        if not stripped:
            if blocks[-1]:
                blocks.append([])
            continue
        match = _PROPERTY.match(stripped)
        if not match:
            raise ParseError(line.no, line.text, "not a 'Name=value' line of systemctl show")
        blocks[-1].append((match.group(1), match.group(2).strip(), line))
    units = []
    for block in (b for b in blocks if b):
        properties = {name: value for name, value, _ in block}
        units.append(UnitShow(properties, _cpu_set(block, "CPUAffinity"), _cpu_set(block, "NUMAMask")))
    if not units:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no systemctl show output (a 'LoadState=loaded' line)")
    return SystemctlShow(units)


def _cpu_set(block: list[tuple[str, str, Line]], name: str) -> tuple[int, ...] | None:
    """The typed set of property ``name`` (its last line, as systemd applies the last), None if not shown."""
    found = [(value, line) for key, value, line in block if key == name]
    return tuple(sorted(cpus_of(*found[-1]))) if found else None
