"""The kernel log records the agent acts on: the NVIDIA GPU driver's ``NVRM: Xid`` lines and the NVSwitch
driver's ``SXid`` lines, parsed from ``/dev/kmsg`` records. Pure: bytes in, typed records or None out.

A ``/dev/kmsg`` record (Documentation/ABI/testing/dev-kmsg) is ``PRIO,SEQ,TIMESTAMP,FLAGS[,...];MESSAGE\\n``
followed by zero or more continuation lines `` KEY=value\\n`` (the device the message came from).
``PRIO`` is ``facility * 8 + level``; ``TIMESTAMP`` is microseconds since boot on the kernel's
``local_clock()``; the message has its non-printable bytes escaped as ``\\xNN``.

**Only kernel messages count.** Anyone allowed to write ``/dev/kmsg`` can append a record, but the kernel
gives a record written from user space the LOG_USER facility unless the writer names another one, and never
LOG_KERN (kernel/printk/printk.c ``devkmsg_write``: "we enforce LOG_USER, to be able to reliably distinguish
kernel-generated messages from userspace-injected ones"). A record whose facility is not 0 is therefore
never an XID or an SXID here, whatever its text says: a process on the node cannot take units out of
rotation, or hide a fault, by writing to the log.

The two line shapes, as the drivers print them:

- ``NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.``: the GPU
  driver's ``Xid (PCI:DOMAIN:BUS:DEVICE): NUMBER, ...`` (NVIDIA "XID Errors"; the bus id without the function).
- ``nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error
  (First)``: the NVSwitch driver's ``NVSWITCH_PRINT_SXID`` (open-gpu-kernel-modules
  src/common/nvswitch/kernel/inc/common_nvswitch.h: ``"nvidia-%s: SXid (PCI:" NVLINK_PCI_DEV_FMT "): %05d, "``),
  whose callers put the severity first: ``Fatal, ``, ``Non-fatal, `` or ``Correctable, `` (intr_nvswitch.h
  ``NVSWITCH_REPORT_FATAL`` / ``_NONFATAL`` / ``_CORRECTABLE``, error_nvswitch.h). Other SXid lines carry a
  preceding error's data (``12028, Data {0x000001c0, ...}``, ``10002, Severity 5 Engine instance 00 ...``):
  they parse with severity None and are no event of their own.

Strict: a line that does not match its shape exactly (a number out of range, a bus id of the wrong width, an
unknown severity word) is not a record. Nothing here raises on any input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_XID = 2**32 - 1  # the score body's xid_last range (eas_wire/scorebody.py)
MAX_DETAIL = 200  # of the driver's text after the number, what a reason quotes
KERNEL_FACILITY = 0  # LOG_KERN
FATAL, NON_FATAL, CORRECTABLE = "fatal", "non-fatal", "correctable"
_SEVERITIES = {"Fatal": FATAL, "Non-fatal": NON_FATAL, "Correctable": CORRECTABLE}

_HEADER = re.compile(r"([0-9]{1,10}),([0-9]{1,20}),([0-9]{1,20}),[^;\n]*")
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\): ([0-9]{1,10})(?:, (.*))?")
_SXID = re.compile(
    r"nvidia-(nvswitch[0-9]{1,4}): SXid \(PCI:([0-9a-fA-F]{4}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])\): "
    r"([0-9]{1,10}), (.*)"
)
_SEVERITY = re.compile(r"(Fatal|Non-fatal|Correctable), (.*)")


@dataclass(frozen=True)
class KmsgRecord:
    level: int  # 0 (emerg) .. 7 (debug)
    facility: int  # 0: the kernel's own
    seq: int  # the record's sequence number, one per record since boot
    usec: int  # microseconds since boot, the kernel's local_clock()
    message: str


@dataclass(frozen=True)
class XidLine:
    pci: tuple[int, int, int]  # the GPU's (domain, bus, device)
    xid: int
    detail: str


@dataclass(frozen=True)
class SxidLine:
    switch: str  # the driver's device name, e.g. nvswitch3
    pci: str  # the switch's bus id, 0000:86:00.0
    sxid: int
    severity: str | None  # FATAL, NON_FATAL, CORRECTABLE; None: a data line of an earlier SXid
    detail: str


def parse_record(raw: bytes) -> KmsgRecord | None:
    """One ``read()`` of ``/dev/kmsg``; None when it is not a well-formed record."""
    text = raw.decode("utf-8", "replace")
    head, sep, rest = text.partition(";")
    match = _HEADER.fullmatch(head) if sep else None
    if match is None:
        return None
    prio, seq, usec = (int(group) for group in match.groups())
    message = rest.split("\n", 1)[0]  # the continuation lines (" KEY=value") are not the message
    return KmsgRecord(level=prio & 7, facility=prio >> 3, seq=seq, usec=usec, message=message)


def parse_line(message: str) -> XidLine | SxidLine | None:
    """An XID or SXID line of a kernel message, or None."""
    if message.startswith("NVRM: Xid "):
        return _xid(message)
    if message.startswith("nvidia-nvswitch"):
        return _sxid(message)
    return None


def _xid(message: str) -> XidLine | None:
    match = _XID.fullmatch(message)
    if match is None:
        return None
    domain, bus, device, number, detail = match.groups()
    xid = int(number)
    if not 0 < xid <= MAX_XID:
        return None
    return XidLine((int(domain, 16), int(bus, 16), int(device, 16)), xid, (detail or "")[:MAX_DETAIL])


def _sxid(message: str) -> SxidLine | None:
    match = _SXID.fullmatch(message)
    if match is None:
        return None
    switch, domain, bus, device, function, number, rest = match.groups()
    sxid = int(number)
    if not 0 < sxid <= MAX_XID:
        return None
    severity_match = _SEVERITY.fullmatch(rest)
    severity, detail = (_SEVERITIES[severity_match[1]], severity_match[2]) if severity_match else (None, rest)
    pci = f"{domain.lower()}:{bus.lower()}:{device.lower()}.{function}"
    return SxidLine(switch, pci, sxid, severity, detail[:MAX_DETAIL])


def kernel_line(raw: bytes) -> tuple[KmsgRecord, XidLine | SxidLine | None] | None:
    """A record and, when the kernel itself logged it, its XID or SXID line; None: not a record."""
    record = parse_record(raw)
    if record is None:
        return None
    return record, parse_line(record.message) if record.facility == KERNEL_FACILITY else None


def pci_of_nvml(bus_id: str | bytes | None) -> tuple[int, int, int] | None:
    """NVML's ``busId`` (``00000000:18:00.0``; nvidia-ml-py gives bytes or str by version) as the (domain, bus,
    device) an XID line names; None when it is not one."""
    if isinstance(bus_id, bytes):
        bus_id = bus_id.decode("ascii", "replace")
    if not isinstance(bus_id, str):
        return None
    match = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.[0-7]", bus_id.strip("\x00 "))
    if match is None:
        return None
    return int(match[1], 16), int(match[2], 16), int(match[3], 16)
