"""sim/hosts/stubs/kernel_log.py: the simulated ``journalctl -k`` honours ``--grep`` as journalctl does, so the
machines answer gpu_health's host-side filter like a real host. Called in-process: no
machine is started."""

from __future__ import annotations

import pytest

from sim.hosts.hardware import resolve
from sim.hosts.stubs import kernel_log

pytestmark = pytest.mark.unit


def _journal(capsys, hw, *args: str, quiet: bool = True) -> tuple[int, list[str]]:
    rc = kernel_log.journalctl(hw, ["-k", "--no-pager", *(["-q"] if quiet else []), "--since", "-24h", *args])
    return rc, capsys.readouterr().out.splitlines()


def test_grep_keeps_only_the_matching_kernel_lines(capsys):
    hw = resolve("n1", {})
    hw.gpus[1].xid_events.extend([79, 48])
    rc, everything = _journal(capsys, hw)
    assert rc == 0 and len(everything) > 2
    for spelling in (("--grep", "NVRM: Xid"), ("-g", "NVRM: Xid"), ("--grep=NVRM: Xid",)):
        rc, xids = _journal(capsys, hw, *spelling)
        assert rc == 0 and len(xids) == 2, spelling
        assert all("kernel: NVRM: Xid (PCI:0000:" in line for line in xids)
        assert xids == [line for line in everything if "NVRM: Xid" in line]


def test_grep_without_a_match_exits_1_and_prints_nothing(capsys):
    assert _journal(capsys, resolve("n1", {}), "--grep", "NVRM: Xid") == (1, [])


def test_without_q_an_empty_window_says_no_entries_as_journalctl_does(capsys):
    """gpu_health reads without -q (so journalctl's permission hint reaches it): the marker comes on stdout."""
    assert _journal(capsys, resolve("n1", {}), "--grep", "NVRM: Xid", quiet=False) == (1, ["-- No entries --"])
