"""The drill runner's pure parts: the drills_allowed refusal, the target, the result's verdict and table, the
library listing, and the report it writes (JSON, Markdown, the PNG timeline)."""

from __future__ import annotations

import json

import pytest

from cluster.model import Cluster, Rack, build_node
from common.errors import UsageError
from operate import report
from operate.drill import DrillResult, becomes, library_table, pick_target, refusal
from operate.drill_measure import FaultWindow
from operate.drill_scenario import library, load_drill
from operate.loadtest import Result
from tests.unit.operate.test_drill_measure import CONSUL, RECORDED

pytestmark = pytest.mark.unit

NODES = [build_node(name, {"ansible_host": f"127.0.67.{i}", "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 8,
                           "iu_size": 4}) for i, name in enumerate(("n2", "n1"), 1)]
CLUSTER = Cluster((Rack("r1", tuple(NODES)),))


def result(restored: list[str] | None = None, windows: list[FaultWindow] | None = None) -> DrillResult:
    drill = load_drill("engine-crash")
    load = Result(drill.mix, "http://127.0.67.9:8080", 4.0, 24.0, RECORDED, 24.0, len(RECORDED))
    return DrillResult(drill, "a", ("a",), "http://127.0.67.9:8080", 4.0, load,
                       windows if windows is not None else [FaultWindow("engine_crash", "a", 10.0, 20.0)],
                       CONSUL, restored if restored is not None else ["a: vllm-iu@0.service started"],
                       consul_watched=True)


def test_a_host_without_drills_allowed_true_is_refused_with_the_way_out():
    node = NODES[0]
    assert refusal({"drills_allowed": True}, node, "inv") is None
    for hostvars in ({}, {"drills_allowed": False}, {"drills_allowed": "yes"}):
        why = refusal(hostvars, node, "inv/hosts.yml")
        assert why.startswith("inv/hosts.yml: n2: drills_allowed is not true") and "--override-drills-allowed" in why


def test_the_target_is_the_named_iu_or_node_and_by_default_the_first_iu():
    unit, node = load_drill("engine-crash"), load_drill("consul-agent-down")
    assert pick_target(CLUSTER, unit, None).label == "n1-iu0"
    assert pick_target(CLUSTER, unit, "n2-iu1").unit == "vllm-iu@1.service"
    assert pick_target(CLUSTER, unit, "n2").label == "n2-iu0"
    whole = pick_target(CLUSTER, node, "n2-iu1")
    assert whole.label == "n2" and whole.iu_ids == ("n2-iu0", "n2-iu1")
    with pytest.raises(UsageError, match=r"--target 'n9': no such IU or node \(IUs: n1-iu0, n1-iu1, n2-iu0"):
        pick_target(CLUSTER, unit, "n9")


def test_the_verdict_needs_every_check_every_fault_and_everything_restored():
    measured = result()
    assert not measured.passed  # failed_not_streaming 2 and p99 TTFT 3x: the library's limits say no
    assert {v.check for v in measured.verdicts if not v.met} == {"failed_not_streaming_max", "ttft_p99_ratio_max",
                                                                 "blast_radius_errors_max"}
    text = report.render_text(measured.render())
    assert "route_away_s" in text and "1.20 s" in text and "NOT MET" in text
    assert "restored: 1 of 1: FAILED" in text
    unrestored = result(restored=["a: NOT restored (SIGCONT to PID 7): `kill -CONT 7` exited 1: no such process"])
    assert "restored: 0 of 1" in report.render_text(unrestored.render())
    assert not result(windows=[]).passed  # a fault that never ran is no pass


def test_the_report_has_every_measure_and_a_timeline(tmp_path):
    written, note = report.write(result(), tmp_path)
    assert note is None
    assert {p.name for p in written} == {"drill.json", "drill.md", "drill-timeline.png"}
    data = json.loads((tmp_path / "drill.json").read_text())
    assert data["faults"][0]["route_away_s"] == 1.2 and data["faults"][0]["consul_critical_s"] == 1.0
    assert data["checks"][0] == {"fault": 0, "check": "failed_not_streaming_max", "limit": 0.0, "value": 2,
                                 "met": False}
    assert data["load"]["finished"] == len(RECORDED) and len(data["timeline"]["t"]) == 24
    assert "drill engine-crash on a" in (tmp_path / "drill.md").read_text()
    assert (tmp_path / "drill-timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_the_library_listing_names_every_drill():
    text = report.render_text(library_table([load_drill(str(p)) for p in library()]), width=200)
    for name in ("engine-crash", "engine-stall", "graceful-stop", "weights-missing", "consul-agent-down"):
        assert name in text
    assert "engine_crash at 40 s for 30 s" in text


def test_ansible_become_as_ansible_reads_it():
    assert becomes({"ansible_become": True}) and becomes({"ansible_become": "yes"})
    assert not becomes({}) and not becomes({"ansible_become": False}) and not becomes({"ansible_become": "no"})
    assert pick_target(CLUSTER, load_drill("engine-crash"), "n2-iu0", {"n2": True}).become
