"""The kernel log parser: /dev/kmsg records and the drivers' XID and SXID lines, in the formats the drivers
print (lines as logged on HGX hosts: leptonai/gpud's SXid README and kmsg fixtures, the MENTHOS data set),
and every hostile or garbled input: never an exception, never a record from user space."""

from __future__ import annotations

import random

import pytest

from eas_agent.kernel_log import (
    CORRECTABLE,
    FATAL,
    MAX_DETAIL,
    NON_FATAL,
    KmsgRecord,
    SxidLine,
    XidLine,
    kernel_line,
    parse_line,
    parse_record,
    pci_of_nvml,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("message", "pci", "xid", "detail"), [
    ("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
     (0, 0x18, 0), 79, "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."),
    ("NVRM: Xid (PCI:0000:9b:00): 94, pid=1234, name=python3, Contained ECC error", (0, 0x9B, 0), 94,
     "pid=1234, name=python3, Contained ECC error"),
    ("NVRM: Xid (PCI:0019:01:00): 149, NETIR Fatal XC0 i0 Link -1 (0x000fe406 0x00000000 0x00000000 0x00000000 "
     "0x00000000 0x00000000)", (0x19, 1, 0), 149, None),
    ("NVRM: Xid (PCI:0000:DB:00): 48, pid=9, name=vllm, An uncorrectable double bit error (DBE) has been "
     "detected on GPU in the framebuffer at partition 6, subpartition 0.", (0, 0xDB, 0), 48, None),
    ("NVRM: Xid (PCI:0000:18:00): 13", (0, 0x18, 0), 13, ""),
])
def test_the_gpu_drivers_xid_lines(message, pci, xid, detail):
    line = parse_line(message)
    assert isinstance(line, XidLine) and (line.pci, line.xid) == (pci, xid)
    if detail is not None:
        assert line.detail == detail


@pytest.mark.parametrize(("message", "switch", "pci", "sxid", "severity", "detail"), [
    ("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error (First)",
     "nvswitch3", "0000:86:00.0", 12028, NON_FATAL, "Link 32 egress non-posted PRIV error (First)"),
    ("nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up",
     "nvswitch0", "0000:c2:00.0", 20034, FATAL, "Link 28 LTSSM Fault Up"),
    ("nvidia-nvswitch5: SXid (PCI:0000:8A:00.0): 24007, Fatal, Link 45 sourcetrack TCEN0 crumbstore ECC DBE "
     "error (First)", "nvswitch5", "0000:8a:00.0", 24007, FATAL, None),
    ("nvidia-nvswitch4: SXid (PCI:0000:c6:00.0): 19084, Non-fatal, Link 29 AN1 Heartbeat Timeout Error (First)",
     "nvswitch4", "0000:c6:00.0", 19084, NON_FATAL, None),
    ("nvidia-nvswitch1: SXid (PCI:0000:05:00.0): 19049, Correctable, Link 12 NVLDL RX short error rate",
     "nvswitch1", "0000:05:00.0", 19049, CORRECTABLE, None),
    # a preceding error's data: an SXid line, no event of its own
    ("nvidia-nvswitch2: SXid (PCI:0000:c4:00.0): 10002, Severity 5 Engine instance 00 Sub-engine instance 00",
     "nvswitch2", "0000:c4:00.0", 10002, None, "Severity 5 Engine instance 00 Sub-engine instance 00"),
    ("nvidia-nvswitch1: SXid (PCI:0000:84:00.0): 12028, Data {0x000001c0, 0x00bd5c8a, 0x00000500, 0x00000064, "
     "0x00000000, 0x40008000, 0x5a001100, 0x00000000, 0x00000000}", "nvswitch1", "0000:84:00.0", 12028, None, None),
])
def test_the_nvswitch_drivers_sxid_lines(message, switch, pci, sxid, severity, detail):
    line = parse_line(message)
    assert isinstance(line, SxidLine)
    assert (line.switch, line.pci, line.sxid, line.severity) == (switch, pci, sxid, severity)
    if detail is not None:
        assert line.detail == detail


@pytest.mark.parametrize("message", [
    "NVRM: Xid (PCI:0000:18:00): 0, pid=1, zero is no XID",
    "NVRM: Xid (PCI:0000:18:00): 4294967296, one past the wire's range",
    "NVRM: Xid (PCI:0000:18:00): 12345678901, eleven digits",
    "NVRM: Xid (PCI:0000:018:00): 79, bus of three digits",
    "NVRM: Xid (PCI:000:18:00): 79, domain of three digits",
    "NVRM: Xid (PCI:0000:18:00) 79, no colon",
    "NVRM: Xid (PCI:0000:18:00): -79, negative",
    "NVRM: Xid (PCI:0000:18:00): 79; semicolon",
    "NVRM: Xid (PCI:0000:zz:00): 79, not hex",
    " NVRM: Xid (PCI:0000:18:00): 79, leading space",
    "mlx5_core: NVRM: Xid (PCI:0000:18:00): 79, quoted inside another message",
    "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus.",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00): 12028, Fatal, no function in the bus id",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00.8): 12028, Fatal, function 8",
    "nvidia-nvswitch: SXid (PCI:0000:86:00.0): 12028, Fatal, no switch number",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 0, Fatal, zero",
    "nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028,Fatal, no space",
    "nvidia-nvswitch3: sxid (PCI:0000:86:00.0): 12028, Fatal, lower case",
    "",
])
def test_a_line_not_exactly_in_its_shape_is_no_record(message):
    assert parse_line(message) is None


@pytest.mark.parametrize("word", ["FATAL", "fatal", "Fatal:", "Nonfatal", "Non-Fatal", "Fatality"])
def test_a_severity_word_not_the_drivers_is_no_event(word):
    line = parse_line(f"nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, {word}, Link 32 egress error")
    assert isinstance(line, SxidLine) and line.severity is None


def test_a_long_detail_is_cut():
    line = parse_line("NVRM: Xid (PCI:0000:18:00): 79, " + "x" * 5000)
    assert len(line.detail) == MAX_DETAIL


def test_a_kmsg_record_with_its_device_line():
    raw = (b"3,1520,6781741548779,-;NVRM: Xid (PCI:0000:91:00): 79, pid='<unknown>', name=<unknown>, GPU has "
           b"fallen off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:91:00.0\n")
    record, line = kernel_line(raw)
    assert record == KmsgRecord(level=3, facility=0, seq=1520, usec=6781741548779, message=record.message)
    assert record.message.endswith("GPU has fallen off the bus.") and "SUBSYSTEM" not in record.message
    assert isinstance(line, XidLine) and line.xid == 79 and line.pci == (0, 0x91, 0)


def test_header_fields_beyond_the_flags_are_allowed():
    record, line = kernel_line(b"4,7,100,-,caller=T42;NVRM: Xid (PCI:0000:18:00): 13, pid=1, name=x, Graphics")
    assert (record.seq, record.usec, line.xid) == (7, 100, 13)


@pytest.mark.parametrize("prio", [8 + 3, 8 + 0, 3 * 8 + 3, 23 * 8 + 7])
def test_a_record_from_user_space_is_never_an_xid_or_sxid(prio):
    """The kernel never gives a record written to /dev/kmsg the kernel facility (printk.c devkmsg_write)."""
    for message in ("NVRM: Xid (PCI:0000:18:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                    "nvidia-nvswitch0: SXid (PCI:0000:c2:00.0): 20034, Fatal, Link 28 LTSSM Fault Up"):
        record, line = kernel_line(f"{prio},9,100,-;{message}".encode())
        assert record.facility != 0 and line is None


@pytest.mark.parametrize("raw", [
    b"", b"\n", b";", b"3,1,2", b"3,1;msg", b"x,1,2,-;msg", b"3,-1,2,-;msg", b"3,1,2.5,-;msg",
    b"99999999999,1,2,-;msg", b"3,1,123456789012345678901,-;msg", b"\xff\xfe\x00;\x00", b"3,1,2,-\n;msg",
])
def test_a_read_that_is_not_a_record_is_none(raw):
    assert parse_record(raw) is None and kernel_line(raw) is None


def test_undecodable_bytes_and_huge_messages_never_raise():
    record, line = kernel_line(b"3,1,2,-;NVRM: Xid (PCI:0000:18:00): 79, \xff\xfe" + b"A" * 100_000)
    assert line.xid == 79 and "\ufffd" in line.detail
    record, line = kernel_line(b"3,1,2,-;" + b"\x00\x01" * 50_000)
    assert line is None and record.seq == 1


def test_random_bytes_never_raise_and_never_make_a_record_from_user_space():
    rng = random.Random(39)
    alphabet = b"0123456789,;-: ()NVRMXidSXPCIabcdefFatlnov\n\\x\xff"
    for _ in range(3000):
        raw = bytes(rng.choice(alphabet) for _ in range(rng.randint(0, 80)))
        if rng.random() < 0.5:
            raw = f"{rng.choice([3, 11, 14])},{rng.randint(0, 9)},{rng.randint(0, 9)},-;".encode() + raw
        parsed = kernel_line(raw)
        if parsed is not None and parsed[1] is not None:
            assert parsed[0].facility == 0


@pytest.mark.parametrize(("bus_id", "pci"), [
    (b"00000000:18:00.0", (0, 0x18, 0)), ("00000000:DB:00.0", (0, 0xDB, 0)), ("0000:9b:00.0", (0, 0x9B, 0)),
    (b"00000019:01:00.0\x00\x00", (0x19, 1, 0)), (None, None), (42, None), ("garbage", None),
    ("00000000:18:00", None), (b"\xff", None),
])
def test_nvml_bus_ids_as_the_xid_lines_name_gpus(bus_id, pci):
    assert pci_of_nvml(bus_id) == pci
