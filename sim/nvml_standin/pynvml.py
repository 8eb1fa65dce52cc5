"""clusterctl's stand-in for nvidia-ml-py's ``pynvml``: the NVML calls the EAS agent makes
(eas_agent/collectors/gpu.py, ``NvmlBackend``), answered from the file a simulated host's hardware keeps
current instead of from libnvidia-ml and a driver, which a host without NVIDIA GPUs cannot have.

The virtual cluster's package index serves it as the ``nvidia-ml-py`` distribution (sim/pypi/build.py), so
the machines run the agent unchanged, with ``gpu_backend: nvml``; an ``eas-agent run`` subprocess beside the
tests gets it first on its PYTHONPATH (sim/nvml_standin/__init__.py). Names, signatures, return types
(ctypes structures with the same fields, in the same units), error codes and the ``NVMLError`` subclasses
are nvidia-ml-py's; tests/integration/sim/test_nvml_standin.py compares the signatures with the real module.

The file (``CLUSTERCTL_SIM_NVML_FILE``, else /run/clusterctl-sim/nvml.json, where ``virtual up`` puts it on
every machine), written by sim/vllm/fake_gpu.py and re-read when it changes::

    {"gpus": [{"index": 0, "memory_total_mib": 81559, "memory_used_mib": 74120, "utilization_gpu_pct": 93,
               "utilization_memory_pct": 61, "ecc_volatile_uncorrectable": 0, "lost": false, "xid": [79],
               "bus_id": "00000000:18:00.0"}]}

As NVML answers: a file that cannot be read or parsed is a driver that is not loaded (``nvmlInit`` fails);
``lost: true``, or a GPU the file stopped listing after its handle was taken, is ``NVMLError_GpuIsLost``;
an index the file does not list is ``NVMLError_InvalidArgument``; ``ecc_volatile_uncorrectable: null`` is
ECC disabled (``NVMLError_NotSupported``); ``nvmlDeviceGetPciInfo`` answers the GPU's ``bus_id`` (NVML's
``00000000:18:00.0``; absent: bus ``index + 1``), the id the kernel log's XID lines name. Only stdlib: it runs on
the machines' own Python.

XID events (``xid``: the XID codes the driver logged for the GPU, oldest first; absent is none). NVML's event
API as the NVML reference manual ("Event Handling Methods", nvmlDeviceRegisterEvents, nvmlEventSetWait_v2,
nvmlEventData_t) describes it, with nvidia-ml-py's wrappers (``nvmlEventSetWait`` calls the ``_v2``):

=========================================  ================================================================
call / situation                           answer (the stand-in's as NVML's)
=========================================  ================================================================
any event call before ``nvmlInit``         ``NVMLError_Uninitialized``
``nvmlDeviceRegisterEvents``               records from now: "all events that occurred before this call are
                                           not recorded" (the GPU's ``xid`` entries so far are skipped)
  a bit outside ``nvmlEventTypeAll``       ``NVMLError_InvalidArgument`` ("eventTypes is invalid")
  a type other than XID critical errors    ``NVMLError_NotSupported`` ("some of requested event types"); the
  (the only events the file carries)       set stays usable, nothing of the call registered
  a lost GPU                               ``NVMLError_GpuIsLost``
  a set already freed                      ``NVMLError_InvalidArgument`` (NVML: undefined, a freed pointer)
``nvmlEventSetFree``                       the set is unusable after (``NVMLError_InvalidArgument``)
``nvmlEventSetWait(set, timeoutms)``       the next recorded event at once, else waits up to ``timeoutms``
                                           for one (the file re-read every 10 ms), then ``NVMLError_Timeout``
  an event                                 ``eventType`` ``nvmlEventTypeXidCriticalError``, ``eventData``
                                           the XID; every XID is its own event (Linux: "every Xid error event
                                           would return the associated event data")
  a registered GPU lost                    ``NVMLError_GpuIsLost``
=========================================  ================================================================

``c_nvmlEventData_t`` has nvidia-ml-py's fields; its ``device`` holds the stand-in's handle (a Python object:
nvidia-ml-py's is a pointer to the driver's device), the one ``nvmlDeviceGetHandleByIndex`` returned.
"""

from __future__ import annotations

import json
import operator
import os
import re
import time
from ctypes import Structure, c_char, c_uint, c_ulonglong, py_object

FILE_ENV = "CLUSTERCTL_SIM_NVML_FILE"
DEFAULT_FILE = "/run/clusterctl-sim/nvml.json"
# Set by sim.nvml_standin.load for an in-process simulator's own instance; None: FILE_ENV, else DEFAULT_FILE.
data_file: str | None = None

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25
NVML_ERROR_UNKNOWN = 999

NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
nvmlMemory_v2 = 0x02000028

nvmlEventTypeNone = 0
nvmlEventTypeXidCriticalError = 0x0000000000000008
nvmlEventTypeAll = 0x000000000000FF9F  # nvidia-ml-py's: every event type NVML defines
_EVENTS_IN_FILE = nvmlEventTypeXidCriticalError
_WAIT_POLL_S = 0.01


class NVMLError(Exception):
    """As nvidia-ml-py's: ``NVMLError(code)`` is an instance of the code's subclass, ``str`` is NVML's text.
    ``detail`` (the stand-in's own) says which file answered, for whoever reads the agent's log."""

    _valClassMapping: dict = {}
    _errcode_to_string = {
        NVML_ERROR_UNINITIALIZED: "Uninitialized",
        NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
        NVML_ERROR_NOT_SUPPORTED: "Not Supported",
        NVML_ERROR_DRIVER_NOT_LOADED: "Driver Not Loaded",
        NVML_ERROR_TIMEOUT: "Timeout",
        NVML_ERROR_GPU_IS_LOST: "GPU is lost",
        NVML_ERROR_ARGUMENT_VERSION_MISMATCH: "Argument version mismatch",
        NVML_ERROR_UNKNOWN: "Unknown Error",
    }
    detail: str | None = None

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        text = self._errcode_to_string.get(self.value, f"NVML Error with code {self.value}")
        return f"{text} (clusterctl NVML stand-in: {self.detail})" if self.detail else text

    def __eq__(self, other):
        return self.value == other.value


def _error_classes() -> None:
    """NVMLError_GpuIsLost and its siblings, one per NVML_ERROR_* code, named as nvidia-ml-py names them."""
    for name, code in [(n, v) for n, v in globals().items() if n.startswith("NVML_ERROR_")]:
        words = name.removeprefix("NVML_ERROR_").split("_")
        cls = type("NVMLError_" + "".join(w.capitalize() for w in words), (NVMLError,),
                   {"__new__": lambda typ, *args, code=code: NVMLError.__new__(typ, code)})
        globals()[cls.__name__] = cls
        NVMLError._valClassMapping[code] = cls


_error_classes()


def _fail(code: int, detail: str | None = None) -> NVMLError:
    error = NVMLError(code)
    error.detail = detail
    return error


class c_nvmlMemory_t(Structure):
    _fields_ = [("total", c_ulonglong), ("free", c_ulonglong), ("used", c_ulonglong)]


class c_nvmlMemory_v2_t(Structure):
    _fields_ = [("version", c_uint), ("total", c_ulonglong), ("reserved", c_ulonglong), ("free", c_ulonglong),
                ("used", c_ulonglong)]


class c_nvmlUtilization_t(Structure):
    _fields_ = [("gpu", c_uint), ("memory", c_uint)]


class nvmlPciInfo_t(Structure):
    _fields_ = [("busIdLegacy", c_char * 16), ("domain", c_uint), ("bus", c_uint), ("device", c_uint),
                ("pciDeviceId", c_uint), ("pciSubSystemId", c_uint), ("busId", c_char * 32)]


class c_nvmlEventData_t(Structure):
    _fields_ = [("device", py_object), ("eventType", c_ulonglong), ("eventData", c_ulonglong),
                ("gpuInstanceId", c_uint), ("computeInstanceId", c_uint)]


class _Device:
    """An opaque handle, as nvidia-ml-py's c_nvmlDevice_t is to its callers."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


_refcount = 0
_cache: tuple[tuple[int, int, int], dict[int, dict]] | None = None  # ((inode, mtime_ns, size), index -> GPU)
# What a GPU that is not lost must have (the units NVML answers in are applied where it answers).
_NUMBERS = ("memory_total_mib", "memory_used_mib", "utilization_gpu_pct", "utilization_memory_pct")


def _path() -> str:
    return data_file or os.environ.get(FILE_ENV) or DEFAULT_FILE


def _checked(gpu: dict, seen: dict[int, dict]) -> dict:
    index = gpu["index"]
    if type(index) is not int or index < 0 or index in seen:
        raise ValueError(f"GPU index {index!r}: expected a unique integer >= 0")
    bus_id = gpu.get("bus_id")
    if bus_id is not None and (type(bus_id) is not str
                               or not re.fullmatch(r"[0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]", bus_id)):
        raise ValueError(f"GPU {index}: bus_id {bus_id!r}: expected NVML's form, 00000000:18:00.0")
    xid = gpu.get("xid", [])
    if type(xid) is not list or any(type(code) is not int or not 0 <= code < 2**32 for code in xid):
        raise ValueError(f"GPU {index}: xid {xid!r}: expected a list of XID numbers")
    if gpu.get("lost"):
        return gpu
    values = [(key, gpu.get(key)) for key in _NUMBERS]
    if gpu.get("ecc_volatile_uncorrectable") is not None:  # null: ECC disabled
        values.append(("ecc_volatile_uncorrectable", gpu["ecc_volatile_uncorrectable"]))
    for key, value in values:
        if type(value) not in (int, float) or not 0 <= value < 2**32:  # NaN fails too
            raise ValueError(f"GPU {index}: {key} {value!r}: expected a number from 0 to 2**32")
    return gpu


def _gpus() -> dict[int, dict]:
    """The file's GPUs by index, parsed again only when the file changed."""
    global _cache
    path = _path()
    try:
        stat = os.stat(path)
        if _cache is not None and _cache[0] == (stat.st_ino, stat.st_mtime_ns, stat.st_size):
            return _cache[1]
        with open(path, encoding="utf-8") as handle:
            gpus: dict[int, dict] = {}
            for gpu in json.load(handle)["gpus"]:
                gpus[gpu["index"]] = _checked(gpu, gpus)
    except OSError as exc:
        raise _fail(NVML_ERROR_DRIVER_NOT_LOADED, f"{path}: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise _fail(NVML_ERROR_DRIVER_NOT_LOADED, f"{path}: not a GPU file ({exc})") from None
    _cache = ((stat.st_ino, stat.st_mtime_ns, stat.st_size), gpus)
    return gpus


def _initialised() -> dict[int, dict]:
    if _refcount == 0:
        raise _fail(NVML_ERROR_UNINITIALIZED)
    return _gpus()


def _gpu(handle: _Device) -> dict:
    gpu = _initialised().get(handle.index)
    if gpu is None or gpu.get("lost"):
        raise _fail(NVML_ERROR_GPU_IS_LOST, f"GPU {handle.index} in {_path()}")
    return gpu


def nvmlInit():
    global _refcount
    _gpus()
    _refcount += 1
    return None


def nvmlShutdown():
    global _refcount
    if _refcount == 0:
        raise _fail(NVML_ERROR_UNINITIALIZED)
    _refcount -= 1
    return None


def nvmlDeviceGetCount():
    return len(_initialised())


def nvmlDeviceGetHandleByIndex(index):
    index = operator.index(index)  # ctypes' c_uint refuses what is not an integer the same way
    gpu = _initialised().get(index)
    if gpu is None:
        raise _fail(NVML_ERROR_INVALID_ARGUMENT, f"no GPU {index} in {_path()}")
    if gpu.get("lost"):
        raise _fail(NVML_ERROR_GPU_IS_LOST, f"GPU {index} in {_path()}")
    return _Device(index)


def nvmlDeviceGetMemoryInfo(handle, version=None):
    gpu = _gpu(handle)
    total, used = int(gpu["memory_total_mib"] * 2**20), int(gpu["memory_used_mib"] * 2**20)
    if not version:
        return c_nvmlMemory_t(total=total, free=max(total - used, 0), used=used)
    if version != nvmlMemory_v2:
        raise _fail(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
    return c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=max(total - used, 0), used=used)


def nvmlDeviceGetPciInfo(handle):
    """The GPU's PCI location: the file's ``bus_id`` (nvidia-smi's and NVML's form, ``00000000:18:00.0``),
    else bus ``index + 1`` of domain 0; ``pciDeviceId`` 0x233010DE (an H100 SXM5, device id << 16 | vendor)."""
    gpu = _gpu(handle)
    bus_id = gpu.get("bus_id") or f"00000000:{handle.index + 1:02X}:00.0"
    domain, bus, rest = bus_id.split(":")
    return nvmlPciInfo_t(busIdLegacy=f"{int(domain, 16):04X}:{bus}:{rest}".encode(), domain=int(domain, 16),
                           bus=int(bus, 16), device=int(rest.split(".")[0], 16), pciDeviceId=0x233010DE,
                           pciSubSystemId=0x16C110DE, busId=bus_id.encode())


def nvmlDeviceGetUtilizationRates(handle):
    gpu = _gpu(handle)
    return c_nvmlUtilization_t(gpu=int(gpu["utilization_gpu_pct"]), memory=int(gpu["utilization_memory_pct"]))


def nvmlDeviceGetTotalEccErrors(handle, errorType, counterType):
    gpu = _gpu(handle)
    if errorType not in (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED) or counterType not in (
            NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC):
        raise _fail(NVML_ERROR_INVALID_ARGUMENT)
    if (errorType, counterType) != (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC):
        raise _fail(NVML_ERROR_NOT_SUPPORTED, "the file holds volatile uncorrectable counts only")
    if gpu.get("ecc_volatile_uncorrectable") is None:
        raise _fail(NVML_ERROR_NOT_SUPPORTED, f"ECC disabled on GPU {handle.index} in {_path()}")
    return int(gpu["ecc_volatile_uncorrectable"])


class _EventSet:
    """An opaque event set, as nvidia-ml-py's c_nvmlEventSet_t is to its callers: GPU index -> how many of its
    ``xid`` entries were there when it was registered or have been delivered."""

    __slots__ = ("seen", "handles", "freed")

    def __init__(self):
        self.seen: dict[int, int] = {}
        self.handles: dict[int, _Device] = {}
        self.freed = False


def nvmlEventSetCreate():
    _initialised()
    return _EventSet()


def nvmlDeviceRegisterEvents(handle, eventTypes, eventSet):
    gpu = _gpu(handle)
    if not isinstance(eventSet, _EventSet) or eventSet.freed or eventTypes & ~nvmlEventTypeAll:
        raise _fail(NVML_ERROR_INVALID_ARGUMENT)
    if eventTypes & ~_EVENTS_IN_FILE:
        raise _fail(NVML_ERROR_NOT_SUPPORTED, "the file holds XID events only")
    if eventTypes and handle.index not in eventSet.seen:
        eventSet.seen[handle.index] = len(gpu.get("xid", []))
        eventSet.handles[handle.index] = handle
    return None


def _next_event(eventSet: _EventSet) -> c_nvmlEventData_t | None:
    gpus = _initialised()
    for index, seen in eventSet.seen.items():
        gpu = gpus.get(index)
        if gpu is None or gpu.get("lost"):
            raise _fail(NVML_ERROR_GPU_IS_LOST, f"GPU {index} in {_path()}")
        xid = gpu.get("xid", [])
        if len(xid) > seen:
            eventSet.seen[index] = seen + 1
            return c_nvmlEventData_t(device=eventSet.handles[index], eventType=nvmlEventTypeXidCriticalError,
                                     eventData=xid[seen], gpuInstanceId=0, computeInstanceId=0)
    return None


def nvmlEventSetWait(eventSet, timeoutms):
    _initialised()
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise _fail(NVML_ERROR_INVALID_ARGUMENT)
    deadline = time.monotonic() + operator.index(timeoutms) / 1000
    while True:
        event = _next_event(eventSet)
        if event is not None:
            return event
        if time.monotonic() >= deadline:
            raise _fail(NVML_ERROR_TIMEOUT)
        time.sleep(min(_WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


def nvmlEventSetFree(eventSet):
    _initialised()
    if not isinstance(eventSet, _EventSet) or eventSet.freed:
        raise _fail(NVML_ERROR_INVALID_ARGUMENT)
    eventSet.freed = True
    return None
