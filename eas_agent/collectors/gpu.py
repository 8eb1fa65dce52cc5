"""GPU collector: per-GPU memory, utilization, volatile uncorrectable ECC and XID events through NVML
(nvidia-ml-py).

Only cheap NVML calls run at cycle rate (nvmlDeviceGetMemoryInfo, nvmlDeviceGetUtilizationRates,
nvmlDeviceGetTotalEccErrors): no per-process queries (nvmlDeviceGetComputeRunningProcesses takes
milliseconds and holds the driver lock). vLLM preallocates GPU memory, so free memory is a health signal
(another process on the IU's GPUs), not a load signal; the score never reads it.

NVML is the only source, on GPU nodes and on the virtual cluster's machines alike: those install a stand-in
``nvidia-ml-py`` from the virtual cluster's package index (sim/nvml_standin), which this module cannot tell
from the real one.

XID events: the driver's critical errors (the ``NVRM: Xid`` lines of the kernel log) as NVML's event API
delivers them. Each GPU gets an event set registered for ``nvmlEventTypeXidCriticalError`` when its handle is
taken (NVML records from registration on: earlier XIDs are not counted), and each read drains it without
waiting (``nvmlEventSetWait(set, 0)``, at most :data:`MAX_EVENTS_PER_READ`: a storm of XIDs cannot stretch a
cycle). NVML's event record (``nvmlEventData_t``: device, eventType, eventData, gpuInstanceId,
computeInstanceId; NVML API reference, "Event Handling Methods") carries no time, so an XID's time
(``xid_last_at``) is the agent's wall clock at the read that drained it: at most one read interval after the
driver raised it, on the clock the body's ``ts`` is on. The count is the agent's since it started, a counter (a restarted agent counts from 0 again);
a GPU whose event registration NVML refuses (``Not Supported``: no event support on the platform) has no
count (None), never 0.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from eas_agent.kernel_log import pci_of_nvml

MAX_EVENTS_PER_READ = 64
NO_XIDS = (None, None, 0, None)  # a GPU without an XID event source


@dataclass(frozen=True)
class GpuReading:
    index: int
    memory_used_mib: float | None = None
    memory_total_mib: float | None = None
    utilization_pct: float | None = None
    ecc_volatile_uncorrectable: int | None = None  # None: ECC disabled / not supported
    lost: bool = False  # fell off the bus / NVML cannot reach it
    error: str | None = None
    xid_events: int | None = None  # critical XID events since the agent started; None: no event source
    xid_last: int | None = None  # the latest of them, its XID number
    xid_order: int = 0  # when xid_last came, as the node's backend orders its XIDs (0: none yet)
    # when xid_last happened: the wall clock (unix s) of the read that drained it from NVML, or, merged by
    # eas_agent/kernel_verdict.py, the time of its kernel log record
    xid_last_at: float | None = None
    pci: tuple[int, int, int] | None = None  # (domain, bus, device), as the kernel log's XID lines name the GPU


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

    def __init__(self, nvml=None, clock: Callable[[], float] = time.time):
        if nvml is None:
            import pynvml as nvml

        self.nvml, self.clock = nvml, clock
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as exc:
            raise GpuBackendError(f"NVML: cannot initialise ({exc}); is the NVIDIA driver loaded?") from exc
        self.handles: dict[int, object] = {}
        self.pcis: dict[int, tuple[int, int, int] | None] = {}  # GPU -> its bus id, kept when the GPU is lost
        self.event_sets: dict[int, object | None] = {}  # GPU -> its XID event set; None: NVML refused one
        # GPU -> (count, last XID, its order, when it was drained)
        self.xids: dict[int, tuple[int, int | None, int, float | None]] = {}
        self.order = itertools.count(1)

    def _handle(self, index: int):
        if index not in self.handles:
            self.handles[index] = self.nvml.nvmlDeviceGetHandleByIndex(index)
            self._register(index, self.handles[index])
            if self.pcis.get(index) is None:
                self.pcis[index] = self._pci(self.handles[index])
        return self.handles[index]

    def _pci(self, handle) -> tuple[int, int, int] | None:
        try:
            return pci_of_nvml(self.nvml.nvmlDeviceGetPciInfo(handle).busId)
        except self.nvml.NVMLError:  # its XIDs then come from NVML only
            return None

    def _register(self, index: int, handle) -> None:
        nvml, event_set = self.nvml, None
        try:
            event_set = nvml.nvmlEventSetCreate()
            nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
        except nvml.NVMLError:  # Not Supported (no events on this platform), or the GPU went: no XID source
            self._free(event_set)
            event_set = None
        self.event_sets[index] = event_set

    def _free(self, event_set) -> None:
        if event_set is not None:
            try:
                self.nvml.nvmlEventSetFree(event_set)
            except self.nvml.NVMLError:
                pass

    def _drop(self, index: int) -> None:
        """Forget a GPU's handle and event set (taken again, and registered again, at the next read)."""
        self.handles.pop(index, None)
        self._free(self.event_sets.pop(index, None))

    def _drain(self, index: int) -> tuple[int | None, int | None, int, float | None]:
        """(XID events so far, the last one's XID, its order, when it was drained) of a GPU; (None, None, 0,
        None) without an event set."""
        nvml, event_set = self.nvml, self.event_sets.get(index)
        count, last, order, at = self.xids.get(index, (0, None, 0, None))
        if event_set is None:
            return (count, last, order, at) if index in self.xids else NO_XIDS
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait(event_set, 0)
            except nvml.NVMLError_Timeout:  # nothing recorded since the last read
                break
            except nvml.NVMLError:  # lost or unreadable: the next read's memory call reports it
                break
            if event.eventType == nvml.nvmlEventTypeXidCriticalError:
                count, last, order, at = count + 1, int(event.eventData), next(self.order), self.clock()
        self.xids[index] = (count, last, order, at)
        return count, last, order, at

    def read(self, indices: tuple[int, ...]) -> list[GpuReading]:
        nvml = self.nvml
        readings = []
        for index in indices:
            try:
                handle = self._handle(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                utilization = nvml.nvmlDeviceGetUtilizationRates(handle)
            except nvml.NVMLError as exc:
                self._drop(index)
                lost = isinstance(exc, getattr(nvml, "NVMLError_GpuIsLost", ())) or isinstance(
                    exc, getattr(nvml, "NVMLError_Unknown", ())
                )
                xid_events, xid_last, xid_order, xid_at = self.xids.get(index, NO_XIDS)  # a counter never falls
                readings.append(GpuReading(index=index, lost=lost, error=f"NVML: {exc}", xid_events=xid_events,
                                           xid_last=xid_last, xid_order=xid_order, xid_last_at=xid_at,
                                           pci=self.pcis.get(index)))
                continue
            try:
                ecc = int(
                    nvml.nvmlDeviceGetTotalEccErrors(
                        handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
                    )
                )
            except nvml.NVMLError:  # ECC disabled or not supported on this board
                ecc = None
            xid_events, xid_last, xid_order, xid_at = self._drain(index)
            readings.append(
                GpuReading(
                    index=index,
                    memory_used_mib=memory.used / 2**20,
                    memory_total_mib=memory.total / 2**20,
                    utilization_pct=float(utilization.gpu),
                    ecc_volatile_uncorrectable=ecc,
                    xid_events=xid_events,
                    xid_last=xid_last,
                    xid_order=xid_order,
                    xid_last_at=xid_at,
                    pci=self.pcis.get(index),
                )
            )
        return readings

    def close(self) -> None:
        for index in list(self.event_sets):
            self._drop(index)
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
