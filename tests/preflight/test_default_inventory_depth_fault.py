"""The virtual cluster's default inventory (inventory/virtual, `virtual create --nodes 4 --racks 2
--fabric mixed`) carries one of the deeper checks' faults, and the simulated tool shows it so that exactly
that host FAILs gpu_throttle. In-process: the stub nvidia-smi is called as a function of the host's hardware
description (as tests/virtual/test_faults.py does), no machine is booted. The demo's own inventory
(sim/demo.py) injects the same kind, and tests/test_demo.py checks `make demo` prints it caught.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from cluster.ansible.inventory import load_inventory
from demo import scenario as demo
from preflight import parsers
from preflight.checks import gpu_throttle
from preflight.profiles import profile_for
from preflight.result import Verdict
from sim.hosts import faults, hardware
from sim.hosts.stubs import main as stub_main
from tests.preflight.helpers import node

REPO = Path(__file__).resolve().parents[2]


def performance(tmp_path, monkeypatch, host: str, hostvars: dict) -> str:
    hw = faults.apply(hardware.resolve(host, hostvars), hostvars.get("sim_faults", []))
    state = tmp_path / host / "state"
    state.mkdir(parents=True)
    (state / "host.json").write_text(json.dumps({"hardware": hw.to_json(), "state_dir": str(tmp_path)}))
    monkeypatch.setattr(stub_main, "SIM_RUN_DIR", state)
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
