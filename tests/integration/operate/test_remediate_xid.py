"""``clusterctl remediate`` choosing its first rung from the unit's latest XID, and its reboot rung going through
the provisioning playbooks, for real on loopback: node n1 is this machine (``ansible_connection: local``), its
unit ``vllm-iu@0.service`` a simulated vLLM (127.0.72.2) under the ``systemctl`` stand-in (tests/helpers/units.py),
registered on a dev Consul agent named n1 (127.0.72.1) which also holds n1's score body, as its agent would
write it; n2 and n3 are catalog entries only.

The reboot rung runs ``playbooks/node-reboot.yml`` through provision's runner, unchanged: its drain
(``tasks/node_drain.yml``) puts n1 into Consul node maintenance on that agent, and its reboot task meets
Ansible's own refusal on a local connection ("would reboot the control node"), which is how this machine
sees that the chain reached the reboot, drained, and stopped there."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from cli.main import main
from consul_io import layout
from consul_io.client import ConsulIO
from devconsul.server import DevConsulServer
from sim.hosts import gpu_clients, nvidia_module
from sim.hosts.hardware import resolve
from tests.helpers import units
from tests.integration.operate.pool import n1_serving, stand_in_units

pytestmark = pytest.mark.integration

PORT = 8000
UNIT = "vllm-iu@0.service"
LOCAL_REBOOT_REFUSED = "Running ansible.builtin.reboot with local connection would reboot the control node"


def host(n: int) -> str:
    return f"127.0.72.{n + 1}"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """(consul address, ConsulIO, units dir, inventory path): n1's unit serving and registered on the agent n1,
    n2 and n3 listed in the catalog. The working directory is the test's own (the runner's run dirs go there)."""
    units_dir = stand_in_units(tmp_path, monkeypatch)
    monkeypatch.chdir(tmp_path)
    with DevConsulServer(addr=f"{host(0)}:0", node_name="n1") as server:
        hosts = {f"n{n}": {"ansible_host": host(n), "rack": "r1", "gpu_model": "h100-sxm", "gpu_count": 4,
                           "iu_size": 4, "iu_ports": [PORT]} for n in (1, 2, 3)}
        # the ladder's host steps and the reboot playbook run here, as the inventory's user (no sudo)
        hosts["n1"].update(ansible_connection="local", ansible_become=False, ansible_python_interpreter=sys.executable,
                           consul_http_addr=server.address, consul_agent_acl_enabled=False,
                           clusterctl_drain_poll_s=0.5, clusterctl_drain_view_timeout_s=10)
        inventory = tmp_path / "hosts.yml"
        inventory.write_text(yaml.safe_dump({"all": {"hosts": hosts}}))
        io = ConsulIO(server.address)
        with n1_serving(io, units_dir, tmp_path, host, PORT, UNIT):
            yield server.address, io, units_dir, inventory


def publish_xid(io: ConsulIO, xid: int) -> None:
    """n1's score body as its agent publishes it after NVML reported ``xid`` on one of n1-iu0's GPUs."""
    body = {"node": "n1", "ts": 1.0, "heartbeat_s": 2.0, "ius": {"n1-iu0": {
        "score": None, "level": None, "status": "critical", "reason": f"XID {xid}",
        "components": {"xid_events": 1, "xid_last": xid}}}}
    assert io.kv_put(layout.score_key("dc1", "n1"), json.dumps(body))


def remediate(capsys, inventory, consul: str, *args: str) -> tuple[int, dict]:
    try:
        main(["remediate", "-i", str(inventory), "--target", "n1-iu0", "--consul", consul, "--json", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code
    return code, json.loads(capsys.readouterr().out)


def node_checks(io: ConsulIO) -> dict[str, str]:
    _, entries = io.health_service()
    return next({c["CheckID"]: c.get("Notes", "") for c in e["Checks"]} for e in entries
                if e["Service"]["ID"] == "n1-iu0")


def test_the_plan_starts_where_the_units_latest_xid_says(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    publish_xid(io, 79)
    code, outcome = remediate(capsys, inventory, consul)
    assert code == 0 and outcome["state"] == "planned", outcome
    assert outcome["start"] == "reboot"
    assert outcome["plan"][1] == ("first rung: from the XID catalogue: reboot: xid_last 79 in its score body (1 events): "
                                  "XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS, NVIDIA's immediate action RESTART_BM")
    assert [line.split(":")[0] for line in outcome["plan"][3:]] == ["reboot", "repair", "release"]
    code, named = remediate(capsys, inventory, consul, "--from", "restart")  # the operator's word wins
    assert named["start"] == "restart" and named["start_why"] == "named by the operator (--from)"


def stand_in_nvidia_smi(tmp_path, monkeypatch) -> Path:
    """The simulated hosts' ``nvidia-smi`` on PATH (ahead of none: this machine has no driver), answering from an
    H100 board of n1's four GPUs with the driver loaded; the run dir (host.json, calls.log) is returned."""
    run_dir, root = tmp_path / "sim-run", tmp_path / "sim-root"
    run_dir.mkdir()
    (root / "sys/module/nvidia").mkdir(parents=True)
    hw = resolve("n1", {"gpu_model": "h100-sxm", "gpu_count": 4})
    (root / "sys/module/nvidia/version").write_text(hw.versions["driver"] + "\n")
    (run_dir / "host.json").write_text(json.dumps({"hardware": hw.to_json()}))
    monkeypatch.setenv(nvidia_module.ROOT_ENV, str(root))
    monkeypatch.setenv(gpu_clients.RUN_DIR_ENV, str(run_dir))
    script = tmp_path / "bin" / "nvidia-smi"  # stand_in_units put tmp_path/bin first on PATH
    script.write_text(f"#!/bin/sh\nCLUSTERCTL_SIM_TOOL=nvidia-smi exec {sys.executable} -c "
                      f"'from sim.hosts.stubs.main import main; main()' \"$@\"\n")
    script.chmod(0o755)
    return run_dir


def test_an_uncontained_memory_error_resets_the_board_without_a_restart_first(fleet, tmp_path, monkeypatch, capsys):
    consul, io, units_dir, inventory = fleet
    run_dir = stand_in_nvidia_smi(tmp_path, monkeypatch)
    publish_xid(io, 95)  # NVIDIA: RESET_GPU; a restart of the engine would not clear it
    pid = units.main_pid(units_dir, UNIT)
    code, outcome = remediate(capsys, inventory, consul, "--apply", "--verify-s", "30")
    with capsys.disabled():
        print(f"\ngpu_reset rung: healthy after {outcome['healthy_s']:.2f} s; steps: "
              + ", ".join(f"{s['rung']} {s['took_s']:.2f} s" for s in outcome["steps"]))
    assert code == 0 and outcome["state"] == "released", outcome
    assert [(s["rung"], s["ok"]) for s in outcome["steps"]] == [("drain", True), ("gpu_reset", True),
                                                                ("verify gpu_reset", True), ("release", True)]
    reset = outcome["steps"][1]
    # no Fabric Manager here: the whole board in one command, persistence mode off around it
    assert reset["detail"].startswith("nvidia-fabricmanager.service not active on n1"), reset
    assert reset["did"][:5] == [f"systemctl stop {UNIT}",
                                "nvidia-smi --query-gpu=index,pci.bus_id,persistence_mode --format=csv,noheader -i 0,1,2,3",
                                "nvidia-smi -pm 0 -i 0,1,2,3", "nvidia-smi --gpu-reset", "nvidia-smi -pm 1 -i 0,1,2,3"]
    # the stand-in's fabric trains for 0.5 s after the reset: the units start once nvidia-smi -q reads it Completed
    assert re.fullmatch(r"nvidia-smi -q -i 0,1,2,3: fabric Completed/Success on 4 GPU\(s\) after [2-9] poll\(s\)",
                        reset["did"][5]), reset
    assert reset["did"][6:] == [f"systemctl reset-failed {UNIT}", f"systemctl start {UNIT}"], reset
    calls = [json.loads(line)["argv"][1:] for line in (run_dir / "calls.log").read_text().splitlines()]
    assert ["--gpu-reset"] in calls
    board = json.loads((run_dir / "host.json").read_text())["hardware"]["gpus"]
    assert all(g["persistence_mode"] for g in board)  # put back as it was
    new_pid = units.main_pid(units_dir, UNIT)
    assert pid and new_pid and new_pid != pid and layout.maintenance_check("n1-iu0") not in node_checks(io)


def test_the_reboot_rung_drains_the_node_through_the_provisioning_playbooks(fleet, capsys):
    consul, io, units_dir, inventory = fleet
    publish_xid(io, 79)
    code, outcome = remediate(capsys, inventory, consul, "--apply", "--reason", "XID 79", "--max-unit-share", "0.34")
    assert code == 1 and outcome["state"] == "stopped", outcome
    assert [(s["rung"], s["ok"]) for s in outcome["steps"]] == [("drain", True), ("reboot", False)]
    assert len(outcome["breaker"]) == 2  # judged again for the whole node before the reboot
    reboot = outcome["steps"][1]
    with capsys.disabled():
        print(f"\nreboot rung: the playbook ran {reboot['took_s']:.1f} s to its refused reboot; {reboot['detail']}")
    assert reboot["did"][0].startswith("ansible-playbook node-reboot.yml --limit n1 (events: ")
    assert LOCAL_REBOOT_REFUSED in reboot["detail"], reboot
    # the playbook's drain ran before its reboot: n1 in Consul node maintenance with the provisioning reason
    checks = node_checks(io)
    assert checks.get("_node_maintenance") == "clusterctl reboot", checks
    assert checks[layout.maintenance_check("n1-iu0")] == "clusterctl remediate: XID 79"
    assert outcome["left"][1].startswith("n1: in Consul node maintenance (clusterctl reboot)")
    assert io.kv_read(layout.repair_key("dc1", "n1")) == (0, None)  # stopped short of the repair rung


def test_a_drills_recovery_by_the_ladder_starts_where_the_xid_says(fleet, tmp_path, capsys):
    """The drill's load straight at n1's engine (no edge: what is measured here is which rung the ladder took)."""
    consul, io, units_dir, inventory = fleet
    publish_xid(io, 95)
    mix = {"name": "xid-drill-mix", "classes": {"short": {
        "share": 1, "prompt_tokens": 50, "output_tokens": 8, "slo": {"ttft_p99_ms": 3000}}}}
    (tmp_path / "mix.yml").write_text(yaml.safe_dump(mix))
    drill = {"name": "crash-remediated", "recovery": "remediate",
             "load": {"mix": "mix.yml", "rate_per_s": 2, "duration_s": 6, "seed": 3, "timeout_s": 5},
             "faults": [{"kind": "engine_crash", "at_s": 1, "hold_s": 1}], "checks": {"blast_radius_errors_max": 0}}
    (tmp_path / "drill.yml").write_text(yaml.safe_dump(drill, sort_keys=False))
    try:
        main(["drill", str(tmp_path / "drill.yml"), "-i", str(inventory), "--endpoint", f"http://{host(1)}:{PORT}",
              "--target", "n1-iu0", "--consul", consul, "--override-drills-allowed", "--json"])
        code = 0
    except SystemExit as exc:
        code = exc.code
    result = json.loads(capsys.readouterr().out)
    [ladder] = result["remediations"]
    assert ladder["start"] == "gpu_reset" and "XID 95" in ladder["start_why"], ladder
    assert [(s["rung"], s["ok"]) for s in ladder["steps"]] == [("drain", True), ("gpu_reset", False)]
    assert code == 1 and result["error"].startswith("remediate: gpu_reset could not be carried out"), result["error"]
    # the drill's own undo still put the unit back
    assert units.main_pid(units_dir, UNIT) and result["restored"][0].startswith(f"n1-iu0: {UNIT} started")
