"""The kernel log's Xid reader (preflight/parsers/kernel_log.py): every timestamp format, an empty journal
window, and journalctl's own word that it did not read the system journal."""

from __future__ import annotations

import pytest

from preflight.parsers import ParseError, kernel_log
from tests.helpers.preflight import fixture_text

pytestmark = pytest.mark.unit


NOW = 1764547200.0  # 2025-12-01T00:00:00Z


def test_xids_in_every_stamp_format():
    dmesg = kernel_log.parse_xids(fixture_text("kernel_xids", "dmesg-h100-xid79-fallen-off-bus.txt"), now=NOW)
    assert [(x.bus, x.xid, x.epoch) for x in dmesg.xids] == [("1b", 79, None)] and dmesg.lines_read == 4
    journal = kernel_log.parse_xids(fixture_text("kernel_xids", "journalctl-short-a100-xid48-dbe-xid63-remap.txt"), now=NOW)
    assert [(x.bus, x.xid) for x in journal.xids] == [("07", 48), ("07", 63)]  # the NVSwitch SXid is not a GPU XID
    human = kernel_log.parse_xids(fixture_text("kernel_xids", "dmesg-T-xid94-contained-ecc.txt"), now=NOW)
    assert human.xids[0].epoch == 1718012402.0  # [Mon Jun 10 09:40:02 2024]
    iso = kernel_log.parse_xids(fixture_text("kernel_xids", "syslog-rfc3339-xid31-two-gpus.txt"), now=NOW)
    assert [x.bus for x in iso.xids] == ["18", "2a"]


def test_an_empty_journal_window_is_real_but_unreadable_lines_are_errors():
    assert kernel_log.parse_xids("-- No entries --\n").xids == []
    for bad in ("dmesg: read kernel buffer failed: Operation not permitted\n",
                "[ 1.0] NVRM: Xid (PCI:0000:1b:00): 79, x\nNov 29 07:1"):
        with pytest.raises(ParseError):
            kernel_log.parse_xids(bad)


@pytest.mark.parametrize("stderr, gap", [
    (fixture := fixture_text("kernel_links", "garbage-journal-permission.txt"), fixture.splitlines()[0]),
    ("No journal files were found.\n", "No journal files were found."),
    ("No journal files were opened due to insufficient permissions.\n",
     "No journal files were opened due to insufficient permissions."),
    ("", None),
    ("Journal file /var/log/journal/x/system@0.journal~ corrupted, ignoring file.\n", None),
])
def test_journal_gap_is_journalctls_own_word_that_it_did_not_read_the_system_journal(stderr, gap):
    assert kernel_log.journal_gap(stderr) == gap
