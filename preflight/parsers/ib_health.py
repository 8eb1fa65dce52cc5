"""Parsers for the IB link-health inputs: ``grep -H`` of sysfs files, ``mlxlink -c`` and kernel link events.

``sysfs``  ``grep -H . FILE...`` (what preflight runs to read sysfs counters and PCIe link attributes in
one command)::

    {"values": {"/sys/class/infiniband/mlx5_0/ports/1/counters/link_downed": "0"}}

``mlxlink``  ``mlxlink -d <dev> -c`` (MFT / mstflint), the "Physical Counters and BER Info" section::

    {"state": "Active", "effective_ber": 1.5e-254, "raw_ber": 1e-13, "effective_errors": 0,
     "link_down_counter": 0, "link_error_recovery_counter": 0}

Layout: ``Key : value`` under a section title and a dashed rule (mlxlink's printer, see
Mellanox/mstflint mlxlink_cables_commander / mlxlink_commander.cpp: BER printed as ``<coef>E-<magnitude>``).

``kernel-links``  kernel log lines (``journalctl -k``, ``/var/log/syslog``, ``/var/log/messages``) with
the link state changes of InfiniBand/RoCE netdevs, read by :func:`preflight.parsers.kernel_log.read`
(BSD syslog or RFC 3339 stamps; a dmesg line, seconds since boot, cannot be placed in the flap window and
is a ParseError).

Events: ``<netdev>: lost carrier`` (IPoIB, what azurehpc-health-checks counts), ``mlx5_core <bdf>
<netdev>: Link down`` / ``Link up`` (mlx5e), ``<netdev>: link becomes ready`` (up), in any case (azurehpc
greps them with ``-i``)::

    {"events": [{"time": "2024-06-10T08:16:17+00:00", "epoch": 1718007377.0, "device": "ibp26s0",
      "bdf": null, "state": "down", "line": 12}]}

Every non-blank line must carry one of the timestamps (or be a journalctl ``-- ... --`` marker):
counting zero events because the timestamps were not understood is the known false pass this guards.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime

from preflight.parsers import kernel_log
from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_nonblank,
    lines,
    shell_prompt,
    to_number,
)

# ------------------------------------------------------------------------------------------ sysfs

_GREP = re.compile(r"^(/\S+?):(.*)$")


@dataclass(frozen=True)
class SysfsValues:
    values: dict[str, str]

    def get(self, path: str) -> str | None:
        return self.values.get(path)

    def to_json(self) -> dict:
        return {"values": dict(self.values)}


def parse_sysfs(text: str) -> SysfsValues:
    all_lines = lines(text)
    values: dict[str, str] = {}
    for line in all_lines:
        if not line.text.strip() or shell_prompt(line.text):
            continue
        match = _GREP.match(line.text.strip())
        if not match:
            raise ParseError(line.no, line.text, "not a 'path:value' line of grep -H")
        values[match.group(1)] = match.group(2).strip()
    if not values:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no grep -H output (a '/sys/...:value' line)")
    return SysfsValues(values)


def counter_values(values: SysfsValues) -> dict[str, int | None]:
    """Path -> counter (the decimal sysfs counters of /sys/class/infiniband/*/ports/*/counters), None for
    a value that is not one (an unreadable counter is reported, never taken as 0)."""
    return {path: int(value) if value.isdigit() else None for path, value in values.values.items()}


# PCI Express transfer rate per generation, as the kernel prints it in current/max_link_speed
# (drivers/pci/pci-sysfs.c, pci_speed_string(): "32.0 GT/s PCIe").
_GTS_GEN = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
PCIE_LINK_FILES = ("current_link_speed", "current_link_width", "max_link_speed", "max_link_width")


@dataclass(frozen=True)
class PcieLinkState:
    """A PCIe device's link attributes from sysfs, typed: generation and width (None: not printed or not
    a value the kernel prints, e.g. "Unknown" for a link that is down)."""

    gen: int | None
    gen_max: int | None
    width: int | None
    width_max: int | None


def pcie_link(values: SysfsValues, device_dir: str) -> PcieLinkState:
    """The typed link of the device whose sysfs directory is ``device_dir`` (``/sys/.../device``)."""
    def text(name: str) -> str:
        return values.get(f"{device_dir}/{name}") or ""

    def gen(name: str) -> int | None:
        return _GTS_GEN.get(text(name).split()[0]) if text(name).split() else None

    def width(name: str) -> int | None:
        return int(text(name)) if text(name).isdigit() else None

    return PcieLinkState(gen("current_link_speed"), gen("max_link_speed"), width("current_link_width"),
                    width("max_link_width"))


# ---------------------------------------------------------------------------------------- mlxlink

_BER = re.compile(r"^(\d+(?:\.\d+)?)E([-+]?\d+)$", re.IGNORECASE)
_SECTION = "Physical Counters and BER Info"


@dataclass(frozen=True)
class MlxlinkBer:
    state: str | None
    effective_ber: float | None
    raw_ber: float | None
    effective_errors: int | None
    link_down_counter: int | None
    link_error_recovery_counter: int | None

    def to_json(self) -> dict:
        return dict(self.__dict__)


def _ber(token: str, line: Line) -> float | None:
    token = token.strip()
    if token in ("N/A", ""):
        return None
    match = _BER.match(token)
    if not match:
        raise ParseError(line.no, line.text, f"BER is not <coef>E-<magnitude> ({token!r})")
    # "15E-255" is 15 x 10^-255: below float's range it is 0.0, which is what it means (no errors).
    return float(match.group(1)) * 10.0 ** int(match.group(2))


def parse_mlxlink(text: str) -> MlxlinkBer:
    all_lines = lines(text)
    section = None
    keys: dict[tuple[str | None, str], tuple[str, Line]] = {}
    for i, line in enumerate(all_lines):
        stripped = line.text.strip()
        if not stripped or set(stripped) == {"-"}:
            continue
        key, colon, value = stripped.partition(":")
        if not colon:
            nxt = all_lines[i + 1].text.strip() if i + 1 < len(all_lines) else ""
            if nxt and set(nxt) == {"-"}:
                section = stripped
            continue
        keys[(section, key.strip())] = (value.strip(), line)
    if not any(s == _SECTION for s, _ in keys):
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, f"no mlxlink '{_SECTION}' section (run mlxlink -c)")
    end = last_nonblank(all_lines)
    if (_SECTION, "Effective Physical BER") not in keys:
        raise ParseError(end.no, end.text, "mlxlink output ends before 'Effective Physical BER'")

    def count(name: str) -> int | None:
        item = keys.get((_SECTION, name))
        if item is None or item[0] in ("N/A", ""):
            return None
        return int(to_number(item[0], item[1], name))

    raw = keys.get((_SECTION, "Raw Physical BER"))
    state = keys.get(("Operational Info", "State"))
    return MlxlinkBer(
        state=state[0] if state else None,
        effective_ber=_ber(*keys[(_SECTION, "Effective Physical BER")]),
        raw_ber=_ber(*raw) if raw else None,
        effective_errors=count("Effective Physical Errors"),
        link_down_counter=count("Link Down Counter"),
        link_error_recovery_counter=count("Link Error Recovery Counter"),
    )


# ----------------------------------------------------------------------------------- kernel log

# Either case: azurehpc-health-checks counts them with grep -i (the words are the same event); any spaces or
# tabs between the words (a pasted log).
_MLX5 = re.compile(r"mlx5_core\s+(\S+)\s+(\S+):\s+Link\s+(up|down)\b", re.IGNORECASE)
_CARRIER = re.compile(r"\b(\S+):\s+lost\s+carrier\b", re.IGNORECASE)
_READY = re.compile(r"\b(\S+):\s+link\s+becomes\s+ready\b", re.IGNORECASE)


@dataclass(frozen=True)
class LinkEvent:
    epoch: float
    device: str
    bdf: str | None
    state: str  # down | up
    line: int

    def to_json(self) -> dict:
        when = datetime.fromtimestamp(self.epoch, UTC).isoformat(timespec="seconds")
        return {"time": when, "epoch": self.epoch, "device": self.device, "bdf": self.bdf,
                "state": self.state, "line": self.line}


@dataclass(frozen=True)
class LinkEvents:
    events: list[LinkEvent]
    lines_read: int

    def to_json(self) -> dict:
        return {"events": [e.to_json() for e in self.events], "lines_read": self.lines_read}


def parse_kernel_links(text: str, now: float | None = None) -> LinkEvents:
    events: list[LinkEvent] = []
    read_lines = kernel_log.read(text, now)
    for entry in read_lines:
        if entry.epoch is None:  # the flap window is wall time: dmesg's seconds since boot cannot be placed
            raise ParseError(entry.no, entry.line.text, "a dmesg line has no wall-clock time (use journalctl -k)")
        message = entry.message
        if ev := _MLX5.search(message):
            events.append(LinkEvent(entry.epoch, ev.group(2), ev.group(1), ev.group(3).lower(), entry.no))
        elif ev := _CARRIER.search(message):
            events.append(LinkEvent(entry.epoch, ev.group(1), None, "down", entry.no))
        elif ev := _READY.search(message):
            events.append(LinkEvent(entry.epoch, ev.group(1), None, "up", entry.no))
    return LinkEvents(events, len(read_lines))
