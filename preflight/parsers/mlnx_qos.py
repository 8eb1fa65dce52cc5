"""Parser for ``mlnx_qos -i <netdev>`` (MLNX_OFED / DOCA mlnx-tools): trust state and PFC per priority.

Usage::

    from preflight.parsers import mlnx_qos
    qos = mlnx_qos.parse(text)
    qos.trust, qos.pfc_enabled(3)        # ('dscp', True)

Schema (``MlnxQos.to_json()``, kind ``mlnx-qos``)::

    {"dcbx_mode": "OS controlled", "trust": "dscp",
     "pfc": [{"priority": 0, "enabled": false, "buffer": 0}, ..., {"priority": 3, "enabled": true, "buffer": 1}]}

The layout is mlnx-tools' ``python/mlnx_qos`` (``pretty_print()`` and the PFC printer): ``Key: value``
lines (``DCBX mode``, ``Priority trust state``, ``Receive buffer size (bytes)``, ``Cable len``), the
``dscp2prio mapping:`` rows ``prio:N dscp:..`` when trust is dscp, the ``PFC configuration:`` table of
three rows ``priority 0 1 .. 7`` / ``enabled 0 0 0 1 ..`` / ``buffer ..`` (the buffer row only on
firmware with buffer commands), then per traffic class ``tc: N ratelimit: .., tsa: ..`` and its
``priority:  N`` rows. ``buffer`` is null where the row is absent.

Real example (ConnectX-7 RoCE port, DOCA-OFED 2.x, RoCE on priority 3 with DSCP trust)::

    DCBX mode: OS controlled
    Priority trust state: dscp
    dscp2prio mapping:
            prio:0 dscp:07,06,05,04,03,02,01,00,
            ...
    default priority:
    Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,total_size=1027968
    Cable len: 7
    PFC configuration:
            priority    0   1   2   3   4   5   6   7
            enabled     0   0   0   1   0   0   0   0
            buffer      0   0   0   1   0   0   0   0
    tc: 1 ratelimit: unlimited, tsa: vendor
             priority:  0

Strict: no ``Priority trust state`` line, a trust state other than ``pcp``/``dscp``, no PFC table (the
output was cut before it), an ``enabled`` row with fewer values than the ``priority`` row or values other
than 0/1, and any line of none of the shapes above are ParseErrors naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import Line, ParseError, first_nonblank, is_prompt, last_nonblank, lines

_TRUST_STATES = ("pcp", "dscp")
_KEY_VALUE = re.compile(r"^([A-Za-z][A-Za-z0-9 ()/_-]*?):\s*(.*)$")
_DSCP_ROW = re.compile(r"^prio:\d+ dscp:[\d,]*$")
_TC = re.compile(r"^tc: \d+ ratelimit: .*$")
_TC_PRIORITY = re.compile(r"^priority:\s+\d+$")
_PFC_ROWS = ("priority", "enabled", "buffer")


@dataclass(frozen=True)
class PfcPriority:
    priority: int
    enabled: bool
    buffer: int | None

    def to_json(self) -> dict:
        return {"priority": self.priority, "enabled": self.enabled, "buffer": self.buffer}


@dataclass(frozen=True)
class MlnxQos:
    dcbx_mode: str | None
    trust: str
    pfc: list[PfcPriority]

    def pfc_enabled(self, priority: int) -> bool | None:
        """PFC on ``priority``; None when the table has no such priority."""
        return next((p.enabled for p in self.pfc if p.priority == priority), None)

    def to_json(self) -> dict:
        return {"dcbx_mode": self.dcbx_mode, "trust": self.trust, "pfc": [p.to_json() for p in self.pfc]}


def parse(text: str) -> MlnxQos:
    all_lines = lines(text)
    # Raw step: the key/value lines and the PFC rows, as printed.
    keys: dict[str, tuple[str, Line]] = {}
    rows: dict[str, tuple[list[str], Line]] = {}
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped or is_prompt(stripped):
            continue
        words = stripped.split()
        if words[0] in _PFC_ROWS and ":" not in stripped and "PFC configuration" in keys:
            if words[0] not in rows:  # a second table is another tool run pasted after: keep the first
                rows[words[0]] = (words[1:], line)
            continue
        if _DSCP_ROW.match(stripped) or _TC.match(stripped) or _TC_PRIORITY.match(stripped):
            continue
        match = _KEY_VALUE.match(stripped)
        if match is None:
            raise ParseError(line.no, line.text, "not a line of mlnx_qos output")
        keys.setdefault(match.group(1).strip(), (match.group(2).strip(), line))
    if "Priority trust state" not in keys:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no mlnx_qos output (a 'Priority trust state:' line)")
    trust, trust_line = keys["Priority trust state"]
    if trust.lower() not in _TRUST_STATES:
        raise ParseError(trust_line.no, trust_line.text, f"trust state {trust!r} is not pcp or dscp")
    end = last_nonblank(all_lines)
    if "priority" not in rows or "enabled" not in rows:
        raise ParseError(end.no, end.text, "mlnx_qos output ends before its PFC 'priority'/'enabled' rows")
    # Typed step.
    priorities = _numbers(*rows["priority"], "priority")
    enabled = _numbers(*rows["enabled"], "enabled")
    buffers = _numbers(*rows["buffer"], "buffer") if "buffer" in rows else None
    for name, values in (("enabled", enabled), ("buffer", buffers)):
        if values is not None and len(values) < len(priorities):
            row_line = rows[name][1]
            raise ParseError(row_line.no, row_line.text,
                             f"PFC {name} row has {len(values)} of {len(priorities)} values")
    if any(value not in (0, 1) for value in enabled):
        row_line = rows["enabled"][1]
        raise ParseError(row_line.no, row_line.text, "PFC enabled values are not 0/1")
    pfc = [PfcPriority(p, enabled[i] == 1, buffers[i] if buffers is not None else None)
           for i, p in enumerate(priorities)]
    dcbx = keys.get("DCBX mode")
    return MlnxQos(dcbx[0] if dcbx else None, trust.lower(), pfc)


def _numbers(words: list[str], line: Line, what: str) -> list[int]:
    if not words or not all(word.isdigit() for word in words):
        raise ParseError(line.no, line.text, f"PFC {what} row is not a row of numbers")
    return [int(word) for word in words]
