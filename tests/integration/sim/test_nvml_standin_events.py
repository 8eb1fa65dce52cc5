"""The stand-in nvidia-ml-py's XID events (sim/nvml_standin/pynvml.py, its behaviour table): nvidia-ml-py's
names, codes and fields, NVML's answers row by row, and the agent's NvmlBackend counting them per GPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pynvml as real  # nvidia-ml-py as the controller installs it (no driver here: only its Python is read)
import pytest

from eas_agent.score import gpu_components
from sim import nvml_standin
from sim.vllm.fake_gpu import fake_gpus, write_fake_gpu_file

pytestmark = pytest.mark.integration

EVENT_CALLS = ("nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlEventSetFree")


def written(tmp_path: Path, gpus: list[dict]) -> Path:
    path = tmp_path / "nvml.json"
    write_fake_gpu_file(path, gpus)
    return path


def rewrite(path: Path, gpus: list[dict]) -> None:
    write_fake_gpu_file(path, gpus)
    os.utime(path, ns=(1, time.time_ns() + 10**9))  # a changed file, however coarse the clock


def started(path: Path):
    standin = nvml_standin.load(path)
    standin.nvmlInit()
    return standin


def test_the_event_api_is_nvidia_ml_pys():
    import inspect

    standin = nvml_standin.load("/nonexistent")
    for name in EVENT_CALLS:
        assert inspect.signature(getattr(standin, name)) == inspect.signature(getattr(real, name)), name
    for name in ("nvmlEventTypeNone", "nvmlEventTypeXidCriticalError", "nvmlEventTypeAll", "NVML_ERROR_TIMEOUT"):
        assert getattr(standin, name) == getattr(real, name), name
    assert str(standin.NVMLError_Timeout()) == str(real.NVMLError_Timeout()) == "Timeout"
    # the same fields; only device's type differs (a pointer to the driver's device in nvidia-ml-py)
    ours, theirs = standin.c_nvmlEventData_t._fields_, real.c_nvmlEventData_t._fields_
    assert [n for n, _ in ours] == [n for n, _ in theirs] and ours[1:] == theirs[1:]


def test_xids_from_before_the_registration_are_not_delivered_later_ones_each_once(tmp_path):
    gpus = fake_gpus(2)
    gpus[0]["xid"] = [31]
    path = written(tmp_path, gpus)
    nvml = started(path)
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 0)
    gpus[0]["xid"] = [31, 79, 48]
    gpus[1]["xid"] = [13]  # not registered in this set
    rewrite(path, gpus)
    events = [nvml.nvmlEventSetWait(event_set, 0) for _ in range(2)]
    assert [(e.device, e.eventType, e.eventData) for e in events] == [(handle, 8, 79), (handle, 8, 48)]
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 0)


def test_a_wait_with_a_timeout_waits_that_long_for_nothing(tmp_path):
    nvml = started(written(tmp_path, fake_gpus(1)))
    event_set = nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventTypeXidCriticalError, event_set)
    began = time.monotonic()
    with pytest.raises(nvml.NVMLError_Timeout):
        nvml.nvmlEventSetWait(event_set, 120)
    assert 0.12 <= time.monotonic() - began < 2


@pytest.mark.parametrize(("event_types", "error"), [
    (0x10000, "NVMLError_InvalidArgument"),  # outside nvmlEventTypeAll
    (real.nvmlEventTypeDoubleBitEccError, "NVMLError_NotSupported"),
    (real.nvmlEventTypeXidCriticalError | real.nvmlEventTypePState, "NVMLError_NotSupported"),
])
def test_event_types_it_cannot_record_are_refused_and_the_set_stays_usable(tmp_path, event_types, error):
    path = written(tmp_path, fake_gpus(1))
    nvml = started(path)
    handle, event_set = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventSetCreate()
    with pytest.raises(getattr(nvml, error)):
        nvml.nvmlDeviceRegisterEvents(handle, event_types, event_set)
    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    rewrite(path, [{**fake_gpus(1)[0], "xid": [94]}])
    assert nvml.nvmlEventSetWait(event_set, 0).eventData == 94


def test_a_lost_gpu_a_freed_set_and_calls_before_init_fail_as_nvml_does(tmp_path):
    path = written(tmp_path, fake_gpus(1))
    nvml = nvml_standin.load(path)
    with pytest.raises(nvml.NVMLError_Uninitialized):
        nvml.nvmlEventSetCreate()
    nvml.nvmlInit()
    handle, event_set = nvml.nvmlDeviceGetHandleByIndex(0), nvml.nvmlEventSetCreate()
    nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
    rewrite(path, [{**fake_gpus(1)[0], "lost": True, "xid": [79]}])
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlEventSetWait(event_set, 0)
    with pytest.raises(nvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, nvml.nvmlEventSetCreate())
    nvml.nvmlEventSetFree(event_set)
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlEventSetWait(event_set, 0)


@pytest.mark.parametrize("xid", ['"79"', "[-1]", '["79"]', "[1.5]"])
def test_a_bad_xid_list_is_a_driver_not_loaded_naming_the_gpu(tmp_path, xid):
    path = tmp_path / "nvml.json"
    path.write_text('{"gpus": [{"index": 0, "memory_total_mib": 1, "memory_used_mib": 1, "utilization_gpu_pct": 1, '
                    f'"utilization_memory_pct": 1, "xid": {xid}}}]}}')
    nvml = nvml_standin.load(path)
    with pytest.raises(nvml.NVMLError_DriverNotLoaded, match="GPU 0: xid"):
        nvml.nvmlInit()


def test_the_agents_backend_counts_each_iu_gpus_xids_into_its_components(tmp_path):
    gpus = fake_gpus(4)
    gpus[2]["xid"] = [13]  # before the agent: not counted
    path = written(tmp_path, gpus)
    backend = nvml_standin.nvml_backend(path)
    iu_a, iu_b = (0, 1), (2, 3)
    assert gpu_components(tuple(backend.read(iu_a)))["xid_events"] == 0
    assert gpu_components(tuple(backend.read(iu_b)))["xid_events"] == 0
    gpus[1]["xid"] = [79]
    gpus[3]["xid"] = [48, 63]
    rewrite(path, gpus)
    a, b = gpu_components(tuple(backend.read(iu_a))), gpu_components(tuple(backend.read(iu_b)))
    assert (a["xid_events"], a["xid_last"], b["xid_events"], b["xid_last"]) == (1, 79, 2, 63)
    gpus[1]["lost"] = True  # off the bus: the handle and its set dropped, the count kept (a counter never falls)
    rewrite(path, gpus)
    lost = backend.read(iu_a)
    assert lost[1].lost and gpu_components(tuple(lost))["xid_events"] == 1
    gpus[1]["lost"] = False
    gpus[1]["xid"] = [79, 79]  # after the GPU came back: registered again, from then on
    rewrite(path, gpus)
    backend.read(iu_a)
    gpus[1]["xid"] = [79, 79, 45]
    rewrite(path, gpus)
    again = backend.read(iu_a)[1]
    assert (again.xid_events, again.xid_last) == (2, 45)
    backend.close()
