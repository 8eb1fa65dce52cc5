"""GPU collector: per-GPU memory, utilization and volatile uncorrectable ECC through NVML, or from a file.

Only cheap NVML calls run at cycle rate (nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates,
nvmlDeviceGetTotalEccErrors): no per-process queries (nvmlDeviceGetComputeRunningProcesses takes
milliseconds and holds the driver lock). vLLM preallocates GPU memory, so free memory is a health signal
(another process on the IU's GPUs), not a load signal; the score never reads it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import yaml


@dataclass(frozen=True)
class GpuReading:
    index: int
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None
    ecc_volatile_uncorrectable: int | None = None  # None: ECC disabled / not supported
    lost: bool = False  # fell off the bus / NVML cannot reach it
    error: str | None = None


class GpuReadings(tuple):
    """One IU's GPUs as read in one cycle (a :class:`GpuReading` each); ``error`` names the first GPU that
    could not be read."""

    __slots__ = ()

    @property
    def error(self) -> str | None:
        for gpu in self:
            if gpu.error:
                return f"GPU {gpu.index}: {gpu.error}"
        return None


class GpuBackendError(RuntimeError):
    """The backend cannot start (no NVIDIA driver / libnvidia-ml, unreadable fake file path)."""


class GpuBackend(Protocol):
    def read(self, indices: tuple[int, ...]) -> list[GpuReading]: ...

    def close(self) -> None: ...


class GpuCollector:
    """One IU's GPUs through the node's backend (one backend, opened once, for every IU)."""

    name = "gpu"

    def __init__(self, backend: GpuBackend, indices: tuple[int, ...]):
        self.backend, self.indices = backend, indices

    def collect(self, now: float) -> GpuReadings:
        return GpuReadings(self.backend.read(self.indices))

    def failed(self, now: float, error: str) -> GpuReadings:
        return GpuReadings(GpuReading(index=i, error=error) for i in self.indices)


class NvmlBackend:
    """nvidia-ml-py. Handles are looked up once; a GPU that cannot be reached is reported ``lost``.

    ``nvml``: the bindings module, by default ``import pynvml``; an agent run inside a simulator's process is
    handed its own instance of the stand-in (sim.nvml_standin.nvml_backend), so that every call below runs."""

    def __init__(self, nvml=None):
        if nvml is None:
            import pynvml as nvml

        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML: cannot initialise ({exc}); is the NVIDIA driver loaded?") from exc
        self.handles: dict[int, object] = {}

    def _handle(self, index: int):
        if index not in self.handles:
            self.handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
        return self.handles[index]

    def read(self, indices: tuple[int, ...]) -> list[GpuReading]:
        nvml = self.nvml
        readings = []
        for index in indices:
            try:
                handle = self._handle(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            except nvml.NVMLError as exc:
                self.handles.pop(index, None)
                lost = isinstance(exc, getattr(nvml, "NVMLError_GpuIsLost", ())) or isinstance(
                    exc, getattr(nvml, "NVMLError_Unknown", ())
                )
                readings.append(GpuReading(index=index, lost=lost, error=f"NVML: {exc}"))
                continue
            try:
                ecc = int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                )
            except nvml.NVMLError:  # ECC disabled or not supported on this board
                ecc = None
            readings.append(
                GpuReading(
                    index=index,
                    memory_used_mib=memory.used / 2**20,
                    memory_total_mib=memory.total / 2**20,
                    utilization_pct=float(utilization.gpu),
                    ecc_volatile_uncorrectable=ecc,
                )
            )
        return readings

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError:
            pass


class FileGpuBackend:
    """GPU readings from a file another process keeps current (``gpu_backend: fake``, ``fake_gpu_file``):
    how a host without NVIDIA GPUs runs the real agent. The virtual cluster's machines run the agent's wheel
    (no simulator inside it) this way, against the file the machine's simulated hardware writes
    (``sim.vllm.fake_gpu``); the tests and benchmarks do the same. Re-parsed only when the file's mtime
    changes. Shape (JSON or YAML)::

        {"gpus": [{"index": 0, "memory_total_mib": 81559, "memory_used_mib": 74120,
                   "utilization_gpu_pct": 93, "ecc_volatile_uncorrectable": 0, "lost": false}]}

    A GPU the file does not list is ``lost``; a file that cannot be read or parsed is every GPU's ``error``.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.mtime: float | None = None
        self.gpus: dict[int, dict] = {}
        self.error: str | None = None

    def _refresh(self) -> None:
        try:
            mtime = os.stat(self.path).st_mtime_ns
        except OSError as exc:
            self.error, self.gpus, self.mtime = f"GPU file {self.path}: {exc.strerror}", {}, None
            return
        if mtime == self.mtime:
            return
        try:
            text = self.path.read_text()
            data = json.loads(text) if text.lstrip().startswith("{") else yaml.safe_load(text)
            self.gpus = {int(g["index"]): g for g in data["gpus"]}
            self.error, self.mtime = None, mtime
        except (OSError, ValueError, KeyError, TypeError, yaml.YAMLError) as exc:
            self.error, self.gpus = f"GPU file {self.path}: {exc}", {}

    def read(self, indices: tuple[int, ...]) -> list[GpuReading]:
        self._refresh()
        readings = []
        for index in indices:
            gpu = self.gpus.get(index)
            if gpu is None:
                readings.append(
                    GpuReading(
                        index=index,
                        lost=self.error is None,
                        error=self.error or f"GPU {index} not in {self.path}",
                    )
                )
                continue
            lost = bool(gpu.get("lost", False))
            readings.append(
                GpuReading(
                    index=index,
                    memory_used_mib=None if lost else gpu.get("memory_used_mib"),
                    memory_total_mib=None if lost else gpu.get("memory_total_mib"),
                    utilization_pct=None if lost else gpu.get("utilization_gpu_pct"),
                    ecc_volatile_uncorrectable=gpu.get("ecc_volatile_uncorrectable"),
                    lost=lost,
                    error="GPU is lost" if lost else None,
                )
            )
        return readings

    def close(self) -> None:
        pass


def open_backend(kind: str, fake_file: str | None = None) -> GpuBackend:
    """The config's ``gpu_backend``: ``nvml`` (GPU nodes), or ``fake``: readings from ``fake_gpu_file``."""
    if kind == "fake":
        if not fake_file:
            raise ValueError("gpu_backend fake needs fake_gpu_file")
        return FileGpuBackend(fake_file)
    return NvmlBackend()


def main() -> None:
    """``python -m eas_agent.collectors.gpu``: one read of every GPU with the cycle's calls (read-only)."""
    import dataclasses
    import time

    backend = NvmlBackend()
    try:
        count = backend.nvml.nvmlDeviceGetCount()
        started = time.perf_counter()
        readings = backend.read(tuple(range(count)))
        elapsed_ms = (time.perf_counter() - started) * 1000
        print(
            json.dumps(
                {"gpus": [dataclasses.asdict(r) for r in readings], "read_ms": round(elapsed_ms, 3)}, indent=1
            )
        )
    finally:
        backend.close()


if __name__ == "__main__":
    main()
