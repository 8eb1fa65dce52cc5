"""The simulated host's GPU clients (sim/hosts/gpu_clients.py): a process registered for its visible GPUs holds
them while it lives; nothing is registered off a simulated host or without CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import os

import pytest

from sim.hosts import gpu_clients

pytestmark = pytest.mark.unit


def test_a_live_client_holds_its_visible_gpus_and_one_that_exited_holds_nothing(tmp_path):
    (tmp_path / "host.json").write_text("{}")
    env = {gpu_clients.RUN_DIR_ENV: str(tmp_path), "CUDA_VISIBLE_DEVICES": "4,5"}
    assert gpu_clients.register_self(env, pid=os.getpid()) == tmp_path / "gpu-clients" / str(os.getpid())
    dead = max(int(p) for p in os.listdir("/proc") if p.isdigit()) + 100_000  # no such process
    gpu_clients.register_self({**env, "CUDA_VISIBLE_DEVICES": "6"}, pid=dead)
    assert gpu_clients.holders(tmp_path) == {4: [os.getpid()], 5: [os.getpid()]}


def test_nothing_is_registered_off_a_simulated_host_or_without_visible_gpus(tmp_path):
    assert gpu_clients.register_self({gpu_clients.RUN_DIR_ENV: str(tmp_path), "CUDA_VISIBLE_DEVICES": "0"}) is None
    (tmp_path / "host.json").write_text("{}")
    assert gpu_clients.register_self({gpu_clients.RUN_DIR_ENV: str(tmp_path)}) is None
    assert gpu_clients.holders(tmp_path) == {}
