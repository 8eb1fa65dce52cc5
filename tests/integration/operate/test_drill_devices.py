"""``gpu_lost`` and ``ib_port_down`` on what the virtual cluster's stand-ins read: the steps run through the
drill's local transport (``ansible_connection: local``), the host's device tool the machines' stub
``clusterctl-drill-device`` on PATH, against a host state of this test's own (named by the stand-ins' own
environment variables, as ``/run/clusterctl-sim`` on a machine); then read back by the stand-ins themselves:
the stub ``nvidia-smi``, ``dmesg`` and ``ibstat`` (the multi-call program a machine runs) and the stand-in
nvidia-ml-py (sim/nvml_standin). The drill of ``gpu_lost`` through the real edge and
agents is in test_drill_hardware.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.model import build_node
from operate.drill_faults import FaultError, FaultStep, Target
from preflight.transport import RoutingTransport
from sim import nvml_standin
from sim.hosts import create, stubs
from sim.hosts.hardware import resolve
from sim.hosts.nvidia_module import ROOT_ENV
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

pytestmark = pytest.mark.integration

HOSTVARS = {"ansible_host": "127.0.73.11", "ansible_connection": "local", "rack": "r1", "gpu_model": "h100-sxm",
            "gpu_count": 8, "iu_size": 4, "rdma_nics": create.nics("h100-sxm", False)}
NODE = build_node("n1", HOSTVARS)


@pytest.fixture
def host(tmp_path, monkeypatch) -> Path:
    """This test's host state (host.json, nvml.json), the stub tools on PATH, the driver module loaded."""
    run = tmp_path / "run"
    run.mkdir()
    hw = resolve("n1", HOSTVARS)
    (run / "host.json").write_text(json.dumps({"hardware": hw.to_json(), "address": "127.0.73.11"}))
    write_fake_gpu_file(run / "nvml.json", fake_gpus(8))
    module = tmp_path / "root" / "sys" / "module" / "nvidia"
    module.mkdir(parents=True)
    (module / "version").write_text(hw.versions["driver"] + "\n")
    stubs.install(tmp_path / "bin", sys.executable)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("CLUSTERCTL_SIM_RUN_DIR", str(run))
    monkeypatch.setenv(nvml_standin.FILE_ENV, str(run / "nvml.json"))
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "root"))
    return run


def tool(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def nvml_handle(run: Path, index: int) -> str:
    nvml = nvml_standin.load(run / "nvml.json")
    nvml.nvmlInit()
    try:
        nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(index))
        return "ok"
    except nvml.NVMLError as exc:
        return type(exc).__name__


def test_gpu_lost_shows_in_nvml_nvidia_smi_and_the_kernel_log_and_its_undo_restores_both(host):
    before = {name: (host / name).read_text() for name in ("host.json", "nvml.json")}
    step = FaultStep("gpu_lost", Target(NODE, NODE.ius[1]), RoutingTransport())
    step.inject()
    smi, dmesg = tool("nvidia-smi"), tool("dmesg")
    bus = json.loads(before["host.json"])["hardware"]["gpus"][4]["bus_id"]
    assert smi.returncode == 15 and smi.stdout.startswith(
        f"Unable to determine the device handle for GPU{bus[4:]}: Unknown Error\n"), smi
    assert f"NVRM: Xid (PCI:{bus[4:14].lower()}): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." \
        in dmesg.stdout
    assert nvml_handle(host, 4) == "NVMLError_GpuIsLost" and nvml_handle(host, 3) == "ok"
    assert json.loads((host / "nvml.json").read_text())["gpus"][4]["xid"] == [79]  # NVML's XID event
    assert step.undo() == ["n1-iu1: GPU 4 back on the bus (NVML answers it, its XID 79 lines gone)"]
    assert tool("nvidia-smi").returncode == 0 and "Xid" not in tool("dmesg").stdout
    assert nvml_handle(host, 4) == "ok"
    assert {n: json.loads((host / n).read_text()) for n in before} == {n: json.loads(t) for n, t in before.items()}


def test_ib_port_down_takes_the_nodes_ports_down_in_ibstat_and_its_undo_brings_them_up(host):
    step = FaultStep("ib_port_down", Target(NODE), RoutingTransport())
    states = [line.strip() for line in tool("ibstat").stdout.splitlines() if "state:" in line.lower()]
    assert states and set(states) == {"State: Active", "Physical state: LinkUp"}
    step.inject()
    down = [line.strip() for line in tool("ibstat").stdout.splitlines() if "state:" in line.lower()]
    assert set(down) == {"State: Down", "Physical state: Disabled"} and len(down) == len(states)
    restored = step.undo()
    assert restored == [f"n1: mlx5_{i} port 1 enabled (was Active/LinkUp)" for i in reversed(range(len(NODE.nics)))]
    assert [line.strip() for line in tool("ibstat").stdout.splitlines() if "state:" in line.lower()] == states
    calls = [json.loads(line)["argv"] for line in (host / "calls.log").read_text().splitlines()]
    assert ["ibportstate", "-C", "mlx5_0", "-P", "1", "-D", "0", "1", "disable"] in calls  # as on a real host


def test_a_host_without_the_state_fails_the_step_naming_the_file(host, tmp_path, monkeypatch):
    monkeypatch.setenv(nvml_standin.FILE_ENV, str(tmp_path / "nowhere.json"))
    step = FaultStep("gpu_lost", Target(NODE, NODE.ius[0]), RoutingTransport())
    with pytest.raises(FaultError, match=r"`clusterctl-drill-device gpu-state 0` exited 1: clusterctl-drill-device: \S+nowhere.json: No such file"):
        step.inject()
    assert step.undos == [] and "lost" not in (host / "host.json").read_text().replace('"lost": false', "")


def test_a_host_without_the_tools_fails_the_step_with_nothing_changed(host, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    step = FaultStep("gpu_lost", Target(NODE, NODE.ius[0]), RoutingTransport())
    with pytest.raises(FaultError, match=r"^n1: `clusterctl-drill-device gpu-state 0` did not finish: .*No such file or directory"):
        step.inject()
    ports = FaultStep("ib_port_down", Target(NODE), RoutingTransport())
    with pytest.raises(FaultError, match=r"^n1: `ibportstate -C mlx5_0 -P 1 -D 0 1 query` did not finish: .*No such file"):
        ports.inject()
    assert step.undos == [] and ports.undos == []
