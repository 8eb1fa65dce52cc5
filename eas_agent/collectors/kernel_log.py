"""The node's kernel log, read from ``/dev/kmsg`` once per cycle: the GPU driver's XIDs with the kernel's own
time, and the NVSwitch driver's SXIDs, which NVML's XID events never carry (docs/decisions/0037).

Why ``/dev/kmsg`` (Documentation/ABI/testing/dev-kmsg): every ``read()`` returns one record, non-blocking
reads answer EAGAIN when none is left, so a cycle costs a few system calls and no process; a new open starts
at the oldest record the kernel still holds, so an agent that restarts reads again what was logged while it
was down (XIDs included), and needs no cursor file; each record has a sequence number (records the kernel
overwrote before they were read show as a gap: counted ``lost``) and its time since boot.

An XID's time is the record's stamp moved onto the agent's wall clock: ``now - (CLOCK_MONOTONIC now -
stamp)``. The stamp is the kernel's ``local_clock()``, which like CLOCK_MONOTONIC does not advance in suspend;
on a server that never suspends the two agree to well under a second (docs/decisions/0033). A time after
``now`` is taken as ``now``.

The agent reads the device as its own user: under ``kernel.dmesg_restrict=1`` (the default on current
Ubuntu and others) opening it needs CAP_SYSLOG, which the eas-agent unit grants as an ambient capability, and
the unit's device policy must allow it (roles/eas_agent/templates/eas-agent.service.j2). Where it cannot be
read (no such device in a container, permission denied, a path that is not the kernel's log device 1:11) the
reading says why, the cycle goes on without it, and the open is tried again every :data:`REOPEN_AFTER_S`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from eas_agent.kernel_log import FATAL, SxidLine, XidLine, kernel_line

KMSG_PATH = "/dev/kmsg"
KMSG_DEVICE = (1, 11)  # Documentation/admin-guide/devices.txt: char 1:11, /dev/kmsg
READ_SIZE = 16384  # one record: at most ~1 KiB of text and its dictionary; a buffer too short fails EINVAL
MAX_RECORDS_PER_CYCLE = 512  # ~12-25 us a record here: a full ring buffer or a storm takes a few cycles
MAX_GPUS = 64  # XIDs are kept per GPU bus id; the kernel names no more GPUs than a node has
REOPEN_AFTER_S = 30.0


@dataclass(frozen=True)
class KernelXid:
    xid: int
    at: float  # the record's time on the agent's wall clock
    detail: str


@dataclass(frozen=True)
class SxidEvent:
    switch: str
    pci: str
    sxid: int
    severity: str
    detail: str
    at: float


@dataclass(frozen=True)
class KernelLogReading:
    """What the node's kernel log held, as far as read: each GPU's latest XID (by its (domain, bus, device)),
    the latest fatal SXID, SXIDs by severity, records overwritten before they were read, and ``failure``
    (None: the log was read this cycle)."""

    xids: Mapping[tuple[int, int, int], KernelXid] = field(default_factory=lambda: MappingProxyType({}))
    fatal_sxid: SxidEvent | None = None
    sxids: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))
    lost: int = 0
    failure: str | None = None

    @property
    def error(self) -> str | None:
        return self.failure


def _monotonic() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


def _open_failure(path: str, exc: OSError) -> str:
    if exc.errno == errno.ENOENT:
        return f"{path}: no such device (no kernel log to read here)"
    if exc.errno in (errno.EACCES, errno.EPERM):
        return (f"{path}: permission denied (reading it needs CAP_SYSLOG where kernel.dmesg_restrict=1, and the "
                "unit's DeviceAllow)")
    return f"{path}: {exc.strerror or exc}"


class KernelLog:
    """The node's kernel log, read once per cycle by the agent (:meth:`collect`); every IU's verdict reads the
    same :class:`KernelLogReading`.

    ``device``: the (major, minor) the path must be; None accepts any open file that returns one record per
    read (a test's SOCK_SEQPACKET socket)."""

    name = "kernel_log"

    def __init__(self, path: str = KMSG_PATH, *, device: tuple[int, int] | None = KMSG_DEVICE,
                 monotonic: Callable[[], float] = _monotonic, opener: Callable[[str], int] | None = None):
        self.path, self.device, self.monotonic = path, device, monotonic
        self.opener = opener or (lambda p: os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC))
        self.fd: int | None = None
        self.retry_at: float | None = None
        self.failure: str | None = None
        self.last_seq: int | None = None
        self.xids: dict[tuple[int, int, int], KernelXid] = {}
        self.fatal_sxid: SxidEvent | None = None
        self.sxids: Counter[str] = Counter()
        self.lost = 0
        self.malformed = 0  # reads that were not a record: counted, never acted on

    def _open(self) -> None:
        try:
            fd = self.opener(self.path)
        except OSError as exc:
            self._fail(_open_failure(self.path, exc))
            return
        if self.device is not None:
            st = os.fstat(fd)
            found = (os.major(st.st_rdev), os.minor(st.st_rdev)) if stat.S_ISCHR(st.st_mode) else None
            if found != self.device:
                os.close(fd)
                what = f"char device {found[0]}:{found[1]}" if found else "not a character device"
                self._fail(f"{self.path}: {what}, not the kernel log (char {self.device[0]}:{self.device[1]})")
                return
        self.fd, self.failure, self.retry_at = fd, None, None

    def _fail(self, failure: str) -> None:
        self.close()
        self.failure, self.retry_at = failure, self.monotonic() + REOPEN_AFTER_S

    def collect(self, now: float) -> KernelLogReading:
        if self.fd is None and (self.retry_at is None or self.monotonic() >= self.retry_at):
            self._open()
        if self.fd is not None:
            self._read(now)
        return self.reading()

    def failed(self, now: float, error: str) -> KernelLogReading:
        return self.reading(error)

    def reading(self, failure: str | None = None) -> KernelLogReading:
        return KernelLogReading(MappingProxyType(dict(self.xids)), self.fatal_sxid, MappingProxyType(dict(self.sxids)),
                                self.lost, failure or self.failure)

    def _read(self, now: float) -> None:
        mono = self.monotonic()
        for _ in range(MAX_RECORDS_PER_CYCLE):
            try:
                raw = os.read(self.fd, READ_SIZE)
            except BlockingIOError:  # EAGAIN: every record read
                return
            except BrokenPipeError:  # EPIPE: the kernel overwrote records since the last read; the next read
                continue  # goes on from the oldest kept (the sequence gap counts them)
            except OSError as exc:
                self._fail(f"{self.path}: read failed: {exc.strerror or exc}")
                return
            if not raw:  # end of file: whatever this is, it is not the kernel's log device
                self._fail(f"{self.path}: end of file (not the kernel log)")
                return
            self._take(raw, now, mono)

    def _take(self, raw: bytes, now: float, mono: float) -> None:
        parsed = kernel_line(raw)
        if parsed is None:
            self.malformed += 1
            return
        record, line = parsed
        if self.last_seq is not None:
            if record.seq <= self.last_seq:  # read again after a reopen
                return
            self.lost += record.seq - self.last_seq - 1
        self.last_seq = record.seq
        if line is None:
            return
        at = min(now, now - (mono - record.usec / 1e6))
        if isinstance(line, XidLine):
            if line.pci in self.xids or len(self.xids) < MAX_GPUS:
                self.xids[line.pci] = KernelXid(line.xid, at, line.detail)
        elif isinstance(line, SxidLine) and line.severity is not None:
            self.sxids[line.severity] += 1
            if line.severity == FATAL:
                self.fatal_sxid = SxidEvent(line.switch, line.pci, line.sxid, line.severity, line.detail, at)

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            os.close(fd)
