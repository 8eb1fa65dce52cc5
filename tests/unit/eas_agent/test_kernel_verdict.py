"""What the kernel log changes in the verdict: kernel-log XIDs through the XID verdict with their own times, a
fatal SXID taking every IU of the node out, non-fatal ones only counted; and the agent's cycle wiring it (a
fake /dev/kmsg: tests/helpers/kmsg.py), including a log it cannot read."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from eas_agent.agent import Agent, IUPipeline
from eas_agent.collectors.gpu import GpuReading
from eas_agent.collectors.kernel_log import KernelLog, KernelLogReading, KernelXid, SxidEvent
from eas_agent.collectors.vllm import VllmCollector
from eas_agent.config import parse_config
from eas_agent.kernel_log import FATAL, NON_FATAL
from eas_agent.kernel_verdict import kernel_components, sxid_verdict, with_kernel_xids
from eas_agent.score import CRITICAL, PASSING, gpu_components
from eas_agent.xid_verdict import XID_HOLD_S, xid_verdict
from sim.memstore import MemoryStore
from tests.helpers.kmsg import FakeKmsg

pytestmark = pytest.mark.unit

NOW = 1_764_406_000.0
PCI0, PCI1 = (0, 0x18, 0), (0, 0x2A, 0)


def gpu(index, pci, xid=None, at=None, events=0):
    return GpuReading(index=index, memory_used_mib=73400, memory_total_mib=81559, utilization_pct=90,
                      ecc_volatile_uncorrectable=0, xid_events=events, xid_last=xid, xid_order=1 if xid else 0,
                      xid_last_at=at, pci=pci)


def logged(xids=None, fatal=None, sxids=None, failure=None):
    return KernelLogReading(MappingProxyType(xids or {}), fatal, MappingProxyType(sxids or {}), 0, failure)


def test_an_xid_logged_while_the_agent_was_down_marks_the_unit_critical_from_its_own_time():
    gpus = with_kernel_xids((gpu(0, PCI0), gpu(1, PCI1)), logged({PCI1: KernelXid(79, NOW - 300.0, "fell off")}))
    assert (gpus[1].xid_last, gpus[1].xid_last_at, gpus[1].xid_events) == (79, NOW - 300.0, 0)  # NVML's count
    assert xid_verdict(gpus, NOW).startswith("GPU 1: XID 79 ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS 300 s ago")
    assert gpu_components(gpus)["xid_last_at"] == NOW - 300.0  # remediate ages it by the truth


def test_an_old_logged_xid_ages_out_but_keeps_its_time():
    gpus = with_kernel_xids((gpu(0, PCI0),), logged({PCI0: KernelXid(79, NOW - XID_HOLD_S - 1, "")}))
    assert xid_verdict(gpus, NOW) is None
    shown = gpu_components(gpus)
    assert (shown["xid_last"], shown["xid_last_at"]) == (79, NOW - XID_HOLD_S - 1)


def test_the_newer_of_nvmls_and_the_logs_xid_wins():
    nvml_newer = gpu(0, PCI0, xid=95, at=NOW - 5, events=1)
    assert with_kernel_xids((nvml_newer,), logged({PCI0: KernelXid(79, NOW - 50, "")}))[0] == nvml_newer
    nvml_older = gpu(0, PCI0, xid=43, at=NOW - 50, events=1)
    merged = with_kernel_xids((nvml_older,), logged({PCI0: KernelXid(48, NOW - 5, "")}))[0]
    assert (merged.xid_last, merged.xid_last_at, merged.xid_events) == (48, NOW - 5, 1)


def test_a_gpu_without_a_bus_id_or_another_gpus_xid_is_left_alone():
    gpus = (gpu(0, None), gpu(1, PCI1))
    assert with_kernel_xids(gpus, logged({PCI0: KernelXid(79, NOW, "")})) == gpus
    assert with_kernel_xids(gpus, None) is gpus


def test_the_latest_xid_across_gpus_is_the_latest_in_time():
    gpus = (gpu(0, PCI0, xid=13, at=NOW - 1, events=1), gpu(1, PCI1, xid=79, at=NOW - 100, events=1))
    assert gpu_components(gpus)["xid_last"] == 13


FATAL_EVENT = SxidEvent("nvswitch1", "0000:06:00.0", 20034, FATAL, "Link 48 LTSSM Fault Up", NOW - 12.4)


def test_a_fatal_sxid_is_the_reason_naming_the_switch_and_the_error():
    assert sxid_verdict(logged(fatal=FATAL_EVENT), NOW, XID_HOLD_S) == (
        "NVSwitch nvswitch1 (PCI:0000:06:00.0): fatal SXID 20034 12 s ago (Link 48 LTSSM Fault Up); the node's "
        "GPUs share its fabric: reset the GPUs and NVSwitches or restart Fabric Manager")


def test_a_fatal_sxid_older_than_the_hold_or_none_gives_no_verdict():
    assert sxid_verdict(logged(fatal=FATAL_EVENT), NOW + XID_HOLD_S, XID_HOLD_S) is None
    assert sxid_verdict(logged(sxids={NON_FATAL: 40}), NOW, XID_HOLD_S) is None
    assert sxid_verdict(None, NOW, XID_HOLD_S) is None
    assert sxid_verdict(logged(fatal=FATAL_EVENT), NOW - 3600, XID_HOLD_S) is not None  # clock stepped back


def test_sxid_counts_are_shown_and_a_log_never_read_shows_none():
    assert kernel_components(logged(sxids={NON_FATAL: 3, FATAL: 1})) == {
        "sxid_fatal": 1, "sxid_non_fatal": 3, "sxid_correctable": 0, "kernel_log_lost": 0}
    assert kernel_components(logged(failure="/dev/kmsg: permission denied")) == {}
    assert kernel_components(None) == {}


# -- the agent's cycle --------------------------------------------------------------------------------------

GOOD = """# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 1
vllm:num_requests_waiting 0
vllm:gpu_cache_usage_perc 0.1
vllm:prompt_tokens_total 100
vllm:generation_tokens_total 100
vllm:request_success_total 1
"""


class Gpus:
    def read(self, indices):
        return [gpu(i, (0, 0x18 + i, 0)) for i in indices]

    def close(self):
        pass


class Mono:
    def __init__(self, t):
        self.t = t

    def __call__(self):
        return self.t


def agent_with(kernel_log: KernelLog):
    cfg = parse_config({"node": "n1", "rack": "r1", "listen": "127.0.0.1:0", "ius": [
        {"id": f"n1-iu{i}", "gpus": [i], "metrics_url": f"http://127.0.0.1:1/m{i}"} for i in range(2)]})
    pipelines = [IUPipeline(cfg, i, VllmCollector(lambda: GOOD)) for i in range(2)]
    return Agent(cfg, store=MemoryStore(), gpu_backend=Gpus(), kernel_log=kernel_log, pipelines=pipelines,
                 serve_http=False)


def test_a_fatal_sxid_in_the_kernel_log_makes_every_iu_of_the_node_critical():
    kmsg = FakeKmsg()
    try:
        agent = agent_with(kmsg.kernel_log(Mono(1000.0)))
        before = agent.cycle(NOW)
        assert {r.status for r in before.values()} == {PASSING}
        kmsg.log("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV "
                 "error (First)", usec=990_000_000)
        assert {r.status for r in agent.cycle(NOW).values()} == {PASSING}  # counted only
        kmsg.log("nvidia-nvswitch3: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 45 sourcetrack TCEN0 crumbstore "
                 "ECC DBE error (First)", usec=999_000_000)
        after = agent.cycle(NOW)
        for result in after.values():
            assert result.status == CRITICAL and result.reason.startswith(
                "NVSwitch nvswitch3 (PCI:0000:86:00.0): fatal SXID 24007 1 s ago")
            assert (result.components["sxid_fatal"], result.components["sxid_non_fatal"]) == (1, 1)
            assert result.collectors["kernel_log"].ok
        later = agent.cycle(NOW + XID_HOLD_S + 2)["n1-iu0"]  # the hold ends (the still counters: a warning)
        assert later.status != CRITICAL and "SXID" not in later.reason
    finally:
        kmsg.close()


def test_an_xid_in_the_kernel_log_takes_out_only_the_iu_of_that_gpu():
    kmsg = FakeKmsg()
    try:
        agent = agent_with(kmsg.kernel_log(Mono(1000.0)))
        kmsg.log("NVRM: Xid (PCI:0000:19:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.",
                 usec=700_000_000)
        results = agent.cycle(NOW)
        assert results["n1-iu0"].status == PASSING
        assert results["n1-iu1"].status == CRITICAL and "XID 79" in results["n1-iu1"].reason
        assert results["n1-iu1"].components["xid_last_at"] == NOW - 300.0
    finally:
        kmsg.close()


def test_a_kernel_log_the_agent_cannot_read_changes_no_verdict_and_says_why():
    def denied(path):
        raise PermissionError(1, "Operation not permitted")

    agent = agent_with(KernelLog("/dev/kmsg", opener=denied))
    results = agent.cycle(NOW)
    for result in results.values():
        run = result.collectors["kernel_log"]
        assert result.status == PASSING and not run.ok and "CAP_SYSLOG" in run.error
        assert "sxid_fatal" not in result.components
    assert agent.metrics.collector_errors.labels("kernel_log", "n1-iu0")._value.get() == 1


def test_kernel_log_off_in_the_config_reads_nothing():
    cfg = parse_config({"node": "n1", "rack": "r1", "listen": "127.0.0.1:0", "kernel_log": False, "ius": [
        {"id": "n1-iu0", "gpus": [0], "metrics_url": "http://127.0.0.1:1/m0"}]})
    agent = Agent(cfg, store=MemoryStore(), gpu_backend=Gpus(), serve_http=False,
                  pipelines=[IUPipeline(cfg, 0, VllmCollector(lambda: GOOD))])
    assert agent.kernel_log is None and "kernel_log" not in agent.cycle(NOW)["n1-iu0"].collectors
