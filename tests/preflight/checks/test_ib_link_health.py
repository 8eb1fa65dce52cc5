"""preflight/checks/ib_link_health.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

import time

import pytest

from preflight.checks import ib_link_health
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.preflight.checks.helpers import PROFILE, N, parsed, verdict
from tests.preflight.helpers import ScriptedTransport, context


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
