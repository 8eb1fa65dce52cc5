"""The kernel log gatherer against a fake /dev/kmsg (tests/helpers/kmsg.py: one record per read, EAGAIN when
none is left), the ways the device cannot be read, and, where this host lets it, the real device."""

from __future__ import annotations

import errno
import os

import pytest

from eas_agent.collectors import kernel_log as kernel_log_module
from eas_agent.collectors.kernel_log import REOPEN_AFTER_S, KernelLog
from eas_agent.kernel_log import CORRECTABLE, FATAL, NON_FATAL
from tests.helpers.kmsg import LOG_USER_ERR, FakeKmsg

pytestmark = pytest.mark.unit

NOW = 1_764_406_000.0
XID79 = "NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
FATAL_SXID = "nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Fatal, Link 48 LTSSM Fault Up"


class Mono:
    """CLOCK_MONOTONIC for the reader: seconds since boot."""

    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def kmsg():
    fake = FakeKmsg()
    yield fake
    fake.close()


def test_an_xid_logged_before_the_agent_started_has_the_time_it_was_logged(kmsg):
    """The agent was down: the record is 600 s old on the kernel's clock, so it is 600 s old on the agent's."""
    kmsg.log("Linux version 6.8.0-45-generic", usec=0)
    kmsg.log(XID79, usec=1_000_000_000, device="+pci:0000:18:00.0")
    reader = kmsg.kernel_log(Mono(1600.0))
    reading = reader.collect(NOW)
    assert reading.error is None and reading.lost == 0
    xid = reading.xids[(0, 0x18, 0)]
    assert (xid.xid, xid.at) == (79, NOW - 600.0)


def test_each_cycle_reads_only_what_is_new(kmsg):
    mono = Mono(100.0)
    reader = kmsg.kernel_log(mono)
    assert reader.collect(NOW).xids == {}
    kmsg.log("NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=vllm, Graphics Exception", usec=99_000_000)
    first = reader.collect(NOW)
    kmsg.log("NVRM: Xid (PCI:0000:18:00): 95, pid=7, name=vllm, Uncontained ECC error", usec=100_500_000)
    mono.t = 101.0
    second = reader.collect(NOW + 1)
    assert first.xids[(0, 0x18, 0)].xid == 13 and second.xids[(0, 0x18, 0)].xid == 95
    assert second.xids[(0, 0x18, 0)].at == pytest.approx(NOW + 0.5)


def test_a_stamp_after_now_is_now(kmsg):
    kmsg.log(XID79, usec=200_000_000)
    assert kmsg.kernel_log(Mono(100.0)).collect(NOW).xids[(0, 0x18, 0)].at == NOW


def test_sxids_are_counted_by_severity_and_the_latest_fatal_one_kept(kmsg):
    kmsg.log("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error "
             "(First)", usec=10_000_000)
    kmsg.log("nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 20034, Fatal, Link 63 LTSSM Fault Up", usec=20_000_000)
    kmsg.log(FATAL_SXID, usec=30_000_000)
    kmsg.log("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Severity 1 Engine instance 48 Sub-engine instance "
             "00", usec=30_000_100)
    kmsg.log("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 20034, Data {0x10000000, 0x10000000, 0x00000000}",
             usec=30_000_200)
    kmsg.log("nvidia-nvswitch1: SXid (PCI:0000:06:00.0): 19049, Correctable, Link 2 NVLDL RX short error rate",
             usec=31_000_000)
    reading = kmsg.kernel_log(Mono(40.0)).collect(NOW)
    assert dict(reading.sxids) == {NON_FATAL: 1, FATAL: 2, CORRECTABLE: 1}  # the data lines are no events
    event = reading.fatal_sxid
    assert (event.switch, event.pci, event.sxid, event.at) == ("nvswitch1", "0000:06:00.0", 20034, NOW - 10.0)
    assert event.detail == "Link 48 LTSSM Fault Up"


def test_lines_written_from_user_space_and_garbage_change_nothing(kmsg):
    kmsg.log(XID79, usec=1_000_000, prio=LOG_USER_ERR)
    kmsg.log(FATAL_SXID, usec=1_000_000, prio=LOG_USER_ERR)
    kmsg.raw(b"\xff\xfe not a record")
    kmsg.log("NVRM: Xid (PCI:0000:18:00): 99999999999, out of range", usec=1_000_000)
    reader = kmsg.kernel_log(Mono(10.0))
    reading = reader.collect(NOW)
    assert reading.error is None and reading.xids == {} and reading.fatal_sxid is None and not reading.sxids
    assert reader.malformed == 1


def test_records_overwritten_before_they_were_read_are_counted_lost(kmsg, monkeypatch):
    kmsg.log("first", usec=1, seq=10)
    kmsg.log("after the kernel overwrote 5", usec=2, seq=16)
    real_read, broken = os.read, [True]

    def read(fd, n):  # the kernel answers EPIPE once when the reader's position was overwritten
        if broken.pop() if broken else False:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe")
        return real_read(fd, n)

    monkeypatch.setattr(kernel_log_module.os, "read", read)
    reading = kmsg.kernel_log(Mono(10.0)).collect(NOW)
    assert reading.error is None and reading.lost == 5


def test_a_reopen_skips_what_was_read_before(kmsg):
    mono = Mono(10.0)
    reader = kmsg.kernel_log(mono)
    kmsg.log("NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=vllm, Graphics Exception", usec=1_000_000, seq=5)
    reader.collect(NOW)
    reader.close()
    kmsg.log("NVRM: Xid (PCI:0000:18:00): 13, pid=7, name=vllm, Graphics Exception", usec=1_000_000, seq=5)
    kmsg.log("unrelated", usec=2_000_000, seq=6)
    reading = reader.collect(NOW)
    assert kmsg.opens == 2 and reading.lost == 0 and reader.last_seq == 6


def test_a_full_buffer_is_read_over_several_cycles(kmsg, monkeypatch):
    monkeypatch.setattr(kernel_log_module, "MAX_RECORDS_PER_CYCLE", 3)
    for i in range(5):
        kmsg.log(f"NVRM: Xid (PCI:0000:18:00): {31 + i}, pid=1, name=x, MMU Fault", usec=1_000_000 + i)
    reader = kmsg.kernel_log(Mono(10.0))
    assert reader.collect(NOW).xids[(0, 0x18, 0)].xid == 33
    assert reader.collect(NOW).xids[(0, 0x18, 0)].xid == 35


@pytest.mark.parametrize(("exc", "says"), [
    (PermissionError(errno.EPERM, "Operation not permitted"), "needs CAP_SYSLOG where kernel.dmesg_restrict=1"),
    (PermissionError(errno.EACCES, "Permission denied"), "permission denied"),
    (FileNotFoundError(errno.ENOENT, "No such file or directory"), "no such device"),
    (OSError(errno.EIO, "Input/output error"), "Input/output error"),
])
def test_a_log_that_cannot_be_opened_says_why_and_is_tried_again_later(exc, says):
    mono, opens = Mono(10.0), []

    def opener(path):
        opens.append(path)
        raise exc

    reader = KernelLog("/dev/kmsg", monotonic=mono, opener=opener)
    reading = reader.collect(NOW)
    assert says in reading.error and reading.error.startswith("/dev/kmsg: ")
    reader.collect(NOW + 1)
    mono.t += REOPEN_AFTER_S
    reader.collect(NOW + REOPEN_AFTER_S)
    assert len(opens) == 2  # not every cycle


def test_a_path_that_is_not_the_kernel_log_device_is_refused(tmp_path):
    assert KernelLog("/dev/null").collect(NOW).error == (
        "/dev/null: char device 1:3, not the kernel log (char 1:11)")
    plain = tmp_path / "kmsg"
    plain.write_text("3,1,2,-;NVRM: Xid (PCI:0000:18:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
    reading = KernelLog(str(plain)).collect(NOW)
    assert reading.error.endswith("not a character device, not the kernel log (char 1:11)") and not reading.xids


def test_a_read_error_keeps_what_was_read_and_reopens_later(kmsg, monkeypatch):
    mono = Mono(10.0)
    reader = kmsg.kernel_log(mono)
    kmsg.log(XID79, usec=5_000_000)
    reader.collect(NOW)

    def fail(fd, n):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(kernel_log_module.os, "read", fail)
    reading = reader.collect(NOW + 1)
    assert reading.error == "fake-kmsg: read failed: Input/output error" and reading.xids[(0, 0x18, 0)].xid == 79
    assert reader.fd is None


def test_end_of_file_is_not_the_kernel_log(tmp_path):
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    reader = KernelLog(str(empty), device=None)
    assert reader.collect(NOW).error == f"{empty}: end of file (not the kernel log)"


def test_the_hosts_own_kernel_log_reads_as_records():
    """The real device, where this host lets the test read it: every record parses, none is lost at once."""
    reader = KernelLog()
    reading = reader.collect(NOW)
    if reading.error:
        pytest.skip(reading.error)
    try:
        assert reader.last_seq is not None and reader.malformed == 0
    finally:
        reader.close()
