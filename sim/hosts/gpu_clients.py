"""Which processes hold a simulated host's GPUs, as the driver knows its clients: a CUDA process opens the device
of every GPU in its ``CUDA_VISIBLE_DEVICES`` and holds it until it exits. The simulated vLLM registers itself
here at start (one file per process under ``<run dir>/gpu-clients/``: its GPU indices); a client counts while
its process lives, so a killed or stopped engine lets go of its GPUs as a real one does. Read by the stand-in
``nvidia-smi --gpu-reset`` (sim/hosts/stubs/gpu_reset.py), which refuses a GPU that is held.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from sim.hosts import machine_paths

CLIENTS_DIR = "gpu-clients"
RUN_DIR_ENV = "CLUSTERCTL_SIM_RUN_DIR"


def run_dir(environ: Mapping[str, str] = os.environ) -> Path:
    return Path(environ.get(RUN_DIR_ENV) or machine_paths.SIM_RUN_DIR)


def register_self(environ: Mapping[str, str] = os.environ, pid: int | None = None) -> Path | None:
    """Record this process as a client of its visible GPUs; nothing off a simulated host (no host.json) or
    without ``CUDA_VISIBLE_DEVICES``. The file's path, else None."""
    directory, visible = run_dir(environ), environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    if not visible or not (directory / "host.json").is_file():
        return None
    gpus = [token.strip() for token in visible.split(",") if token.strip().isdigit()]
    path = directory / CLIENTS_DIR / str(pid or os.getpid())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(",".join(gpus) + "\n")
    except OSError:  # a run dir this process may not write: the engine serves all the same
        return None
    return path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def holders(directory: Path) -> dict[int, list[int]]:
    """GPU index -> the PIDs of the live processes holding it."""
    held: dict[int, list[int]] = {}
    for entry in sorted((directory / CLIENTS_DIR).glob("*")) if (directory / CLIENTS_DIR).is_dir() else []:
        if not entry.name.isdigit() or not _alive(int(entry.name)):
            continue
        for token in entry.read_text().strip().split(","):
            if token.isdigit():
                held.setdefault(int(token), []).append(int(entry.name))
    return held
