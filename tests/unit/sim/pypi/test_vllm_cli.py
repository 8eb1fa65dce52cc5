"""The stand-in ``vllm serve``'s model directory checks: no config.json, or no weight file vLLM's loader would
find (``*.safetensors``, ``*.bin``, ``*.pt``), is vLLM's own error line."""

from __future__ import annotations

import pytest

from sim.hosts.machines import EMPTY_SAFETENSORS
from sim.pypi.vllm_cli import weights_problem

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("name", ["model-00001-of-00002.safetensors", "pytorch_model.bin", "consolidated.pt"])
def test_a_directory_with_weights_passes(tmp_path, name):
    (tmp_path / name).write_bytes(EMPTY_SAFETENSORS)
    assert weights_problem(tmp_path, "/m") is None


def test_a_directory_without_weights_is_vllms_runtime_error(tmp_path):
    (tmp_path / "config.json").write_text("{}\n")
    (tmp_path / "model.safetensors.index.json").write_text("{}\n")  # an index names shards, it holds none
    (tmp_path / "aside.safetensors").mkdir()  # a directory is not a weight file
    assert weights_problem(tmp_path, "/mnt/nvme/models/x") == \
        "RuntimeError: Cannot find any model weights with `/mnt/nvme/models/x`"


def test_the_machines_stand_in_weight_file_is_a_valid_empty_safetensors():
    size = int.from_bytes(EMPTY_SAFETENSORS[:8], "little")
    assert EMPTY_SAFETENSORS[8:8 + size] == b"{}" and len(EMPTY_SAFETENSORS) == 8 + size
