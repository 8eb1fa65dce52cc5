"""The machines' device tool reads and writes where the NVML stand-in reads (its variable and default path)."""

from __future__ import annotations

import pytest

from sim.hosts.stubs import drill_device
from sim.nvml_standin import pynvml

pytestmark = pytest.mark.unit


def test_the_tool_names_the_nvml_stand_ins_file_as_the_stand_in_does():
    assert (drill_device.NVML_FILE_ENV, drill_device.NVML_DEFAULT) == (pynvml.FILE_ENV, pynvml.DEFAULT_FILE)


def test_an_unknown_operation_or_a_missing_file_is_a_device_error(tmp_path):
    with pytest.raises(drill_device.DeviceError, match=r"host.json: No such file or directory"):
        drill_device.run("gpu-state", [0], tmp_path, tmp_path / "nvml.json")
    (tmp_path / "host.json").write_text('{"hardware": {"gpus": [], "hcas": []}}')
    with pytest.raises(drill_device.DeviceError, match=r"unknown operation 'hca-state'"):  # ports: ibportstate's
        drill_device.run("hca-state", [], tmp_path, tmp_path / "nvml.json")
