"""sim/hosts/stubs: a machine has no dcgmi of its own (DCGM's package brings it), and the stub dcgmi answers
only while the stand-in host engine runs, else with dcgmi's own connection error. Called in-process: no machine
is started and no process is spawned (a live pid is this test's own)."""

from __future__ import annotations

import json
import os

import pytest

from sim.hosts import stubs
from sim.hosts.hardware import resolve
from sim.hosts.stubs import gpu_depth

pytestmark = pytest.mark.unit


def test_the_machine_s_own_tools_leave_dcgmi_to_its_package(tmp_path):
    stubs.install(tmp_path, "/usr/bin/python3")
    installed = {path.name for path in tmp_path.iterdir()}
    assert "dcgmi" not in installed
    # nvbandwidth stays: it stands in for a build from NVIDIA's source, which no role performs
    assert {"nvidia-smi", "nvbandwidth", stubs.PROGRAM} <= installed
    assert installed == {stubs.PROGRAM, *stubs.TOOLS} - stubs.PACKAGE_TOOLS


def _diag(capsys, monkeypatch, pid_file) -> tuple[int, str]:
    monkeypatch.setattr(gpu_depth, "HOSTENGINE_PID_FILE", str(pid_file))
    code = gpu_depth.dcgmi(resolve("n1", {}), ["diag", "-r", "1", "-j"])
    return code, capsys.readouterr().out


def test_dcgmi_without_a_host_engine_fails_as_dcgmi_does(tmp_path, capsys, monkeypatch):
    code, out = _diag(capsys, monkeypatch, tmp_path / "nv-hostengine.pid")
    assert code == 256 - 21  # DCGM_ST_CONNECTION_NOT_VALID
    assert out.splitlines() == ["Error: unable to establish a connection to the specified host: localhost",
                                "Error: Unable to connect to host engine. Host engine connection invalid/disconnected."]


def test_dcgmi_with_a_dead_host_engine_s_pid_fails_too(tmp_path, capsys, monkeypatch):
    pid_file = tmp_path / "nv-hostengine.pid"
    pid_file.write_text("4194304\n")  # above the kernel's pid_max: never a live process
    code, out = _diag(capsys, monkeypatch, pid_file)
    assert code == 235 and "Host engine connection invalid" in out


def test_dcgmi_with_a_running_host_engine_answers_its_json(tmp_path, capsys, monkeypatch):
    pid_file = tmp_path / "nv-hostengine.pid"
    pid_file.write_text(f"{os.getpid()}\n")
    code, out = _diag(capsys, monkeypatch, pid_file)
    assert code == 0 and "DCGM GPU Diagnostic" in json.loads(out)
