"""preflight/checks/ib_link_health.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

import time

import pytest

from preflight.checks import ib_link_health
from preflight.checks.base import GatherError
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import H100_NICS, ScriptedTransport, context, fixture_text, node
from tests.helpers.preflight_checks import PROFILE, N, parsed, verdict

pytestmark = pytest.mark.unit


def counters(**bumps):
    return {ib_link_health.counter_path(nic.device, nic.port, c): bumps.get(f"{nic.device}_{c}", 0)
            for nic in N.nics for c in ib_link_health.COUNTERS}


def ib(before=None, after=None, log="journalctl-short-no-events.txt", now=None, ber=None):
    events = parsed("kernel-links", log, now=now or time.time())
    return {"before": before or counters(), "after": after or counters(), "events": events,
            "now": now or time.time(), "ber": ber or {}}


def test_ib_health_quiet_ports_pass():
    assert verdict(ib_link_health.CHECK.evaluate(ib(), PROFILE, N)) == (Verdict.PASS, "IB_HEALTH_OK")


def test_ib_health_counter_growth_past_limits_fails():
    result = ib_link_health.CHECK.evaluate(ib(after=counters(mlx5_1_symbol_error=11, mlx5_2_link_downed=1)), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_COUNTER")
    assert len(result.evidence["problems"]) == 2
    small = ib_link_health.CHECK.evaluate(ib(after=counters(mlx5_1_symbol_error=10)), PROFILE, N)[0]
    assert small.verdict is Verdict.PASS  # ibqueryerrors' default threshold is 10


@pytest.mark.parametrize("log", ["bsd-syslog-ubuntu22-ipoib-two-flaps.txt", "rfc3339-syslog-ubuntu24-ipoib-two-flaps.txt"])
def test_ib_health_flaps_counted_in_both_timestamp_formats(log):
    # Both fixtures hold two flaps of ibp60s0 (mlx5_1's netdev) at 09:40 and 10:12 on Jun 10 (2024 or now's year).
    year = 2024 if "rfc3339" in log else time.gmtime().tm_year
    now = time.mktime((year, 6, 10, 12, 0, 0, 0, 0, 0)) - time.timezone
    result = ib_link_health.CHECK.evaluate(ib(log=log, now=now), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_LINK_FLAP") and "2 times" in result.reason
    later = ib_link_health.CHECK.evaluate(ib(log=log, now=now + 86400), PROFILE, N)[0]
    assert later.verdict is Verdict.PASS  # outside the 6 h window


def test_ib_health_ber_above_limit_fails():
    ber = {"mlx5_0": parsed("mlxlink", "cx7-ndr-effective-ber-3E-10.txt"), "mlx5_1": parsed("mlxlink", "cx7-ndr-clean-15E-255.txt")}
    result = ib_link_health.CHECK.evaluate(ib(ber=ber), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "IB_BER") and "mlx5_0" in result.reason


def test_ib_health_unreadable_kernel_log_is_error_never_zero_flaps():
    t = ScriptedTransport().on("n1", "grep", reply=lambda argv: CommandResult(
        0, "".join(f"{p}:0\n" for p in argv[3:]), "", 0.0, argv=argv))
    t.on("n1", "date", reply=f"{int(time.time())}\n")
    t.on("n1", "journalctl", reply="Dez 01 09:00:01 r01n01 kernel: ibp60s0: lost carrier\n")  # localised month
    ctx = context(t)
    result = ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "lost carrier" in result.evidence["output"]


@pytest.mark.parametrize("now", ["\u00b9\u2077\u2076\u2074\u2075\u2074\u2077\u2082\u2080\u2080",  # super/subscripts
                                 "\u0661\u0667\u0666\u0664\u0665\u0664\u0667\u0662\u0660\u0660",  # Arabic-Indic
                                 "%s", ""])
def test_ib_health_clock_that_is_no_date_epoch_is_an_error(now):
    """The host's clock goes through the date-epoch parser: ASCII digits only. str.isdigit() took other
    scripts' digits, so superscripts crashed finish() with a ValueError from float() and Arabic-Indic
    digits were read as a time; both are now an ERROR naming `date +%s` with the excerpt."""
    t = ScriptedTransport().on("n1", "grep", reply=lambda argv: CommandResult(
        0, "".join(f"{p}:0\n" for p in argv[3:]), "", 0.0, argv=argv))
    t.on("n1", "date", reply=f"{now}\n")
    t.on("n1", "journalctl", reply="")
    ctx = context(t)
    result = ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER") and "date +%s" in result.reason


def finish_with_journal(journal: CommandResult, n=None):
    """finish() of a quiet node (counters unchanged, clock now) whose `journalctl -k` answers ``journal``."""
    t = ScriptedTransport().on("n1", "grep", reply=lambda argv: CommandResult(
        0, "".join(f"{p}:0\n" for p in argv[3:]), "", 0.0, argv=argv))
    t.on("n1", "date", reply=f"{int(time.time())}\n")
    t.on("n1", "journalctl", reply=journal)
    ctx = context(t, n)
    return ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]


HINT = ("Hint: You are currently not seeing messages from other users and the system.\n"
        "      Users in groups 'adm', 'systemd-journal' can see all messages.\n"
        "      Pass -q to turn off this notice.\n")


@pytest.mark.parametrize("rc, stderr", [
    (0, HINT),  # the SSH user reads only its own journal: the kernel's messages are not in it
    (0, "No journal files were found.\n"),  # no journal at all (Storage=none): nothing was read
    (1, "No journal files were opened due to insufficient permissions.\n"),
])
def test_a_journal_the_user_cannot_read_is_an_error_never_zero_flaps(rc, stderr):
    """journalctl run by a user outside adm/systemd-journal prints `-- No entries --` on stdout and its hint on
    stderr, exit 0: preflight connects as the inventory's ansible_user without sudo, so that read as 0 link-down
    events, a PASS that saw no log. It is an ERROR naming the command and journalctl's own words."""
    result = finish_with_journal(CommandResult(rc, "-- No entries --\n", stderr, 0.0))
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "journalctl" in result.reason and stderr.splitlines()[0] in result.reason + str(result.evidence)


def test_a_root_journal_with_no_entries_in_the_window_passes():
    result = finish_with_journal(CommandResult(0, "-- No entries --\n", "", 0.0))
    assert (result.verdict, result.code) == (Verdict.PASS, "IB_HEALTH_OK")


def test_flaps_of_a_nic_without_a_netdev_are_unverifiable_not_a_pass():
    """Flaps are counted per netdev; an inventory NIC without one cannot be matched to the log's events. Three
    `lost carrier` lines of an interface no inventory NIC names used to pass as 0 flaps: WARN, naming the NIC."""
    nics = [dict(nic, netdev=None) if nic["device"] == "mlx5_1" else nic for nic in H100_NICS]
    n = node(rdma_nics=nics)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S+0000", time.gmtime(time.time() - 600))
    log = "".join(f"{stamp} r01n01 kernel: ibp60s0: lost carrier\n" for _ in range(3))
    result = finish_with_journal(CommandResult(0, log, "", 0.0), n)
    assert (result.verdict, result.code) == (Verdict.WARN, "IB_FLAPS_UNVERIFIED")
    assert "mlx5_1" in result.reason and "ibp60s0" in result.reason
    # with no link event at all in the window, no NIC can have flapped: that is verified
    quiet = finish_with_journal(CommandResult(0, f"{stamp} r01n01 kernel: Linux version 6.5\n", "", 0.0), n)
    assert (quiet.verdict, quiet.code) == (Verdict.PASS, "IB_HEALTH_OK")



def quiet_host(sysfs=None, mlxlink=None, n=None):
    """A scripted host with quiet counters (or ``sysfs`` for the second counter read), an empty journal window
    and, where given, ``mlxlink`` output; profile with mlxlink on when it is given."""
    readings = iter([None, sysfs])

    def counters_reply(argv):
        text = next(readings, None)
        return CommandResult(0, text if text is not None else "".join(f"{p}:0\n" for p in argv[3:]), "", 0.0,
                             argv=argv)

    t = ScriptedTransport().on("n1", "grep", reply=counters_reply)
    t.on("n1", "date", reply=f"{int(time.time())}\n")
    t.on("n1", "journalctl", reply="-- No entries --\n")
    if mlxlink is not None:
        t.on("n1", "mlxlink", reply=mlxlink)
    ctx = context(t, n)
    if mlxlink is not None:
        ctx.profile = {**ctx.profile, "ib_health": {**ctx.profile["ib_health"], "mlxlink": True}}
    return ctx


def test_sysfs_counters_cut_short_are_an_error_with_excerpt():
    """grep -H of the counters cut inside a path (before, or after the load tests): ERROR naming the command with
    what came back; never a counter read as 0 or a port dropped from the comparison."""
    cut = fixture_text("sysfs", "truncated-path-without-value.txt")
    ctx = quiet_host(sysfs=cut)
    result = ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "cannot parse `grep -H ." in result.reason and "/sys/class/infiniband/" in result.evidence["output"]
    t = ScriptedTransport().on("n1", "grep", reply=cut)
    with pytest.raises(GatherError) as before:
        ib_link_health.CHECK.gather(context(t))
    result = ib_link_health.CHECK.finish(context(t), before.value)[0]
    assert result.verdict is Verdict.ERROR and "current_link_width:16" in result.evidence["output"]


def test_mlxlink_cut_before_the_effective_ber_is_an_error_with_excerpt():
    cut = fixture_text("mlxlink", "truncated-before-effective-ber.txt")
    ctx = quiet_host(mlxlink=cut)
    result = ib_link_health.CHECK.finish(ctx, ib_link_health.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "mlxlink -d mlx5_0 -c" in result.reason and "ends before 'Effective Physical BER'" in result.reason
    assert result.evidence["output"].startswith("Operational Info")  # the excerpt of what came back
