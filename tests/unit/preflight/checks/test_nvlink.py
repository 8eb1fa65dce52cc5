"""preflight/checks/nvlink.py: ``evaluate`` fed parsed facts directly (PASS, each FAIL mode), and ``gather`` through a scripted
transport (the commands it runs; unreadable output -> ERROR with an excerpt)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight.checks import nvlink
from preflight.checks.base import GatherError
from preflight.result import Verdict
from preflight.transport import CommandResult
from tests.helpers.preflight import ScriptedTransport, context, fixture_text
from tests.helpers.preflight_checks import PROFILE, N, parsed, verdict

pytestmark = pytest.mark.unit


def nvl(status="h100-sxm-driver550-18-links-26.562.txt", before="h100-sxm-driver550-all-zero.txt", after=None,
        elapsed=60.0):
    return {"status": parsed("nvlink-status", status), "before": parsed("nvlink-errors", before),
            "after": parsed("nvlink-errors", after or before), "elapsed_s": elapsed}


def test_nvlink_healthy_passes():
    assert verdict(nvlink.CHECK.evaluate(nvl(), PROFILE, N)) == (Verdict.PASS, "NVLINK_OK")


def test_nvlink_inactive_links_fail():
    result = nvlink.CHECK.evaluate(nvl(status="h200-sxm-gpu6-two-links-inactive.txt"), PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_INACTIVE")
    assert "GPU6: 16 of 18" in result.reason and "4, 9" in result.reason


def test_nvlink_slow_links_fail_speed():
    v100 = nvl(status="v100-sxm2-inactive-links-azhpc-diagnostics-73.txt")
    problems = nvlink.CHECK.evaluate(v100, PROFILE, N)[0].evidence["problems"]
    assert any("25.781 GB/s < 26.562" in p for p in problems)


def with_counters(report, gpu: int, link: int, **counters):
    """An nvlink-errors reading with some counters of one link set: the facts of a link that errors."""
    gpus = [replace(g, links=[replace(k, counters={**k.counters, **counters}) if k.link == link else k
                              for k in g.links]) if g.index == gpu else g for g in report.gpus]
    return replace(report, gpus=gpus)


def test_nvlink_errors_growing_during_the_run_fail_old_history_does_not():
    healthy = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    gpu = healthy.gpus[0].index
    before, after = with_counters(healthy, gpu, 2, replay=7), with_counters(healthy, gpu, 2, replay=9)
    facts = {**nvl(), "before": before, "after": before}
    assert verdict(nvlink.CHECK.evaluate(facts, PROFILE, N)) == (Verdict.PASS, "NVLINK_OK")
    facts["after"] = after
    result = nvlink.CHECK.evaluate(facts, PROFILE, N)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_REPLAY") and "+2 replay" in result.reason


def test_nvlink_recovery_and_crc_rate():
    base = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    gpu = base.gpus[0].index
    after = with_counters(with_counters(base, gpu, 0, recovery=1), gpu, 5, crc=60000)
    facts = {**nvl(), "after": after, "elapsed_s": 100.0}
    problems = nvlink.CHECK.evaluate(facts, PROFILE, N)[0].evidence["problems"]
    assert any("recovery" in p for p in problems) and any("600 CRC errors/s" in p for p in problems)
    facts["elapsed_s"] = 1000.0  # 60 errors/s: under DCGM's 100/s threshold
    assert not any("CRC" in p for p in nvlink.CHECK.evaluate(facts, PROFILE, N)[0].evidence.get("problems", []))


def test_nvlink_bracket_reads_errors_before_and_after():
    zero = fixture_text("nvlink_errors", "h100-sxm-driver550-all-zero.txt")
    readings = iter([zero, zero.replace("Link 0: Replay Errors: 0", "Link 0: Replay Errors: 5", 1)])
    t = ScriptedTransport().on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status",
                                                                        "h100-sxm-driver550-18-links-26.562.txt"))
    t.on("n1", *nvlink.ERRORS, reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    ctx = context(t)
    before = nvlink.CHECK.gather(ctx)
    result = nvlink.CHECK.finish(ctx, before)[0]
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_REPLAY")
    assert len(t.called("n1", "-e")) == 2  # not served from the command cache


def test_nvlink_garbage_before_is_error():
    t = ScriptedTransport().on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status", "garbage-nvlink-not-supported.txt"))
    with pytest.raises(GatherError) as info:
        nvlink.CHECK.gather(context(t))
    result = nvlink.CHECK.finish(context(t), info.value)[0]
    assert result.verdict is Verdict.ERROR and "all links are inActive" in result.evidence["output"]


def test_a_gpu_missing_from_the_error_counters_fails_naming_it():
    """`nvidia-smi nvlink -e` listing 7 of 8 GPUs, before or after the load tests: the missing GPU's counters
    were compared with nothing and passed."""
    zero = parsed("nvlink-errors", "h100-sxm-driver550-all-zero.txt")
    short = replace(zero, gpus=[g for g in zero.gpus if g.index != 5])
    for reading in ("before", "after"):
        facts = {**nvl(), reading: short}
        result = nvlink.CHECK.evaluate(facts, PROFILE, N)[0]
        assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_COUNTERS_MISSING")
        assert "7 of 8 GPUs" in result.reason and "GPU5" in result.reason and reading in result.reason
    status = parsed("nvlink-status", "h100-sxm-driver550-18-links-26.562.txt")
    fewer = replace(status, gpus=status.gpus[:6])
    result = nvlink.CHECK.evaluate({**nvl(), "status": fewer}, PROFILE, N)[0]
    assert "6 of 8 GPUs" in result.reason and "GPU6, GPU7" in result.reason


def test_nvlink_error_counters_cut_short_after_the_load_are_an_error_with_excerpt():
    """The "after" reading of `nvidia-smi nvlink -e` cut mid-link: its GPUs' growth cannot be judged, ERROR with
    the excerpt, never a pass on the counters that did come back."""
    zero = fixture_text("nvlink_errors", "h100-sxm-driver550-all-zero.txt")
    cut = fixture_text("nvlink_errors", "truncated-mid-link.txt")
    readings = iter([zero, cut])
    t = ScriptedTransport().on("n1", *nvlink.STATUS, reply=fixture_text("nvlink_status",
                                                                        "h100-sxm-driver550-18-links-26.562.txt"))
    t.on("n1", *nvlink.ERRORS, reply=lambda argv: CommandResult(0, next(readings), "", 0.0, argv=argv))
    ctx = context(t)
    result = nvlink.CHECK.finish(ctx, nvlink.CHECK.gather(ctx))[0]
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "nvidia-smi nvlink -e" in result.reason and "cut mid-link" in result.reason
    assert "Link 1: Replay Errors: 0" in result.evidence["output"]
