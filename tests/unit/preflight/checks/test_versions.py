"""preflight/checks/versions.py through scripted version reporters: rack drift, inventory pins, unreadable
reporters."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from preflight.checks import versions
from preflight.checks.base import GatherError, RackContext, RunOptions
from preflight.parsers import nccl as nccl_parser
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.helpers.preflight import ScriptedTransport, context, fixture_text, node, only

pytestmark = pytest.mark.unit

NVSMI_Q = fixture_text("nvsmi_q", "h100-sxm-driver535-full-q-clean.txt")


def version_transport(names, fm="535.161.08", nccl="2.21.5-1+cuda12.4"):
    t = ScriptedTransport()
    for n in names:
        t.on(n, "nvidia-smi", "-q", reply=NVSMI_Q)
        t.on(n, "nv-fabricmanager", "--version", reply=f"Fabric Manager version is : {fm}\n")
        t.on(n, "dpkg-query", reply=nccl)
        t.on(n, "ofed_info", "-s", reply="MLNX_OFED_LINUX-23.10-1.1.9.0:\n")
    return t


def versions_run(names, t, **hostvars):
    contexts = [context(t, node(n, **hostvars)) for n in names]
    facts = {c.node.name: versions.CHECK.gather(c) for c in contexts}
    with ThreadPoolExecutor(2) as pool:
        return versions.CHECK.run_rack(RackContext("r01", contexts, facts, pool, RunOptions()))


def test_equal_versions_pass():
    results = versions_run(["a", "b", "c"], version_transport(["a", "b", "c"]))
    assert {r.verdict for r in results} == {Verdict.PASS}
    assert only(results, node="a").evidence["found"] == {
        "driver": "535.161.08",
        "cuda": "12.2",
        "fabric_manager": "535.161.08",
        "nccl": "2.21.5-1+cuda12.4",
        "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0",
    }


def test_the_node_that_drifted_from_its_rack_fails():
    names = ["a", "b", "c"]
    found = {"driver": "535.161.08", "cuda": "12.2", "fabric_manager": "535.161.08", "nccl": "2.21.5-1+cuda12.4",
             "ofed": "MLNX_OFED_LINUX-23.10-1.1.9.0"}
    facts = {n: dict(found, driver="550.54.15") if n == "b" else dict(found) for n in names}
    contexts = [context(ScriptedTransport(), node(n)) for n in names]  # run_rack judges facts: no command
    with ThreadPoolExecutor(2) as pool:
        results = versions.CHECK.run_rack(RackContext("r01", contexts, facts, pool, RunOptions()))
    assert (only(results, node="b").verdict, only(results, node="b").code) == (Verdict.FAIL, "VERSION_DRIFT")
    assert "rest of rack r01 on 535.161.08" in only(results, node="b").reason
    assert only(results, node="a").verdict is only(results, node="c").verdict is Verdict.PASS


def test_evaluate_judges_one_node_against_its_pins_and_its_rack():
    """Fed facts directly: a pin decides over the rack; without one, the rack's most common value does; a
    node whose reporters could not be read is its ERROR."""
    found = {"driver": "535.161.08", "cuda": "12.2", "fabric_manager": "535.161.08", "nccl": "2.21.5-1+cuda12.4",
             "ofed": None}
    facts = versions.RackVersions("r07", {"a": dict(found), "b": dict(found, cuda="12.4"), "c": dict(found),
                                          "d": GatherError("`nvidia-smi -q` exited 9: no devices")})
    pinned = node("a", preflight_version_pins={"driver": "535.104"})
    [a] = versions.CHECK.evaluate(facts, profile_of(pinned), pinned)
    assert (a.verdict, a.code, a.reason) == (Verdict.FAIL, "VERSION_PIN", "driver 535.161.08, pinned 535.104")
    assert a.evidence["expected"] == {"pins": {"driver": "535.104"}, "rack": {
        "driver": "535.161.08", "cuda": "12.2", "fabric_manager": "535.161.08", "nccl": "2.21.5-1+cuda12.4",
        "ofed": None}}
    [b] = versions.CHECK.evaluate(facts, profile_of(node("b")), node("b"))
    assert (b.verdict, b.code, b.reason) == (Verdict.FAIL, "VERSION_DRIFT", "cuda 12.4, rest of rack r07 on 12.2")
    [c] = versions.CHECK.evaluate(facts, profile_of(node("c")), node("c"))
    assert (c.verdict, c.code, c.reason) == (Verdict.PASS, "VERSIONS_OK", "driver 535.161.08, cuda 12.2, nccl 2.21.5-1+cuda12.4")
    [d] = versions.CHECK.evaluate(facts, profile_of(node("d")), node("d"))
    assert (d.verdict, d.reason) == (Verdict.ERROR, "`nvidia-smi -q` exited 9: no devices")


def test_inventory_pins_decide_and_prefix_match_package_versions():
    names = ["a", "b"]
    results = versions_run(
        names, version_transport(names), preflight_version_pins={"driver": "550.90.07", "nccl": "2.21.5"}
    )
    assert {(r.code, r.reason) for r in results} == {("VERSION_PIN", "driver 535.161.08, pinned 550.90.07")}
    assert versions.matches_pin("2.21.5-1+cuda12.4", "2.21.5") and not versions.matches_pin(
        "2.21.50", "2.21.5"
    )


def test_nccl_version_from_nccl_tests_output_when_no_package():
    assert nccl_parser.version_from_code(22105) == "2.21.5" and nccl_parser.version_from_code(2708) == "2.7.8"
    assert (
        versions.nccl_in_outputs(["# nccl-tests version 2.13.9 nccl-headers=21903 nccl-library=21903\n"])
        == "2.19.3"
    )


def test_an_unreadable_version_reporter_is_an_error_not_an_unknown_version():
    """A reporter that answers with text nobody can read is an ERROR naming the command (it was an unknown
    version, i.e. a silent PASS without a pin); a reporter that is not installed stays unknown."""
    names = ["a", "b"]
    t = version_transport(names)
    t.on("a", "nv-fabricmanager", "--version", reply="Fabric Manager version is : latest\n")
    ctx = context(t, node("a"))
    with pytest.raises(GatherError, match="cannot parse `nv-fabricmanager --version` output"):
        versions.CHECK.gather(ctx)
    t.on("b", "ofed_info", "-s", reply=(127, "bash: ofed_info: command not found\n"))
    assert versions.CHECK.gather(context(t, node("b")))["ofed"] is None


def test_a_dpkg_query_answer_that_is_no_version_is_an_error_not_a_version():
    """libnccl2's version goes through the dpkg-version parser: a dpkg-query that exits 0 with a message on
    stdout is an ERROR naming the command (the message used to become the NCCL version and fail the node as
    a pin mismatch or drift); no version at all (not installed) still falls back to the nccl-tests output."""
    t = version_transport(["a"])
    t.on("a", "dpkg-query", reply="dpkg-query: warning: parsing file '/var/lib/dpkg/status' near line 42\n")
    with pytest.raises(GatherError, match="cannot parse `dpkg-query -W -f '\\$\\{Version\\}' libnccl2` output"):
        versions.CHECK.gather(context(t, node("a")))
    t.on("a", "dpkg-query", reply="")
    assert versions.CHECK.gather(context(t, node("a")))["nccl"] is None
    t.on("a", "dpkg-query", reply="1:2.21.5-1+cuda12.4")
    assert versions.CHECK.gather(context(t, node("a")))["nccl"] == "1:2.21.5-1+cuda12.4"
