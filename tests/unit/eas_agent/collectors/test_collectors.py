"""Collectors: windowed rates, RDMA sysfs counters, NVML (mocked here; through the stand-in nvidia-ml-py in
tests/integration/sim/test_nvml_standin.py), vLLM over HTTP from a sim."""

from __future__ import annotations

import json
import types
from collections import namedtuple

import pytest

from eas_agent.collectors import gpu as gpu_module
from eas_agent.collectors.gpu import NvmlBackend
from eas_agent.collectors.network import NetworkCollector, NodeNicCounters
from eas_agent.collectors.rates import WindowRate
from eas_agent.collectors.vllm import VllmCollector
from eas_wire.scorebody import IUScore, ScoreBody
from sim.vllm.server import SimulatedIU
from tests.helpers import write_tree

pytestmark = pytest.mark.unit

NicCounters = namedtuple("NicCounters", "bytes_sent bytes_recv")


def test_window_rate_and_counter_reset():
    rate = WindowRate(window_s=1.0)
    assert rate.update(0.0, 100) is None
    assert rate.update(0.5, 200) == 200.0
    assert rate.update(1.0, 300) == 200.0
    assert rate.update(2.0, 300) == 0.0 and rate.last_change == 1.0  # window moved: only recent samples
    assert rate.update(2.2, 5) is None  # reset (vLLM restarted): unknown until two new samples


def test_network_rdma_counters_are_4_byte_units(tmp_path):
    def counters(rcv, xmit):
        return {
            f"class/infiniband/mlx5_0/ports/1/counters/{name}": f"{value}\n"
            for name, value in (("port_rcv_data", rcv), ("port_xmit_data", xmit))
        }

    write_tree(tmp_path, counters(1000, 2000))
    box = {"ibp24s0": NicCounters(0, 0)}
    nics = NodeNicCounters(lambda: box)
    net = NetworkCollector(("ibp24s0",), ("mlx5_0",), nics, 1, tmp_path, window_s=5)
    nics.refresh()
    first = net.collect(0.0)
    assert first.mb_per_s is None and first.error is None  # one sample: no rate yet
    write_tree(tmp_path, counters(1000 + 250_000, 2000 + 500_000))
    box = {"ibp24s0": NicCounters(100_000, 100_000)}
    nics.refresh()
    reading = net.collect(1.0)
    assert reading.rdma_bytes_per_s == 3_000_000  # 750k units x 4 bytes per second
    assert reading.netdev_bytes_per_s == 200_000 and reading.mb_per_s == 3.0  # max of the two views
    box = {}
    nics.refresh()
    missing = net.collect(2.0)
    assert missing.mb_per_s is None and missing.missing == ("ibp24s0",) and missing.error == "cannot read ibp24s0"


class NVMLError(Exception):
    pass


class NVMLError_Timeout(NVMLError):  # noqa: N801 (nvidia-ml-py's name)
    pass


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    pass


def event_calls(calls: list, pending: dict[str, list[int]], supported: bool = True) -> dict:
    """NVML's XID event calls over ``pending`` (handle -> the XIDs its set will deliver)."""

    def register(handle, types_, event_set):
        calls.append("register")
        if not supported:
            raise NVMLError_NotSupported()
        event_set.append(handle)

    def wait(event_set, timeoutms):
        calls.append("wait")
        assert timeoutms == 0  # never blocks the cycle
        if not pending.get(event_set[0]):
            raise NVMLError_Timeout()
        return types.SimpleNamespace(eventType=8, eventData=pending[event_set[0]].pop(0))

    def pci_info(handle):  # nvidia-ml-py's busId: bytes, NVML's 8-digit domain
        calls.append("pci")
        return types.SimpleNamespace(busId=f"00000000:{0x18 + int(handle[1:]):02x}:00.0".encode())

    return dict(NVMLError_Timeout=NVMLError_Timeout, nvmlEventTypeXidCriticalError=8, nvmlDeviceGetPciInfo=pci_info,
                nvmlEventSetCreate=lambda: calls.append("create") or [], nvmlDeviceRegisterEvents=register,
                nvmlEventSetWait=wait, nvmlEventSetFree=lambda event_set: calls.append("free"))


def test_nvml_backend_uses_only_cheap_calls(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        **event_calls(calls, {}),
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetHandleByIndex=lambda i: calls.append("handle") or f"h{i}",
        nvmlDeviceGetMemoryInfo=lambda h: (
            calls.append("memory") or types.SimpleNamespace(used=70 * 2**30, total=80 * 2**30)
        ),
        nvmlDeviceGetUtilizationRates=lambda h: (
            calls.append("util") or types.SimpleNamespace(gpu=91, memory=40)
        ),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: calls.append("ecc") or 0,
    )
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake)
    backend = NvmlBackend()
    backend.read((0, 1))
    readings = backend.read((0, 1))
    assert readings[0].utilization_pct == 91 and readings[0].memory_used_mib == 70 * 1024
    assert calls.count("handle") == 2 and calls.count("register") == 2  # handles and event sets kept
    assert calls.count("pci") == 2  # the bus id once per handle, never per cycle
    assert set(calls) == {"init", "handle", "create", "register", "memory", "util", "ecc", "wait", "pci"}
    assert readings[0].xid_events == 0 and readings[0].xid_last is None
    assert [r.pci for r in readings] == [(0, 0x18, 0), (0, 0x19, 0)]


def cheap_nvml(calls: list, pending: dict[str, list[int]], supported: bool = True) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        NVMLError=NVMLError, NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, nvmlInit=lambda: None,
        nvmlShutdown=lambda: None, nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=1, total=2),
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50, memory=10),
        nvmlDeviceGetTotalEccErrors=lambda h, kind, counter: 0, **event_calls(calls, pending, supported))


def test_xid_events_are_counted_per_gpu_and_a_storm_is_drained_over_cycles():
    pending = {"h0": [79], "h1": [13] * (gpu_module.MAX_EVENTS_PER_READ + 6)}
    backend = NvmlBackend(nvml=cheap_nvml([], pending))
    first = backend.read((0, 1))
    assert [(r.xid_events, r.xid_last) for r in first] == [(1, 79), (gpu_module.MAX_EVENTS_PER_READ, 13)]
    pending["h0"].append(48)
    second = backend.read((0, 1))
    assert [(r.xid_events, r.xid_last) for r in second] == [(2, 48), (gpu_module.MAX_EVENTS_PER_READ + 6, 13)]
    assert second[1].xid_order > second[0].xid_order > first[1].xid_order  # in the order they were drained


def test_an_xids_time_is_the_wall_clock_of_the_read_that_drained_it():
    pending, clock = {"h0": [95]}, iter([1000.5, 1002.0])
    backend = NvmlBackend(nvml=cheap_nvml([], pending), clock=lambda: next(clock))
    assert [(r.xid_last, r.xid_last_at) for r in backend.read((0, 1))] == [(95, 1000.5), (None, None)]
    assert backend.read((0,))[0].xid_last_at == 1000.5  # nothing new: the time stays the XID's
    pending["h0"].append(79)
    assert (backend.read((0,))[0].xid_last, backend.read((0,))[0].xid_last_at) == (79, 1002.0)


def test_a_gpu_whose_xid_events_nvml_refuses_has_no_count_not_zero():
    calls = []
    backend = NvmlBackend(nvml=cheap_nvml(calls, {}, supported=False))
    assert [(r.xid_events, r.error) for r in backend.read((0,))] == [(None, None)]
    assert calls == ["create", "register", "free", "pci"]  # the refused set is given back


def test_nvml_backend_without_driver_is_a_clear_error(monkeypatch):
    class NVMLError(Exception):
        pass

    def fail():
        raise NVMLError("Driver Not Loaded")

    monkeypatch.setitem(
        __import__("sys").modules, "pynvml", types.SimpleNamespace(NVMLError=NVMLError, nvmlInit=fail)
    )
    with pytest.raises(gpu_module.GpuBackendError, match="Driver Not Loaded"):
        NvmlBackend()


@pytest.mark.parametrize("schema", ["v1", "v0"])
def test_vllm_collector_over_http_from_a_simulated_iu(schema):
    with SimulatedIU(schema=schema, arrival_rate=6.0, warmup_s=30.0) as sim:
        collector = VllmCollector.over_http(sim.metrics_url, timeout_s=1.0)
        first = collector.collect(0.0)
        assert first.metrics.schema == schema and first.metrics.num_requests_running > 0
        import time

        time.sleep(0.3)
        second = collector.collect(0.3)
        assert second.generation_tps > 0 and second.mean_prompt_tokens > 0
        sim.failing = True
        failed = collector.collect(0.6)
        assert failed.metrics is None and "HTTP 500" in failed.error


def test_vllm_collector_unreachable_is_an_error_reading():
    reading = VllmCollector.over_http("http://127.0.0.1:9/metrics", timeout_s=0.2).collect(0.0)
    assert reading.metrics is None and "127.0.0.1:9" in reading.error


def test_sim_serves_health_and_agent_http_serves_metrics_and_scores():
    import urllib.request

    from eas_agent.http import AgentHttpServer, AgentMetrics
    from eas_agent.score import ScoreResult

    with SimulatedIU() as sim:
        assert urllib.request.urlopen(f"http://{sim.address}/health", timeout=2).status == 200
    metrics = AgentMetrics()
    server = AgentHttpServer("127.0.0.1", 0, metrics)
    server.start()
    try:
        metrics.observe_scores("drain", {"n-iu0": ScoreResult(0.25, "passing", "")})
        server.set_scores(ScoreBody(node="n", ts=1.0, ius={"n-iu0": IUScore(0.25, "passing")}))
        text = urllib.request.urlopen(f"http://{server.address}/metrics", timeout=2).read().decode()
        assert 'eas_agent_score{iu="n-iu0",profile="drain"} 0.25' in text
        body = json.load(urllib.request.urlopen(f"http://{server.address}/scores", timeout=2))
        assert body["ius"]["n-iu0"]["score"] == 0.25
    finally:
        server.stop()


@pytest.mark.parametrize("schema", ["v1", "v0"])
def test_model_metrics_match_the_parsed_exposition(schema):
    from eas_agent.vllm_metrics import parse_vllm_metrics
    from sim.vllm.exposition import VllmExposition, model_metrics
    from sim.vllm.loadmodel import LoadModel

    model = LoadModel(arrival_rate=8.0, seed=3)
    exposition = VllmExposition(model, schema)
    model.advance(45.0)
    parsed = parse_vllm_metrics(exposition.render())
    assert model_metrics(model, schema) == parsed
