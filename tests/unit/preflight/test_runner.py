"""The parallel runner (preflight/runner.py): unreachable and hanging hosts never stop the others, the bound on
parallel nodes, a check's bug is an error result, exit codes, check selection, and the depth's order of
readings and load tests."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from cluster.model import Cluster, Rack
from preflight import checks as registry
from preflight import report
from preflight.checks.base import Check, RunOptions
from preflight.profiles import profile_of
from preflight.result import CheckResult, Verdict
from preflight.runner import Progress, exit_code, run_preflight
from preflight.transport import (
    CommandResult,
)
from tests.helpers.preflight import ScriptedTransport, node

pytestmark = pytest.mark.unit


class Echo(Check):
    """A minimal node check: PASS when `check-me` prints ok, FAIL otherwise."""

    name = "echo"

    def run(self, ctx):
        out = ctx.output(["check-me"])
        verdict = Verdict.PASS if out.strip() == "ok" else Verdict.FAIL
        return [self.result(ctx.node, verdict, "ECHO", out.strip())]


class Broken(Check):
    name = "broken"

    def run(self, ctx):
        raise KeyError("bug")


def cluster_of(names):
    from cluster.model import Cluster, Rack

    return Cluster(racks=(Rack("r01", tuple(node(n) for n in names)),))


def run(transport, names, checks=None, parallel=8, **options):
    cluster = cluster_of(names)
    profiles = {n.name: profile_of(n) for n in cluster.nodes()}
    opts = RunOptions(timeout=options.pop("timeout", 2.0), probe_timeout=1.0, **options)
    return run_preflight(cluster, checks or [Echo()], profiles, transport, opts, parallel)


def test_unreachable_and_hanging_hosts_do_not_stop_the_others():
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("*", "check-me", reply="ok\n")
    t.on(
        "down",
        "uname",
        reply=CommandResult(None, "", "ssh: connect to host down: No route to host", 0.0, unreachable=True),
    )
    t.on("hung", "uname", reply=CommandResult(None, "", "", 1.0, timed_out=True))
    t.on("slow", "check-me", reply=CommandResult(None, "", "", 2.0, timed_out=True))
    outcome = run(t, ["a", "down", "hung", "slow", "b"])
    verdicts = {r.node: (r.verdict, r.reason) for r in outcome.results}
    assert verdicts["a"] == verdicts["b"] == (Verdict.PASS, "ok")
    assert verdicts["down"] == (
        Verdict.UNREACHABLE,
        "host unreachable: ssh: connect to host down: No route to host",
    )
    assert verdicts["hung"] == (Verdict.UNREACHABLE, "host unreachable: no answer within 1s")
    assert verdicts["slow"] == (Verdict.ERROR, "`check-me` timed out after 2s")
    assert exit_code(outcome.results) == 3
    # the code the README's example and the report samples show
    assert {r.code for r in outcome.results if r.verdict == Verdict.UNREACHABLE} == {"HOST_UNREACHABLE"}


def test_nodes_run_in_parallel_bounded_by_parallel():
    active, peak, lock = [0], [0], threading.Lock()

    def slow_probe(argv):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
        return CommandResult(0, "5.15\n", "", 0.2)

    t = ScriptedTransport().on("*", "uname", reply=slow_probe).on("*", "check-me", reply="ok\n")
    names = [f"n{i}" for i in range(8)]
    started = time.monotonic()
    run(t, names, parallel=8)
    assert time.monotonic() - started < 1.2 and peak[0] == 8
    peak[0] = 0
    run(t, names, parallel=3)
    assert peak[0] == 3


def test_a_bug_in_one_check_is_an_error_result_not_a_crash():
    t = ScriptedTransport().on("*", "uname", reply="5.15\n").on("*", "check-me", reply="nope\n")
    outcome = run(t, ["a"], checks=[Broken(), Echo()])
    assert [(r.check, r.verdict) for r in outcome.results] == [
        ("broken", Verdict.ERROR),
        ("echo", Verdict.FAIL),
    ]
    assert outcome.results[0].reason == "internal error in broken: KeyError: 'bug'"
    assert exit_code(outcome.results) == 1


def test_exit_codes():
    def r(v):
        return CheckResult("r", "n", None, "c", v, "")

    assert exit_code([r(Verdict.PASS), r(Verdict.SKIP), r(Verdict.WARN)]) == 0
    assert exit_code([r(Verdict.WARN)], strict=True) == 1
    assert exit_code([r(Verdict.FAIL), r(Verdict.UNREACHABLE)]) == 1
    assert exit_code([r(Verdict.ERROR), r(Verdict.PASS)]) == 3
    assert exit_code([r(Verdict.UNREACHABLE)]) == 3


def test_check_selection():
    assert [c.name for c in registry.select(["nccl", "gpu_topology"], None)] == ["gpu_topology", "nccl"]
    assert "consul" not in [c.name for c in registry.select(None, ["consul"])]
    with pytest.raises(ValueError, match="unknown check.*nope"):
        registry.select(["nope"], None)


def test_python_is_3_11_or_newer():
    assert sys.version_info >= (3, 11)


ORDER: list[str] = []


class Load(Check):
    name = "load"
    loads_hardware = True

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


def one_rack(*names):
    return Cluster((Rack("r01", tuple(node(n) for n in names)),))


def test_bracket_checks_read_before_the_load_and_after_the_rack_checks():
    ORDER.clear()
    cluster = one_rack("n1", "n2")
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    steps = Steps()
    outcome = run_preflight(cluster, [Counters(), Load(), Pairs()], {n.name: {} for n in cluster.nodes()}, t,
                            RunOptions(timeout=5.0), parallel=1, progress=steps)
    assert ORDER == ["before n1", "load n1", "before n2", "load n2", "pairs n1,n2", "after n1 (before)",
                     "after n2 (before)"]
    assert [r.check for r in outcome.results if r.node == "n1"] == ["counters", "load", "pairs"]
    # the readings (the bracket's first, the rack check's per-node part) side by side, then the load alone
    assert steps.steps == [("n1", "2 readings"), ("n1", "load"), ("n2", "2 readings"), ("n2", "load")]


def test_a_host_that_stops_answering_gets_no_second_reading():
    ORDER.clear()
    cluster = one_rack("n1", "n2")
    gone = CommandResult(None, "", "ssh: connect to host: No route to host", 0.0, unreachable=True)
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("n2", "uname", reply=gone)
    outcome = run_preflight(cluster, [Counters(), Load()], {"n1": {}, "n2": {}}, t, RunOptions(timeout=5.0))
    assert ORDER == ["before n1", "load n1", "after n1 (before)"]
    assert {r.verdict for r in outcome.results if r.node == "n2"} == {Verdict.UNREACHABLE}
    assert len([r for r in outcome.results if r.node == "n2"]) == 2  # one per check, none twice


def test_report_names_the_depth_in_json_junit_and_table():
    cluster = one_rack("n1")
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    outcome = run_preflight(cluster, [Load()], {"n1": {}}, t, RunOptions(timeout=5.0, depth="full"))
    assert report.to_json(outcome)["summary"]["depth"] == "full"
    assert report.to_junit(outcome).find("properties/property[@name='depth']").get("value") == "full"
    assert report.results_table(outcome.results, 160, title=f"preflight (depth: {report.depth_of(outcome)})").title \
        == "preflight (depth: full)"
    unnamed = run_preflight(cluster, [Load()], {"n1": {}}, t, RunOptions(timeout=5.0))
    assert report.to_json(unnamed)["summary"]["depth"] == "per profile"


def test_every_before_reading_is_taken_ahead_of_the_checks_that_load_gpus_and_links():
    """nvlink's, gpu_throttle's and ib_link_health's "before" readings run in the first stage of a node, the
    load tests each alone after it (ib_pairs loads the links in phase 2, after phase 1); their "after"
    readings come after the rack checks (test above). versions reads the NCCL version nccl printed: after it."""
    from preflight.checks import CHECKS
    from preflight.runner import READINGS_AT_ONCE, node_stages

    stages = node_stages(CHECKS)
    readings = [c.name for c in stages[0].checks]
    assert stages[0].at_once == READINGS_AT_ONCE > 1
    assert [c.name for c in CHECKS if c.scope == "bracket"] == ["nvlink", "gpu_throttle", "ib_link_health"]
    assert {"nvlink", "gpu_throttle", "ib_link_health", "ib_pairs"} <= set(readings)
    assert [(s.at_once, [c.name for c in s.checks]) for s in stages[1:]] == [
        (1, ["pcie_link"]), (1, ["gpu_bandwidth"]), (1, ["dcgm_diag"]), (1, ["nccl"]), (READINGS_AT_ONCE, ["versions"])]
    # every check runs exactly once
    assert sorted(c.name for s in stages for c in s.checks) == sorted(c.name for c in CHECKS)
    # without the check whose output it reads, versions is a reading like the others
    assert "versions" in [c.name for c in node_stages([c for c in CHECKS if c.name != "nccl"])[0].checks]


class Reading(Check):
    """A reading that runs one command, ``read <name>``."""

    scope = "node"

    def __init__(self, name: str, command: str | None = None):
        self.name = name  # type: ignore[misc]
        self.command = command or name

    def run(self, ctx):
        ctx.output(["read", self.command])
        return [self.result(ctx.node, Verdict.PASS, "OK", "read")]


class Busy:
    """A transport reply that takes ``seconds`` and records which commands ran at the same time."""

    def __init__(self, seconds: float):
        import threading

        self.seconds, self.active, self.overlaps, self.lock = seconds, [], [], threading.Lock()

    def __call__(self, argv):
        import time

        with self.lock:
            self.active.append(argv[-1])
            self.overlaps.append(tuple(sorted(self.active)))
        time.sleep(self.seconds)
        with self.lock:
            self.active.remove(argv[-1])
        return CommandResult(0, "ok\n", "", self.seconds)


def test_a_nodes_readings_run_side_by_side_and_a_load_test_alone():
    import time

    from preflight.runner import READINGS_AT_ONCE

    busy = Busy(0.5)
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("*", "read", reply=busy).on("*", "load", reply=busy)

    class Loading(Reading):
        loads_hardware = True

        def run(self, ctx):
            ctx.output(["load", self.name])
            return [self.result(ctx.node, Verdict.PASS, "OK", "loaded")]

    checks = [Reading(f"r{i}") for i in range(2 * READINGS_AT_ONCE)] + [Loading("burn"), Reading("late")]
    started = time.monotonic()
    outcome = run_preflight(one_rack("n1"), checks, {"n1": {}}, t, RunOptions(timeout=5.0))
    took = time.monotonic() - started
    assert [r.check for r in outcome.results] == [c.name for c in checks]  # reported in registry order
    assert {r.verdict for r in outcome.results} == {Verdict.PASS}
    # one after another: (2 x at_once + 2) x 0.5 s; side by side: the readings (2 x at_once + 1) in 3 rounds,
    # then the load alone: 4 x 0.5 s
    assert took < (2 * READINGS_AT_ONCE + 2) * 0.5 - 0.4
    assert max(len(o) for o in busy.overlaps) == READINGS_AT_ONCE
    assert [o for o in busy.overlaps if "burn" in o] == [("burn",)]  # nothing ran beside the load test


def test_two_checks_asking_for_one_command_at_once_share_its_one_run():
    busy = Busy(0.3)
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("*", "read", reply=busy)
    checks = [Reading("a", "ibstat"), Reading("b", "ibstat"), Reading("c", "ibstat")]
    outcome = run_preflight(one_rack("n1"), checks, {"n1": {}}, t, RunOptions(timeout=5.0))
    assert [r.verdict for r in outcome.results] == [Verdict.PASS] * 3
    assert [argv for _, argv in t.calls if argv[0] == "read"] == [("read", "ibstat")]


def test_a_host_lost_during_its_readings_is_unreachable_for_every_check_not_finished():
    gone = CommandResult(None, "", "ssh: connect to host: Connection reset", 0.0, unreachable=True)
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n").on("*", "read", reply="ok\n")
    t.on("n1", "read", "r1", reply=gone)
    checks = [Reading("r0"), Reading("r1")] + [Reading(f"later{i}") for i in range(6)]
    outcome = run_preflight(one_rack("n1"), checks, {"n1": {}}, t, RunOptions(timeout=5.0))
    verdicts = {r.check: r.verdict for r in outcome.results}
    assert len(outcome.results) == len(checks) and set(verdicts) == {c.name for c in checks}  # each once
    assert verdicts["r1"] == Verdict.UNREACHABLE
    # the readings started with r1 may have finished; none started after the host was lost
    started_after = [argv for _, argv in t.calls if argv[:2] == ("read", "later5")]
    assert started_after == [] and verdicts["later5"] == Verdict.UNREACHABLE


HEADERLESS_IDLE_INFO = (Path(__file__).resolve().parents[2] / "fixtures" / "preflight" / "cpupower"
                        / "headerless-from-analyzing-cpu.txt").read_text()


class IdleStatesByRack(Check):
    """A rack check reading a parse with a warning (cpupower without its header)."""

    name = "idle_by_rack"
    scope = "rack"

    def gather(self, ctx):
        return ctx.parsed("cpupower", ["cpupower", "idle-info"])

    def evaluate(self, facts, profile, node):
        return [self.result(node, Verdict.PASS, "IDLE_OK", f"{len(facts.states)} states")]

    def run_rack(self, ctx):
        return [r for c in ctx.nodes for r in self.evaluate(ctx.facts[c.node.name], {}, c.node)]


class IdleStatesBracket(IdleStatesByRack):
    """A bracket check: its first reading before the load tests, its second in finish."""

    name = "idle_bracket"
    scope = "bracket"

    def finish(self, ctx, before):
        after = ctx.parsed("cpupower", ["cpupower", "idle-info", "-c", "1"], cache=False)
        return [self.result(ctx.node, Verdict.PASS, "IDLE_OK", f"{len(before.states)}/{len(after.states)} states")]


def test_rack_and_bracket_checks_note_their_parse_warnings_as_node_checks_do():
    t = ScriptedTransport().on("*", "uname", reply="5.15.0\n")
    t.on("*", "cpupower", "idle-info", reply=HEADERLESS_IDLE_INFO)
    t.on("*", "cpupower", "idle-info", "-c", "1", reply=HEADERLESS_IDLE_INFO)
    outcome = run(t, ["a", "b"], checks=[IdleStatesByRack(), IdleStatesBracket()])
    by = {(r.check, r.node): r for r in outcome.results}
    assert len(by) == 4 and all(r.verdict is Verdict.PASS for r in by.values())
    assert all(r.reason.endswith("parse warning)") for r in by.values() if r.check == "idle_by_rack")
    assert by[("idle_by_rack", "a")].evidence["parse_warnings"] == [
        "`cpupower idle-info` line 1: no 'CPUidle driver:'/'CPUidle governor:' header (a paste that starts below "
        "it): driver unknown"]
    # the bracket check's results carry both readings' warnings
    assert [w.split(" line")[0] for w in by[("idle_bracket", "b")].evidence["parse_warnings"]] == [
        "`cpupower idle-info`", "`cpupower idle-info -c 1`"]
