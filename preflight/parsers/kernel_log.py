"""Kernel log lines, in every format preflight reads them, and the NVIDIA driver's XID events in them.

:func:`read` is the raw step every kernel-log parser shares (``kernel-links`` in :mod:`ib_health`, and
``kernel-xids`` here): each non-blank line must carry one of these prefixes, or be a journalctl
``-- ... --`` marker; counting zero events because the stamps were not understood is the false pass
this guards against.

- BSD syslog (RFC 3164, journalctl's default ``short``, /var/log/syslog on older hosts):
  ``Jun 10 08:16:17 host kernel: ...`` (no year: the latest year that puts the line at or before ``now``,
  read as UTC: the host's zone is not the controller's);
- RFC 3339 (rsyslog ``RSYSLOG_FileFormat``, default on Ubuntu 24.04 / RHEL 9; ``journalctl -o
  short-iso``): ``2024-06-10T08:16:17.123456+00:00 host kernel: ...`` (``+0000`` and ``Z`` too);
- ``dmesg`` (util-linux, the ring buffer of this boot): ``[ 5029.881102] ...`` (seconds since boot: no
  wall time, ``epoch`` null) and ``dmesg -T``: ``[Mon Jun 10 09:40:02 2024] ...``.

``kernel-xids``: ``NVRM: Xid (PCI:0000:1b:00): 79, pid=..., GPU has fallen off the bus.`` lines, the
format of the NVIDIA driver's ``nvErrorLog`` (kernel-open/nvidia/nv.c ``nv_report_error``; the NVIDIA
"XID Errors" document quotes it)::

    {"xids": [{"xid": 79, "pci": "0000:1b:00", "bus": "1b", "epoch": 1718011202.0, "line": 3,
      "text": "NVRM: Xid (PCI:0000:1b:00): 79, pid=0, GPU has fallen off the bus."}], "lines_read": 3}

Usage::

    from preflight.parsers import kernel_log
    for event in kernel_log.parse_xids(text).xids:
        event.bus, event.xid                      # ('1b', 79)

``-- No entries --`` alone is an empty window (no lines, no events): journalctl printing that is real, as
long as journalctl read the whole journal. :func:`journal_gap` reads its stderr for the words that say it
did not (systemd's journal-util.c, ``journal_access_check_and_warn``): a user outside the
``systemd-journal`` group and the journal ACL's groups (``adm`` on Ubuntu) reads only its own user journal
and gets ``Hint: You are currently not seeing messages from other users and the system.`` (a notice, exit
0, silenced by ``-q``); no journal readable at all is ``No journal files were opened due to insufficient
permissions.`` (exit 1); no journal at all ``No journal files were found.`` (exit 0). The kernel's messages
are in the system journal only, so each of these means the window was not read.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone

from preflight.parsers.common import Line, ParseError, first_nonblank, lines, shell_prompt

# Between the fields of a stamp any run of spaces or tabs (a pasted log often has a tab for a space).
_RFC3339 = re.compile(
    r"^(\d{4}-\d{2}-\d{2})(?:T|\s+)(\d{2}:\d{2}:\d{2})(\.\d+)?(Z|[+-]\d{2}:?\d{2})\s+(\S+)\s+(.*)$")
_BSD = re.compile(r"^([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{2}:\d{2}:\d{2})\s+(\S+)\s+(.*)$")
_DMESG = re.compile(r"^\[\s*(\d+\.\d+)\]\s?(.*)$")
_DMESG_T = re.compile(r"^\[[A-Z][a-z]{2}\s+([A-Z][a-z]{2})\s+(\d{1,2})\s+(\d{2}:\d{2}:\d{2})\s+(\d{4})\]\s?(.*)$")
_MONTHS = {m: i for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"), start=1)}
# journalctl's words when it did not read the system journal (journal-util.c; see journal_gap()).
_JOURNAL_GAP = re.compile(r"not seeing messages from|No journal files were|insufficient permissions")
_XID = re.compile(r"NVRM:\s+Xid\s+\((?:PCI:)?([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}(?::[0-9A-Fa-f]{2}(?:\.\d)?)?)\):\s+(\d+)")


@dataclass(frozen=True)
class LogLine:
    no: int
    epoch: float | None  # wall time; None for dmesg's seconds since boot
    message: str  # what follows the stamp (and the host name, for syslog formats)
    line: Line


def read(text: str, now: float | None = None) -> list[LogLine]:
    """Every kernel log line of ``text`` (raw step); ParseError on a line that is not one."""
    now = time.time() if now is None else now
    all_lines = lines(text)
    read_lines: list[LogLine] = []
    marker = None
    for line in all_lines:
        stripped = line.text.strip()
        if not stripped or shell_prompt(stripped):  # a pasted prompt line: reported by paste_warnings
            continue
        if stripped.startswith("-- ") and stripped.endswith("--"):
            marker = marker or line
            continue
        if m := _RFC3339.match(stripped):
            read_lines.append(LogLine(line.no, _rfc3339(m), m.group(6), line))
        elif m := _BSD.match(stripped):
            read_lines.append(LogLine(line.no, _bsd(m.group(1), m.group(2), m.group(3), now, line), m.group(5), line))
        elif m := _DMESG_T.match(stripped):
            year = int(m.group(4))
            read_lines.append(LogLine(line.no, _stamp(year, m.group(1), m.group(2), m.group(3), line), m.group(5), line))
        elif m := _DMESG.match(stripped):
            read_lines.append(LogLine(line.no, None, m.group(2), line))
        else:
            raise ParseError(line.no, line.text, "not a kernel log line (syslog, RFC 3339 or dmesg timestamp)")
    if not read_lines:
        if marker is not None and "No entries" in marker.text:
            return []  # journalctl had nothing in the window: no lines, and that is real
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no kernel log lines")
    return read_lines


def no_entries(text: str) -> bool:
    """journalctl's answer when nothing in the window matched: nothing at all (``-q``) or ``-- No entries --``."""
    content = [line.text.strip() for line in lines(text) if line.text.strip()]
    return content in ([], ["-- No entries --"])


def journal_gap(stderr: str) -> str | None:
    """The line of journalctl's ``stderr`` saying it did not read the system journal, or None when it did."""
    for line in lines(stderr):
        if _JOURNAL_GAP.search(line.text):
            return line.text.strip()
    return None


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


def _stamp(year: int, month_name: str, day: str, hms_text: str, line: Line) -> float:
    month = _MONTHS.get(month_name)
    if month is None:
        raise ParseError(line.no, line.text, f"unknown month {month_name!r}")
    hms = [int(x) for x in hms_text.split(":")]
    try:
        return datetime(year, month, int(day), *hms, tzinfo=UTC).timestamp()
    except ValueError:
        raise ParseError(line.no, line.text, "not a valid date") from None


def _bsd(month_name: str, day: str, hms_text: str, now: float, line: Line) -> float:
    # BSD stamps have no year: the latest that is not in the future (a day of slack for zones).
    year = datetime.fromtimestamp(now, UTC).year
    for candidate in (year, year - 1):
        try:
            stamp = _stamp(candidate, month_name, day, hms_text, line)
        except ParseError as exc:
            if "unknown month" in exc.message:
                raise
            continue  # Feb 29 of a non-leap year
        if stamp <= now + 86400:
            return stamp
    raise ParseError(line.no, line.text, "date not valid in this or last year")


# ------------------------------------------------------------------------------------------ XIDs


def short_bus(bus_id: str) -> str:
    """The PCI bus number: 00000000:1B:00.0 (nvidia-smi), 0000:1b:00 or 1b:00 (kernel log) -> '1b'.

    The bus alone is what every spelling has in common (each GPU sits on its own bus behind its switch).
    """
    parts = bus_id.lower().split(":")
    return parts[1] if len(parts) >= 3 else parts[0]


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci: str  # as printed: 0000:1b:00
    epoch: float | None
    line: int
    text: str

    @property
    def bus(self) -> str:
        return short_bus(self.pci)

    def to_json(self) -> dict:
        return {"xid": self.xid, "pci": self.pci, "bus": self.bus, "epoch": self.epoch, "line": self.line,
                "text": self.text}


@dataclass(frozen=True)
class KernelXids:
    xids: list[XidEvent]
    lines_read: int

    def to_json(self) -> dict:
        return {"xids": [x.to_json() for x in self.xids], "lines_read": self.lines_read}


def parse_xids(text: str, now: float | None = None) -> KernelXids:
    read_lines = read(text, now)
    events = []
    for entry in read_lines:
        if match := _XID.search(entry.message):
            events.append(XidEvent(int(match.group(2)), match.group(1), entry.epoch, entry.no,
                                   entry.message[match.start():match.start() + 200].strip()))
    return KernelXids(events, len(read_lines))
