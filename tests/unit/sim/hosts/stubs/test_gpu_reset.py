"""The stand-in ``nvidia-smi --gpu-reset`` and ``-pm`` (sim/hosts/stubs/gpu_reset.py): the scope nvidia-smi(1)
allows on an NVSwitch board, the in-use refusal (a live CUDA client, persistence mode) with its text and exit
255, Not Supported (exit 3), a GPU off the bus (exit 15), and what a reset changes in the host description."""

from __future__ import annotations

import json
import os

import pytest

from operate.gpu_reset import fabric_states
from sim.hosts import gpu_clients
from sim.hosts.hardware import Hardware, resolve
from sim.hosts.stubs import gpu_reset, nvidia_smi

pytestmark = pytest.mark.unit


@pytest.fixture
def board(tmp_path):
    """(hardware, run dir): an 8-GPU H100 board whose host.json is in the run dir, persistence mode on."""
    hw = resolve("n1", {"gpu_count": 8})
    hw.gpus[4].ecc_uncorrectable, hw.gpus[4].row_remap_pending = 2, True
    (tmp_path / "host.json").write_text(json.dumps({"hardware": hw.to_json()}))
    return hw, tmp_path


def saved(run_dir) -> Hardware:
    return Hardware.from_json(json.loads((run_dir / "host.json").read_text())["hardware"])


def pm_off(hw, run_dir, capsys):
    assert gpu_reset.persistence(hw, hw.gpus, "0", run_dir) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Disabled persistence mode for GPU {hw.gpus[0].bus_id}." and out[-1] == "All done."


def test_persistence_mode_holds_the_gpu_and_the_reset_is_refused_in_use(board, capsys):
    hw, run_dir = board
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 255
    out = capsys.readouterr().out
    assert out.startswith(f"The following GPUs could not be reset:\n  GPU {hw.gpus[4].bus_id}: In use by another "
                          f"client\n")
    assert "\n4 devices are currently being used by one or more other processes (e.g., Fabric Manager" in out
    assert out.rstrip().endswith("Please first kill all processes using this device and all compute applications "
                                 "running in the system.")
    assert saved(run_dir).gpus[4].ecc_uncorrectable == 2  # nothing reset


def test_with_fabric_manager_the_units_gpus_reset_alone_and_the_reset_clears_them(board, capsys):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    assert saved(run_dir).gpus[0].persistence_mode is False
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 0
    assert capsys.readouterr().out.splitlines() == [f"GPU {g.bus_id} was successfully reset." for g in hw.gpus[4:]]
    after = saved(run_dir).gpus[4]
    assert after.ecc_uncorrectable == 0 and not after.row_remap_pending  # the remapped row took effect


def test_without_fabric_manager_the_nvlink_peers_left_out_are_named_and_nothing_is_reset(board, capsys):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: False) == 255
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"Unable to reset GPU {hw.gpus[4].bus_id}: its NVLink peers must be reset in the same")
    assert all(f"GPU {g.bus_id}" in line for g in hw.gpus[:4])
    assert saved(run_dir).gpus[4].row_remap_pending
    assert gpu_reset.reset(hw, hw.gpus, run_dir, lambda: False) == 0  # the whole board: allowed


def test_a_live_cuda_process_on_any_gpu_blocks_a_board_reset(board, capsys, monkeypatch):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    env = {gpu_clients.RUN_DIR_ENV: str(run_dir), "CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert gpu_clients.register_self(env, pid=os.getpid()) is not None  # this process: alive
    assert gpu_clients.holders(run_dir) == {g: [os.getpid()] for g in range(4)}
    assert gpu_reset.reset(hw, hw.gpus, run_dir, lambda: False) == 255
    assert "GPU 00000000:18:00.0: In use by another client" in capsys.readouterr().out
    # with Fabric Manager the other unit's GPUs are not in the way of resetting GPUs 4-7 alone
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 0


def test_a_gpu_that_cannot_be_reset_is_not_supported_exit_3(board, capsys):
    hw, run_dir = board
    hw.gpus[5].reset_supported = False
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 3
    assert capsys.readouterr().out == f"Unable to reset GPU {hw.gpus[5].bus_id}: Not Supported\n"


def test_nvidia_smi_dispatches_reset_and_persistence_and_a_lost_gpu_exits_15(board, capsys, monkeypatch):
    hw, run_dir = board
    monkeypatch.setattr(nvidia_smi, "SIM_RUN_DIR", run_dir)
    monkeypatch.setattr(gpu_reset, "fabric_manager_active", lambda: True)
    assert nvidia_smi.main(hw, ["-pm", "0", "-i", "4,5,6,7"]) == 0
    assert nvidia_smi.main(hw, ["--gpu-reset", "-i", "4,5,6,7"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"GPU {hw.gpus[7].bus_id} was successfully reset."
    assert nvidia_smi.main(hw, ["--query-gpu=index,persistence_mode", "--format=csv,noheader", "-i", "3,4"]) == 0
    assert capsys.readouterr().out == "3, Enabled\n4, Disabled\n"
    lost = hw.gpus[6]
    lost.lost = True
    assert nvidia_smi.main(hw, ["-r", "-i", "6"]) == 15
    assert capsys.readouterr().out == f"Unable to determine the device handle for GPU{lost.bus_id[4:]}: Unknown Error\n"


def fabric_lines(hw, index: int) -> list[str]:
    """The State and Status lines of GPU ``index``'s Fabric section in ``nvidia-smi -q -i index``."""
    out = nvidia_smi.query(hw, None, [hw.gpus[index]]).splitlines()
    at = out.index("    Fabric")
    return out[at + 1:at + 3]


def test_after_a_reset_the_fabric_goes_not_started_in_progress_completed_success(board, capsys):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    assert fabric_lines(hw, 4) == [f"        State{' ' * 29}: Completed", f"        Status{' ' * 28}: Success"]
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 0
    after = saved(run_dir)
    at = after.gpus[4].fabric_reset_at
    assert at is not None and after.gpus[0].fabric_reset_at is None  # only the GPUs reset
    after.fabric_train_s = 4.0
    seen = [gpu_reset.fabric(after, after.gpus[4], at + t) for t in (0.0, 1.9, 2.0, 3.9, 4.0, 60.0)]
    assert seen == [("Not Started", "N/A"), ("Not Started", "N/A"), ("In Progress", "N/A"), ("In Progress", "N/A"),
                    ("Completed", "Success"), ("Completed", "Success")]
    assert gpu_reset.fabric(after, after.gpus[0], at) == ("Completed", "Success")  # not reset: registered at boot


def test_a_board_told_to_fail_completes_its_fabric_with_that_status_and_nvidia_smi_q_shows_it(board, capsys):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 0
    after = saved(run_dir)
    after.fabric_failure, after.fabric_train_s = "Insufficient Resources", 0.0
    assert fabric_lines(after, 5) == [f"        State{' ' * 29}: Completed",
                                      f"        Status{' ' * 28}: Insufficient Resources"]


def test_a_board_without_nvlink_has_no_fabric(board):
    hw, _ = board
    hw.nvlink = {pair: 0 for pair in hw.nvlink}
    hw.gpus[2].fabric_reset_at = 0.0
    assert fabric_lines(hw, 2) == [f"        State{' ' * 29}: N/A", f"        Status{' ' * 28}: N/A"]


def test_the_rung_reads_the_stand_ins_fabric_section(board, capsys):
    hw, run_dir = board
    pm_off(hw, run_dir, capsys)
    assert gpu_reset.reset(hw, hw.gpus[4:], run_dir, lambda: True) == 0
    after = saved(run_dir)
    after.fabric_train_s = 3600.0
    states = fabric_states(nvidia_smi.query(after, None, after.gpus[3:5]))
    assert states == {after.gpus[3].bus_id: ("Completed", "Success"), after.gpus[4].bus_id: ("Not Started", "N/A")}
