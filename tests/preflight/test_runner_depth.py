"""Runner and report parts of the preflight depth: bracket checks read before the load tests and after the rack checks,
progress names the node and check that is running, the report says which depth ran, profiles validate the
new sections."""

from __future__ import annotations

import pytest

from cluster.model import Cluster, Rack
from preflight import report
from preflight.checks.base import Check, RunOptions
from preflight.profiles import ProfileError, profile_for, run_depth
from preflight.result import Verdict
from preflight.runner import Progress, run_preflight
from preflight.transport import CommandResult
from tests.preflight.helpers import ScriptedTransport, node

ORDER: list[str] = []


class Load(Check):
    name = "load"

    def run(self, ctx):
        ORDER.append(f"load {ctx.node.name}")
        return [self.result(ctx.node, Verdict.PASS, "OK", "loaded")]


class Pairs(Check):
    name = "pairs"
    scope = "rack"

    def gather(self, ctx):
        return None

    def run_rack(self, ctx):
        ORDER.append("pairs " + ",".join(c.node.name for c in ctx.nodes))
        return [self.result(c.node, Verdict.PASS, "OK", "paired") for c in ctx.nodes]


class Counters(Check):
    name = "counters"
    scope = "bracket"

    def gather(self, ctx):
        ORDER.append(f"before {ctx.node.name}")
        return "before"

    def finish(self, ctx, before):
        ORDER.append(f"after {ctx.node.name} ({before})")
        return [self.result(ctx.node, Verdict.PASS, "OK", "counted")]


class Steps(Progress):
    def __init__(self):
        self.steps: list[tuple[str, str]] = []

    def node_step(self, node, check):
        self.steps.append((node, check))


def cluster_of(*names):
    return Cluster((Rack("r01", tuple(node(n) for n in names)),))


def test_bracket_checks_read_before_the_load_and_after_the_rack_checks():
    ORDER.clear()
    cluster = cluster_of("n1", "n2")
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    steps = Steps()
    outcome = run_preflight(cluster, [Counters(), Load(), Pairs()], {n.name: {} for n in cluster.nodes()}, t,
                            RunOptions(timeout=5.0), parallel=1, progress=steps)
    assert ORDER == ["before n1", "load n1", "before n2", "load n2", "pairs n1,n2", "after n1 (before)",
                     "after n2 (before)"]
    assert [r.check for r in outcome.results if r.node == "n1"] == ["counters", "load", "pairs"]
    assert steps.steps == [("n1", "counters"), ("n1", "load"), ("n1", "pairs"),
                           ("n2", "counters"), ("n2", "load"), ("n2", "pairs")]


def test_a_host_that_stops_answering_gets_no_second_reading():
    ORDER.clear()
    cluster = cluster_of("n1", "n2")
    gone = CommandResult(None, "", "ssh: connect to host: No route to host", 0.0, unreachable=True)
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("n2", "uname", reply=gone)
    outcome = run_preflight(cluster, [Counters(), Load()], {"n1": {}, "n2": {}}, t, RunOptions(timeout=5.0))
    assert ORDER == ["before n1", "load n1", "after n1 (before)"]
    assert {r.verdict for r in outcome.results if r.node == "n2"} == {Verdict.UNREACHABLE}
    assert len([r for r in outcome.results if r.node == "n2"]) == 2  # one per check, none twice


def test_report_names_the_depth_in_json_junit_and_table():
    cluster = cluster_of("n1")
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    outcome = run_preflight(cluster, [Load()], {"n1": {}}, t, RunOptions(timeout=5.0, depth="full"))
    assert report.to_json(outcome)["summary"]["depth"] == "full"
    assert report.to_junit(outcome).find("properties/property[@name='depth']").get("value") == "full"
    assert report.results_table(outcome.results, 160, title=f"preflight (depth: {report.depth_of(outcome)})").title \
        == "preflight (depth: full)"
    unnamed = run_preflight(cluster, [Load()], {"n1": {}}, t, RunOptions(timeout=5.0))
    assert report.to_json(unnamed)["summary"]["depth"] == "per profile"


def test_the_depth_a_run_names_without_depth_is_the_profiles_default_when_they_agree():
    h100 = profile_for("n1", {"gpu_model": "h100-sxm"})
    quick = profile_for("n2", {"gpu_model": "h200-sxm", "preflight_overrides": {"depth": {"default": "quick"}}})
    assert run_depth({"n1": h100, "n2": profile_for("n2", {"gpu_model": "a100-sxm"})}) == "standard"
    assert run_depth({"n1": h100, "n2": quick}) is None  # mixed: the report says "per profile"
    assert run_depth({"n1": h100, "n2": quick}, "full") == "full"  # --depth names itself


def test_profiles_carry_depth_durations_and_reject_bad_depth_sections():
    profile = profile_for("n1", {"gpu_model": "h200-sxm"})
    assert profile["depth"]["default"] == "standard"
    assert {d: v["dcgm_level"] for d, v in profile["depth"]["levels"].items()} == {"quick": 1, "standard": 2, "full": 3}
    assert all(v["minutes"] > 0 for v in profile["depth"]["levels"].values())
    with pytest.raises(ProfileError, match=r"depth.default: expected one of quick, standard, full, got 'deep'"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"depth": {"default": "deep"}}})
    with pytest.raises(ProfileError, match=r"depth.levels: expected a mapping"):
        profile_for("n1", {"gpu_model": "h100-sxm",
                           "preflight_overrides": {"depth": {"levels": {"quick": {"dcgm_level": 9}}}}})
    with pytest.raises(ProfileError, match=r"throttle.fail_reasons: expected a list of clock event reasons"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"throttle": {"fail_reasons": ["hot"]}}})
    with pytest.raises(ProfileError, match=r"pcie.gpu_width: expected a PCIe link width"):
        profile_for("n1", {"gpu_model": "h100-sxm", "preflight_overrides": {"pcie": {"gpu_width": 12}}})


def test_known_wrong_values_are_not_in_the_profiles():
    """The issue's list: DCGM's H200 memory-bandwidth floor in the wrong unit (2333 in an MB/s field) is
    not copied (no memory-bandwidth floor of ours); the flap window is azurehpc's 6 h, not a guess."""
    def leaves(value, path=""):
        if isinstance(value, dict):
            for key, item in value.items():
                yield from leaves(item, f"{path}.{key}")
        elif isinstance(value, list):
            for index, item in enumerate(value):
                yield from leaves(item, f"{path}[{index}]")
        else:
            yield path, value

    for model in ("h100-sxm", "h200-sxm", "a100-sxm"):
        profile = profile_for("n1", {"gpu_model": model})
        values = list(leaves(profile))
        assert [p for p, v in values if v in (2333, 2333.0, "2333")] == []  # at any depth of the profile
        assert [p for p, _ in values if "mem" in p.lower() and "bandwidth" in p.lower()] == []
        assert profile["ib_health"]["flap_window_hours"] == 6
        assert "hw_thermal_slowdown" in profile["throttle"]["fail_reasons"]


def test_the_registry_takes_every_before_reading_ahead_of_the_checks_that_load_gpus_and_links():
    """nvlink's, gpu_throttle's and ib_link_health's "before" readings are taken where they stand in
    preflight.checks.CHECKS, so the registry must list them ahead of every load test; their "after" readings
    come after the rack checks (test above)."""
    from preflight.checks import CHECKS

    order = [c.name for c in CHECKS]
    bracket = [c.name for c in CHECKS if c.scope == "bracket"]
    assert bracket == ["nvlink", "gpu_throttle", "ib_link_health"]
    loads = ("gpu_bandwidth", "dcgm_diag", "nccl", "ib_pairs")
    assert max(order.index(b) for b in bracket) < min(order.index(load) for load in loads)
