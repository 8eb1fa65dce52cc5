"""Parser for ``ibstat`` (infiniband-diags / rdma-core), every CA and port.

Usage::

    from preflight.parsers import ibstat
    status = ibstat.parse(text)
    port = status.port("mlx5_0", 1)
    port.state, port.rate_gbps, port.link_layer     # ('Active', 400, 'InfiniBand')

Schema (``IbStat.to_json()``, the contract's ``ibstat`` shape)::

    {"cas": [{"name": "mlx5_0", "ports": [{"port": 1, "state": "Active", "physical_state": "LinkUp",
      "rate_gbps": 400, "link_layer": "InfiniBand", "base_lid": 12}]}]}

``rate_gbps`` is the ``Rate:`` value as printed (an int, or a float for SDR's 2.5); RoCE ports print
``Link layer: Ethernet`` and ``Base lid: 0``. A down port prints ``State: Down`` and its physical state
(``Disabled``, ``Polling``); its rate is the last negotiated or the lowest and means nothing.

Real example (ConnectX-7 NDR, OFED 23.10)::

    CA 'mlx5_0'
            CA type: MT4129
            Number of ports: 1
            Firmware version: 28.39.1002
            Hardware version: 0
            Node GUID: 0x58a2e10300dae626
            System image GUID: 0x58a2e10300dae626
            Port 1:
                    State: Active
                    Physical state: LinkUp
                    Rate: 400
                    Base lid: 12
                    LMC: 0
                    SM lid: 1
                    Capability mask: 0xa651e848
                    Port GUID: 0x58a2e10300dae626
                    Link layer: InfiniBand

Lines that ibstat's libraries write to stderr (``ibwarn:``, ``ibpanic:``) may be interleaved and are
skipped. A CA with fewer ``Port N:`` blocks than its ``Number of ports`` (or a port missing its ``Link
layer``, the last key printed) is a truncated output and raises ParseError naming the last line read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_complete,
    lines,
    split_key_value,
    to_number,
)

_CA = re.compile(r"^\s*CA '([^']+)'\s*$")
_PORT = re.compile(r"^\s*Port (\d+):\s*$")
_NOISE = re.compile(r"^\s*(ibwarn|ibpanic|ibdebug|ibstat):")


@dataclass(frozen=True)
class IbPort:
    port: int
    state: str | None
    physical_state: str | None
    rate_gbps: int | float | None
    link_layer: str | None
    base_lid: int | None
    sm_lid: int | None = None
    port_guid: str | None = None

    def to_json(self) -> dict:
        return {"port": self.port, "state": self.state, "physical_state": self.physical_state,
                "rate_gbps": self.rate_gbps, "link_layer": self.link_layer, "base_lid": self.base_lid}


@dataclass(frozen=True)
class IbCa:
    name: str
    ca_type: str | None
    firmware_version: str | None
    ports: list[IbPort]

    def to_json(self) -> dict:
        return {"name": self.name, "ports": [port.to_json() for port in self.ports]}


@dataclass(frozen=True)
class IbStat:
    cas: list[IbCa]

    def ca(self, name: str) -> IbCa | None:
        return next((ca for ca in self.cas if ca.name == name), None)

    def port(self, ca_name: str, port: int = 1) -> IbPort | None:
        ca = self.ca(ca_name)
        return next((p for p in ca.ports if p.port == port), None) if ca else None

    def to_json(self) -> dict:
        return {"cas": [ca.to_json() for ca in self.cas]}


def parse(text: str) -> IbStat:
    all_lines = [line for line in lines(text) if not _NOISE.match(line.text)]
    if not any(_CA.match(line.text) for line in all_lines):
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no ibstat output (a line \"CA 'mlx5_0'\")")
    return last_complete(_runs(all_lines), _parse_run)


def _runs(all_lines: list[Line]) -> list[list[Line]]:
    """A CA name seen again starts another ibstat output (several pasted together)."""
    runs: list[list[Line]] = [[]]
    seen: set[str] = set()
    for line in all_lines:
        match = _CA.match(line.text)
        if match and match.group(1) in seen:
            runs.append([])
            seen = set()
        if match:
            seen.add(match.group(1))
        runs[-1].append(line)
    return runs


def _parse_run(run: list[Line]) -> IbStat:
    # Raw step: CA -> {"keys": {...}, "ports": {n: {...}}} with values as printed.
    raw: list[tuple[Line, dict, dict[int, tuple[Line, dict]]]] = []
    current_port: dict | None = None
    last_read = first_nonblank(run)
    for line in run:
        if not line.text.strip():
            continue
        ca = _CA.match(line.text)
        if ca:
            raw.append((line, {"name": ca.group(1)}, {}))
            current_port = None
            last_read = line
            continue
        if not raw:
            continue  # a prompt or a command line before the first CA
        port = _PORT.match(line.text)
        if port:
            current_port = {}
            raw[-1][2][int(port.group(1))] = (line, current_port)
            last_read = line
            continue
        pair = split_key_value(line.text)
        if pair is None:
            continue  # a shell prompt or another command's line; a cut output is caught by the counts below
        (current_port if current_port is not None else raw[-1][1])[pair[0]] = (pair[1], line)
        last_read = line
    return IbStat([_typed_ca(ca_line, keys, ports, last_read) for ca_line, keys, ports in raw])


def _typed_ca(ca_line: Line, keys: dict, ports: dict[int, tuple[Line, dict]], last_read: Line) -> IbCa:
    expected = keys.get("Number of ports")
    if expected is not None and len(ports) < int(to_number(expected[0], expected[1], "Number of ports")):
        raise ParseError(last_read.no, last_read.text,
                         f"ibstat output ends with {len(ports)} of {expected[0]} ports of {keys['name']}")
    typed_ports = []
    for number, (_port_line, values) in sorted(ports.items()):
        if "Link layer" not in values:
            raise ParseError(last_read.no, last_read.text,
                             f"ibstat output ends inside port {number} of {keys['name']}")
        typed_ports.append(IbPort(
            port=number,
            state=_text(values, "State"),
            physical_state=_text(values, "Physical state"),
            rate_gbps=_number(values, "Rate"),
            link_layer=_text(values, "Link layer"),
            base_lid=_int(values, "Base lid"),
            sm_lid=_int(values, "SM lid"),
            port_guid=_text(values, "Port GUID"),
        ))
    return IbCa(keys["name"], _text(keys, "CA type"), _text(keys, "Firmware version"), typed_ports)


def _text(values: dict, key: str) -> str | None:
    return values[key][0] if key in values else None


def _number(values: dict, key: str) -> int | float | None:
    if key not in values:
        return None
    token, line = values[key]
    return to_number(token, line, key)


def _int(values: dict, key: str) -> int | None:
    if key not in values:
        return None
    token, line = values[key]
    try:
        return int(token, 0)  # LIDs print in decimal; accept 0x.. as some wrappers reformat them
    except ValueError:
        raise ParseError(line.no, line.text, f"{key} is not an integer ({token!r})") from None
