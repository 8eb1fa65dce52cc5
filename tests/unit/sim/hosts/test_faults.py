"""The simulated faults (sim/hosts/faults.py) as the stub tools show them and as preflight's checks judge them.
In-process: the stub tools are called as functions of the host's hardware description, no machine is booted.

- The virtual cluster's default inventory (inventory/virtual, `virtual create --nodes 4 --racks 2 --fabric
  mixed`) carries one of the deeper checks' faults, and the simulated nvidia-smi shows it so that exactly that
  host FAILs gpu_throttle; the demo's own inventory injects the same kind (tests/machines/test_demo.py checks
  that `make demo` prints it caught).
- ``nvlink_down`` shows in ``nvidia-smi nvlink -s`` as a real node with those links down shows it
  (``\\t Link L: <inactive>``, the layout of the nvlink_status fixtures), so the nvlink check FAILs
  NVLINK_INACTIVE on that node and PASSes without the fault; dcgm_diag's DCGM#198 cross-check WARNs there.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest

from cluster.ansible.inventory import load_inventory
from demo import scenario as demo
from preflight import parsers
from preflight.checks import dcgm_diag, gpu_throttle, nvlink
from preflight.profiles import profile_for
from preflight.result import Verdict
from sim.hosts import create, faults, hardware
from sim.hosts.stubs import gpu_depth
from sim.hosts.stubs import main as stub_main
from tests.helpers.preflight import node

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[4]


def performance(tmp_path, monkeypatch, host: str, hostvars: dict) -> str:
    hw = faults.apply(hardware.resolve(host, hostvars), hostvars.get("sim_faults", []))
    state = tmp_path / host / "state"
    state.mkdir(parents=True)
    (state / "host.json").write_text(json.dumps({"hardware": hw.to_json(), "state_dir": str(tmp_path)}))
    monkeypatch.setattr(stub_main, "SIM_RUN_DIR", state)
    (state / "nv-hostengine.pid").write_text(f"{os.getpid()}\n")  # DCGM's host engine runs: this process
    monkeypatch.setattr(gpu_depth, "HOSTENGINE_PID_FILE", str(state / "nv-hostengine.pid"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert stub_main.run_tool("nvidia-smi", gpu_throttle.PERFORMANCE[1:], hw) == 0
    return out.getvalue()


def test_the_default_virtual_inventory_fails_gpu_throttle_on_exactly_its_faulty_host(tmp_path, monkeypatch):
    inventory = load_inventory(REPO / "inventory" / "virtual")
    verdicts = {}
    for host, hostvars in sorted(inventory.everyone.items()):
        reading = parsers.parse("nvsmi-perf", performance(tmp_path, monkeypatch, host, hostvars))
        facts = {"before": reading, "after": reading}
        (result,) = gpu_throttle.CHECK.evaluate(facts, profile_for(host, hostvars), node(host))
        verdicts[host] = (result.verdict, result.code, result.reason)
    throttled = {h for h, hv in inventory.everyone.items()
                 if any(f["kind"] == "gpu_throttle" for f in hv.get("sim_faults", []))}
    assert throttled == {"r02n02"}
    verdict, code, reason = verdicts.pop("r02n02")
    assert (verdict, code) == (Verdict.FAIL, "THROTTLE_ACTIVE") and reason.startswith("GPU5 (")
    assert "hw_thermal_slowdown active after load" in reason
    assert {(v, c) for v, c, _ in verdicts.values()} == {(Verdict.PASS, "THROTTLE_OK")} and len(verdicts) == 3


def test_the_demo_injects_a_gpu_throttle_fault_too():
    assert {"kind": "gpu_throttle", "gpu": 5} in demo.FAULTY_NODE_FAULTS


def hostvars(gpu_model: str = "h100-sxm", sim_faults: list | None = None) -> dict:
    return {"gpu_model": gpu_model, "group_names": ["rack_r01"], "rdma_nics": create.nics(gpu_model, False),
            "sim_faults": sim_faults or []}


def tool(tmp_path, monkeypatch, host: str, hv: dict, argv: list[str]) -> tuple[int, str]:
    """``argv`` (``nvidia-smi nvlink -s`` etc.) run by the stub on ``host``'s hardware with its sim_faults."""
    hw = faults.apply(hardware.resolve(host, hv), hv.get("sim_faults", []))
    state = tmp_path / host / "state"
    state.mkdir(parents=True, exist_ok=True)
    (state / "host.json").write_text(json.dumps({"hardware": hw.to_json(), "state_dir": str(tmp_path)}))
    monkeypatch.setattr(stub_main, "SIM_RUN_DIR", state)
    (state / "nv-hostengine.pid").write_text(f"{os.getpid()}\n")  # DCGM's host engine runs: this process
    monkeypatch.setattr(gpu_depth, "HOSTENGINE_PID_FILE", str(state / "nv-hostengine.pid"))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = stub_main.run_tool(argv[0], argv[1:], hw)
    return code, out.getvalue()


def nvlink_verdict(tmp_path, monkeypatch, host: str, hv: dict):
    code, status = tool(tmp_path, monkeypatch, host, hv, nvlink.STATUS)
    assert code == 0
    _, errors = tool(tmp_path, monkeypatch, host, hv, nvlink.ERRORS)
    reading = parsers.parse("nvlink-errors", errors)
    facts = {"status": parsers.parse("nvlink-status", status), "before": reading, "after": reading,
             "elapsed_s": 60.0}
    (result,) = nvlink.CHECK.evaluate(facts, profile_for(host, hv), node(host, gpu_model=hv["gpu_model"]))
    return result, status


def test_nvlink_down_prints_the_pairs_links_inactive_in_nvlink_s(tmp_path, monkeypatch):
    _, status = tool(tmp_path, monkeypatch, "n1", hostvars(sim_faults=[{"kind": "nvlink_down", "gpus": [2, 3]}]),
                     nvlink.STATUS)
    lines = status.splitlines()
    gpu2 = lines.index(next(line for line in lines if line.startswith("GPU 2: NVIDIA H100 80GB HBM3 (UUID: ")))
    assert lines[gpu2 + 1:gpu2 + 19] == [f"\t Link {n}: <inactive>" for n in range(18)]  # the real tool's line
    report = parsers.parse("nvlink-status", status)
    active = {g.index: sum(link.active for link in g.links) for g in report.gpus}
    assert {g.index: len(g.links) for g in report.gpus} == dict.fromkeys(range(8), 18)
    assert active == {0: 18, 1: 18, 2: 0, 3: 0, 4: 18, 5: 18, 6: 18, 7: 18}
    _, errors = tool(tmp_path, monkeypatch, "n1", hostvars(sim_faults=[{"kind": "nvlink_down", "gpus": [2, 3]}]),
                     nvlink.ERRORS)
    counters = {g.index: {link.link: link.counters["replay"] for link in g.links}
                for g in parsers.parse("nvlink-errors", errors).gpus}
    assert set(counters[2].values()) == {None} and set(counters[0].values()) == {0}  # N/A on a down link


def test_nvlink_down_fails_nvlink_inactive_and_passes_without_the_fault(tmp_path, monkeypatch):
    result, _ = nvlink_verdict(tmp_path, monkeypatch, "n1",
                               hostvars(sim_faults=[{"kind": "nvlink_down", "gpus": [2, 3]}]))
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_INACTIVE")
    assert result.reason.startswith("GPU2: 0 of 18 NVLinks active (inactive: 0, 1, 2,") and "(+1 more)" in result.reason
    assert result.evidence["problems"][1].startswith("GPU3: 0 of 18 NVLinks active")
    healthy, _ = nvlink_verdict(tmp_path, monkeypatch, "n2", hostvars())
    assert (healthy.verdict, healthy.code) == (Verdict.PASS, "NVLINK_OK")


@pytest.mark.parametrize(("gpu_model", "links", "inactive"), [
    ("h100-sxm", 12, list(range(12, 18))),  # links: the NVLinks left: 6 of each GPU's 18 down
    ("a100-sxm", 0, list(range(12))),
])
def test_nvlink_down_links_left_stay_active(tmp_path, monkeypatch, gpu_model, links, inactive):
    hv = hostvars(gpu_model, [{"kind": "nvlink_down", "gpus": [5, 6], "links": links}])
    hw = faults.apply(hardware.resolve("n1", hv), hv["sim_faults"])
    assert [hw.gpus[g].nvlink_inactive for g in (4, 5, 6)] == [[], inactive, inactive]
    assert hw.nvlinks(5, 6) == links
    result, _ = nvlink_verdict(tmp_path, monkeypatch, "n1", hv)
    assert (result.verdict, result.code) == (Verdict.FAIL, "NVLINK_INACTIVE")
    assert result.reason.startswith(f"GPU5: {links} of {12 if gpu_model == 'a100-sxm' else 18} NVLinks active")


def test_nvlink_down_links_out_of_range_is_named():
    with pytest.raises(faults.FaultError, match="links 19 out of range 0..18"):
        faults.apply(hardware.resolve("n1", hostvars()), [{"kind": "nvlink_down", "gpus": [0, 1], "links": 19}])


def test_dcgm_passing_on_the_nvlink_down_node_warns_the_cross_check(tmp_path, monkeypatch):
    hv = hostvars(sim_faults=[{"kind": "nvlink_down", "gpus": [2, 3]}])
    code, diag = tool(tmp_path, monkeypatch, "n1", hv, ["dcgmi", "diag", "-r", "2", "-j"])
    _, status = tool(tmp_path, monkeypatch, "n1", hv, nvlink.STATUS)
    assert code == 0
    facts = {"diag": parsers.parse("dcgm-diag", diag), "level": 2, "depth": "standard",
             "nvlinks": parsers.parse("nvlink-status", status)}
    (result,) = dcgm_diag.CHECK.evaluate(facts, profile_for("n1", hv), node("n1"))
    assert (result.verdict, result.code) == (Verdict.WARN, "DCGM_CROSS_CHECK")
    assert "36 inactive NVLinks" in result.reason


def test_the_default_inventory_and_the_demo_fail_nvlink_where_nvlink_down_is_injected(tmp_path, monkeypatch):
    inventory = load_inventory(REPO / "inventory" / "virtual")
    verdicts = {host: nvlink_verdict(tmp_path, monkeypatch, host, {"gpu_model": "h100-sxm", **hv})[0]
                for host, hv in sorted(inventory.everyone.items())}
    down = {h for h, hv in inventory.everyone.items()
            if any(f["kind"] == "nvlink_down" for f in hv.get("sim_faults", []))}
    assert down == {"r01n02"}
    assert {h: (r.verdict, r.code) for h, r in verdicts.items()} == {
        h: (Verdict.FAIL, "NVLINK_INACTIVE") if h in down else (Verdict.PASS, "NVLINK_OK") for h in verdicts}
    assert verdicts["r01n02"].reason.startswith("GPU2: 0 of 18 NVLinks active")
    faulty, _ = nvlink_verdict(tmp_path, monkeypatch, "demo", hostvars(sim_faults=demo.FAULTY_NODE_FAULTS))
    assert (faulty.verdict, faulty.code) == (Verdict.FAIL, "NVLINK_INACTIVE")
