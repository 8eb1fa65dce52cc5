"""GPU collector: per-GPU memory, utilization and volatile uncorrectable ECC through NVML (nvidia-ml-py).

Only cheap NVML calls run at cycle rate (nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates,
nvmlDeviceGetTotalEccErrors): no per-process queries (nvmlDeviceGetComputeRunningProcesses takes
milliseconds and holds the driver lock). vLLM preallocates GPU memory, so free memory is a health signal
(another process on the IU's GPUs), not a load signal; the score never reads it.

NVML is the only source, on GPU nodes and on the virtual cluster's machines alike: those install a stand-in
``nvidia-ml-py`` from the virtual cluster's package index (sim/nvml_standin), which this module cannot tell
from the real one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol


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
    """The backend cannot start (no NVIDIA driver / libnvidia-ml)."""


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


def open_backend(kind: str) -> GpuBackend:
    """The config's ``gpu_backend``: ``nvml``, the only one (a host without NVIDIA GPUs gets a stand-in
    nvidia-ml-py, never another backend)."""
    if kind != "nvml":
        raise ValueError(f"unknown gpu_backend {kind!r}")
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
