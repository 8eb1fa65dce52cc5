"""The file the stand-in nvidia-ml-py answers NVML calls from (simulated hosts, tests, benchmarks); the
reader and the shape it accepts: sim/nvml_standin/pynvml.py. What this writes::

    {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_total_mib": 81559,
               "memory_used_mib": 74120, "utilization_gpu_pct": 93, "utilization_memory_pct": 61,
               "ecc_volatile_uncorrectable": 0, "lost": false}]}

A GPU's ``xid`` (optional: the XIDs its driver logged, oldest first) is what NVML's XID events deliver; its
``bus_id`` (optional) what ``nvmlDeviceGetPciInfo`` answers.

81559 MiB is what NVML reports as total memory on an H100 SXM5 80GB (nvidia-smi "FB Memory Usage").
vLLM preallocates gpu_memory_utilization (0.9) of it, so "used" sits near 0.9 x total whatever the load.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

H100_TOTAL_MIB = 81559


def fake_gpus(count: int = 8, used_fraction: float = 0.9, utilization: int = 0,
              bus_ids: list[str] | None = None) -> list[dict]:
    """``bus_ids``: each GPU's NVML bus id (``00000000:18:00.0``); None: the stand-in's default per index."""
    gpus = [
        {
            "index": i,
            "name": "NVIDIA H100 80GB HBM3",
            "memory_total_mib": H100_TOTAL_MIB,
            "memory_used_mib": int(H100_TOTAL_MIB * used_fraction),
            "utilization_gpu_pct": utilization,
            "utilization_memory_pct": utilization // 2,
            "ecc_volatile_uncorrectable": 0,
            "lost": False,
        }
        for i in range(count)
    ]
    for gpu, bus_id in zip(gpus, bus_ids or (), strict=False):
        gpu["bus_id"] = bus_id
    return gpus


def write_fake_gpu_file(path: str | Path, gpus: list[dict]) -> None:
    """Write atomically (rename) so the agent never reads half a file."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"gpus": gpus}, indent=1))
    os.replace(tmp, path)
