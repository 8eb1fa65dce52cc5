"""A kernel log for tests: records written into one end of a SOCK_SEQPACKET socket pair, which, like
``/dev/kmsg`` (Documentation/ABI/testing/dev-kmsg), gives exactly one record per ``read()`` and answers EAGAIN
on a non-blocking read when none is left. The agent's reader opens the other end (``opener``); a reopen gets
a new descriptor on the same stream, as a new open of the device does (it then skips what it read before by
sequence number)."""

from __future__ import annotations

import os
import socket

from eas_agent.collectors.kernel_log import KernelLog

LOG_KERN_ERR = 3  # facility 0 (kernel) * 8 + level 3 (err): the drivers' XID and SXID lines
LOG_USER_ERR = 8 + 3  # what the kernel makes of a record user space writes to /dev/kmsg


class FakeKmsg:
    def __init__(self):
        self.writer, self.reader = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.reader.setblocking(False)
        self.seq = 0
        self.opens = 0

    def log(self, message: str, usec: int, prio: int = LOG_KERN_ERR, seq: int | None = None,
            device: str = "") -> int:
        """Append one record (``device``: its continuation line, e.g. ``+pci:0000:18:00.0``); its sequence."""
        self.seq = self.seq + 1 if seq is None else seq
        extra = f" DEVICE={device}\n" if device else ""
        self.writer.send(f"{prio},{self.seq},{usec},-;{message}\n{extra}".encode())
        return self.seq

    def raw(self, data: bytes) -> None:
        self.writer.send(data)

    def opener(self, path: str) -> int:
        self.opens += 1
        return os.dup(self.reader.fileno())

    def kernel_log(self, monotonic) -> KernelLog:
        return KernelLog("fake-kmsg", device=None, monotonic=monotonic, opener=self.opener)

    def close(self) -> None:
        self.writer.close()
        self.reader.close()
