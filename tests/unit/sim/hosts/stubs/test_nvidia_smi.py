"""The stub nvidia-smi with a GPU fallen off the bus: the device-handle line for it, the others answered,
exit 15 (nvidia-smi(1), RETURN VALUE)."""

from __future__ import annotations

import pytest

from sim.hosts.hardware import resolve
from sim.hosts.stubs import nvidia_smi

pytestmark = pytest.mark.unit


def lost_gpu(index: int = 2):
    hw = resolve("n1", {"gpu_count": 8})
    hw.gpus[index].lost = True
    return hw, f"Unable to determine the device handle for GPU{hw.gpus[index].bus_id[4:]}: Unknown Error"


def test_a_lost_gpu_is_named_first_the_others_answer_and_the_exit_is_15(capsys):
    hw, line = lost_gpu()
    assert nvidia_smi.main(hw, ["-L"]) == 15
    out = capsys.readouterr().out.splitlines()
    assert out[0] == line and len(out) == 8 and all(o.startswith("GPU ") for o in out[1:])
    assert "GPU 2:" not in "\n".join(out[1:])


def test_naming_only_the_lost_gpu_prints_its_line_alone(capsys):
    hw, line = lost_gpu()
    assert nvidia_smi.main(hw, ["-q", "-i", "2"]) == 15
    assert capsys.readouterr().out == line + "\n"


def test_without_a_lost_gpu_nothing_changes(capsys):
    assert nvidia_smi.main(resolve("n1", {"gpu_count": 8}), ["-L"]) == 0
    assert "Unable" not in capsys.readouterr().out


def test_i_names_a_gpu_by_index_uuid_or_bus_id_and_an_index_is_not_a_bus_id_suffix(capsys):
    hw = resolve("n1", {"gpu_count": 8})
    query = ["--query-gpu=index", "--format=csv,noheader", "-i"]
    assert nvidia_smi.main(hw, [*query, "0,4"]) == 0
    assert capsys.readouterr().out == "0\n4\n"  # every bus id ends in 0: ".0", the function
    assert nvidia_smi.main(hw, [*query, f"{hw.gpus[5].uuid},{hw.gpus[6].bus_id}"]) == 0
    assert capsys.readouterr().out == "5\n6\n"
