"""``clusterctl remediate`` for real on loopback: node n1 is this machine (``ansible_connection: local``), its
unit ``vllm-iu@0.service`` a simulated vLLM process (``python -m sim.vllm`` on 127.0.73.2) under the
``systemctl`` stand-in (tests/helpers/units.py), registered on the dev Consul's agent (127.0.73.1) so the
ladder's maintenance goes through the agent API as on a node; n2 and n3 are catalog entries only (the breaker
counts them, nothing touches them). The ladder's real commands run: ``systemctl restart``, ``is-active``,
``nvidia-smi`` for the GPU reset (absent here: the step fails as on a host without the driver's tools)."""

from __future__ import annotations

import json
import sys

import pytest
import yaml

from cli.main import main
from consul_io import layout
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from tests.helpers import units
from tests.integration.operate.pool import n1_serving, stand_in_units

pytestmark = pytest.mark.integration

PORT = 8000
UNIT = "vllm-iu@0.service"


def host(n: int) -> str:
    return f"127.0.73.{n + 1}"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """(consul address, ConsulIO, units dir, inventory path): n1's unit running and registered, n2 and n3
    listed in the catalog, every check passing."""
    units_dir = stand_in_units(tmp_path, monkeypatch)
    hosts = {f"n{n}": {"ansible_host": host(n), "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 4,
                       "iu_size": 4, "iu_ports": [PORT]} for n in (1, 2, 3)}
    hosts["n1"]["ansible_connection"] = "local"  # the ladder's host steps run here; n2 and n3 are never touched
    inventory = tmp_path / "hosts.yml"
    inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
    with DevConsulServer(addr=f"{host(0)}:0", node_name="n1") as server:
        io = ConsulIO(server.address)
        with n1_serving(io, units_dir, tmp_path, host, PORT, UNIT):
            yield server.address, io, units_dir, inventory


def main_code(argv: list[str]) -> int:
    try:
        main(argv)
    except SystemExit as exc:
        return exc.code
    return 0


def remediate(capsys, inventory, consul: str, *args: str) -> tuple[int, dict]:
    code = main_code(["remediate", "-i", str(inventory), "--target", "n1-iu0", "--consul", consul, "--json", *args])
    return code, json.loads(capsys.readouterr().out)


def checks(io: ConsulIO, iu: str) -> dict[str, str]:
    _, entries = io.health_service()
    return next({c["CheckID"]: c.get("Notes", "") for c in e["Checks"]} for e in entries if e["Service"]["ID"] == iu)


def test_without_apply_it_plans_and_touches_nothing(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    pid = units.main_pid(units_dir, UNIT)
    code, outcome = remediate(capsys, inventory, consul)
    assert code == 0 and outcome["state"] == "planned", outcome
    assert [line.split(":")[0] for line in outcome["plan"]] == ["breaker", "first rung", "drain", "restart", "gpu_reset",
                                                                "reboot", "repair", "release"]
    assert outcome["breaker"][0]["open"] is False and outcome["steps"] == []
    assert units.main_pid(units_dir, UNIT) == pid and layout.maintenance_check("n1-iu0") not in checks(io, "n1-iu0")


def test_a_crashed_unit_is_drained_restarted_verified_and_released(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    units.stop(units_dir, UNIT)  # the engine died (systemd gave up restarting it)
    assert not units.answers_health(f"{host(1)}:{PORT}")
    code, outcome = remediate(capsys, inventory, consul, "--apply", "--reason", "engine crashed", "--verify-s", "60")
    with capsys.disabled():
        print(f"\nremediate a crashed unit: healthy after {outcome['healthy_s']:.2f} s, done in "
              f"{outcome['took_s']:.2f} s; steps: "
              + ", ".join(f"{s['rung']} {s['took_s']:.2f} s" for s in outcome["steps"]))
    assert code == 0 and outcome["state"] == "released", outcome
    assert [s["rung"] for s in outcome["steps"]] == ["drain", "restart", "verify restart", "release"]
    assert all(s["ok"] for s in outcome["steps"])
    assert units.main_pid(units_dir, UNIT) and units.answers_health(f"{host(1)}:{PORT}")
    assert layout.maintenance_check("n1-iu0") not in checks(io, "n1-iu0")  # back in rotation
    assert outcome["healthy_s"] < 300  # the five minutes


def test_a_unit_that_will_not_come_back_climbs_to_gpu_reset_and_stops_when_nvidia_smi_cannot_run(fleet, tmp_path, capsys):
    consul, io, units_dir, inventory = fleet
    units.stop(units_dir, UNIT)
    # an engine that dies at start, as vLLM does on a GPU it cannot use
    units.declare(units_dir, UNIT, [sys.executable, "-c", "raise SystemExit('CUDA error: unknown error')"],
                  tmp_path / "n1-iu0.log")
    code, outcome = remediate(capsys, inventory, consul, "--apply", "--verify-s", "2")
    assert code == 1 and outcome["state"] == "stopped", outcome
    rungs = [(s["rung"], s["ok"]) for s in outcome["steps"]]
    assert rungs == [("drain", True), ("restart", True), ("verify restart", False), ("gpu_reset", False)], rungs
    reset = outcome["steps"][-1]
    assert reset["did"] == [f"systemctl stop {UNIT}"], reset
    assert "`nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode --format=csv,noheader -i 0,1,2,3`" in reset["detail"], reset
    assert outcome["left"] == [f"n1-iu0: in maintenance (out of rotation); {UNIT} stopped; clear it with "
                               "`clusterctl preflight --release` once the unit is fixed"]
    # stopped on the failure: still drained, nothing of the repair rung done
    assert checks(io, "n1-iu0")[layout.maintenance_check("n1-iu0")].startswith("clusterctl remediate: unhealthy")
    assert io.kv_read(layout.repair_key("dc1", "n1")) == (0, None)


def test_the_repair_rung_takes_the_node_out_and_records_why(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    code, outcome = remediate(capsys, inventory, consul, "--apply", "--from", "repair", "--reason", "XID 79",
                              "--max-unit-share", "0.34")
    assert code == 1 and outcome["state"] == "repair", outcome
    assert [s["rung"] for s in outcome["steps"]] == ["drain", "repair"]
    assert checks(io, "n1-iu0")[layout.maintenance_check("n1-iu0")] == "clusterctl remediate: XID 79"
    _, value = io.kv_read(layout.repair_key("dc1", "n1"))
    record = json.loads(value)
    assert record["iu"] == "n1-iu0" and record["reason"] == "XID 79" and record["by"] == "clusterctl remediate"
    assert record["steps"][0].startswith("drain: ok")
    code, again = remediate(capsys, inventory, consul, "--apply")  # the repair's maintenance is not cleared
    assert code == 1 and again["state"] == "refused" and again["steps"] == [], again
    assert layout.maintenance_check("n1-iu0") in checks(io, "n1-iu0")
    code, planned = remediate(capsys, inventory, consul)
    assert code == 0 and planned["message"].endswith("(it would be refused now: the node is marked for repair, "
                                                     "clusterctl/repair/dc1/n1)"), planned


def test_the_breaker_refuses_when_another_unit_is_already_out_and_nothing_is_touched(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    # n2's unit failing its check: with 3 units, 10% allows one out, so n1's would be a second
    assert io.client.catalog.register("n2", host(2), check={"CheckID": "vllm-iu:n2-iu0:health", "Name": "health",
                                                              "ServiceID": "n2-iu0", "Status": "critical"})
    pid = units.main_pid(units_dir, UNIT)
    code, outcome = remediate(capsys, inventory, consul, "--apply")
    assert code == 1 and outcome["state"] == "breaker", outcome
    assert outcome["message"].startswith("breaker open: 2 of 3 units would be out of rotation, more than 1")
    assert "n2-iu0: vllm-iu:n2-iu0:health critical" in outcome["message"]
    assert outcome["steps"] == [] and outcome["left"] == ["n1-iu0: untouched (not drained)"]
    assert units.main_pid(units_dir, UNIT) == pid and layout.maintenance_check("n1-iu0") not in checks(io, "n1-iu0")


def test_an_unreachable_consul_is_exit_3_before_any_host_command(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    pid = units.main_pid(units_dir, UNIT)
    code = main_code(["remediate", "-i", str(inventory), "--target", "n1-iu0", "--consul", f"{host(0)}:1", "--apply"])
    err = capsys.readouterr().err
    assert code == 3 and f"cannot reach Consul at {host(0)}:1 (connection refused)" in err, err
    assert units.main_pid(units_dir, UNIT) == pid

