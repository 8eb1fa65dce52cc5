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
the link state changes of InfiniBand/RoCE netdevs, in either timestamp format:

- BSD syslog (RFC 3164, journalctl's default ``short``): ``Jun 10 08:16:17 host kernel: ...`` (no year:
  it is the latest year that puts the line at or before ``now``);
- RFC 3339 (rsyslog's ``RSYSLOG_FileFormat``, the default on Ubuntu 24.04 and RHEL 9; journalctl
  ``-o short-iso``): ``2024-06-10T08:16:17.123456+00:00 host kernel: ...`` or ``...+0000``.

Events: ``<netdev>: lost carrier`` (IPoIB, what azurehpc-health-checks counts), ``mlx5_core <bdf>
<netdev>: Link down`` / ``Link up`` (mlx5e), ``<netdev>: link becomes ready`` (up)::

    {"events": [{"time": "2024-06-10T08:16:17+00:00", "epoch": 1718007377.0, "device": "ibp26s0",
      "bdf": null, "state": "down", "line": 12}]}

Every non-blank line must carry one of the timestamps (or be a journalctl ``-- ... --`` marker):
counting zero events because the timestamps were not understood is the known false pass this guards.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from preflight.parsers.common import Line, ParseError, first_nonblank, last_nonblank, lines, to_number

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
        if not line.text.strip():
            continue
        match = _GREP.match(line.text.strip())
        if not match:
            raise ParseError(line.no, line.text, "not a 'path:value' line of grep -H")
        values[match.group(1)] = match.group(2).strip()
    if not values:
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no grep -H output (a '/sys/...:value' line)")
    return SysfsValues(values)


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

_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})[T ](\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})\s+(\S+)\s+(.*)$")
_BSD = re.compile(r"^([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}:\d{2}:\d{2})\s+(\S+)\s+(.*)$")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
_MLX5 = re.compile(r"mlx5_core (\S+) (\S+): Link (up|down)\b", re.IGNORECASE)
_CARRIER = re.compile(r"\b(\S+): lost carrier\b")
_READY = re.compile(r"\b(\S+): link becomes ready\b")


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


def _rfc3339(m: re.Match) -> float:
    zone = m.group(4)
    if zone == "Z":
        tz = UTC
    else:
        sign = 1 if zone[0] == "+" else -1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    stamp = datetime.fromisoformat(f"{m.group(1)}T{m.group(2)}").replace(tzinfo=tz)
    return stamp.timestamp() + float(m.group(3) or 0)


def _bsd(m: re.Match, now: float, line: Line) -> float:
    month = _MONTHS.get(m.group(1))
    if month is None:
        raise ParseError(line.no, line.text, f"unknown month {m.group(1)!r}")
    hms = [int(x) for x in m.group(3).split(":")]
    # BSD stamps are local time without a year: the host's local zone is what the controller's is not, so
    # they are read as UTC and the year is the latest that is not in the future (a day of slack for zones).
    year = datetime.fromtimestamp(now, UTC).year
    for candidate in (year, year - 1):
        try:
            stamp = datetime(candidate, month, int(m.group(2)), *hms, tzinfo=UTC).timestamp()
        except ValueError:
            continue  # Feb 29 of a non-leap year
        if stamp <= now + 86400:
            return stamp
    raise ParseError(line.no, line.text, "date not valid in this or last year")


def parse_kernel_links(text: str, now: float | None = None) -> LinkEvents:
    now = time.time() if now is None else now
    all_lines = lines(text)
    events: list[LinkEvent] = []
    read = 0
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped or (stripped.startswith("-- ") and stripped.endswith("--")):
            continue
        if m := _RFC3339.match(stripped):
            epoch, message = _rfc3339(m), m.group(6)
        elif m := _BSD.match(stripped):
            epoch, message = _bsd(m, now, line), m.group(5)
        else:
            raise ParseError(line.no, line.text, "not a kernel log line with a BSD-syslog or RFC 3339 timestamp")
        read += 1
        if ev := _MLX5.search(message):
            events.append(LinkEvent(epoch, ev.group(2), ev.group(1), ev.group(3).lower(), line.no))
        elif ev := _CARRIER.search(message):
            events.append(LinkEvent(epoch, ev.group(1), None, "down", line.no))
        elif ev := _READY.search(message):
            events.append(LinkEvent(epoch, ev.group(1), None, "up", line.no))
    if read == 0:
        first = first_nonblank(all_lines)
        if first.no != 0 and first.text.strip().startswith("-- ") and "No entries" in first.text:
            return LinkEvents([], 0)  # journalctl had nothing in the window: no events, and that is real
        raise ParseError(first.no, first.text, "no kernel log lines")
    return LinkEvents(events, read)
