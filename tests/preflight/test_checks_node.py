"""Node checks: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture
text edited to produce one), and ``gather`` through a scripted transport on canned real-format outputs
(a healthy node passes; unreadable output is an ERROR; fallbacks such as dmesg without a journal)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import (
    consul,
    cstates,
    dcqcn,
    gpu_health,
    gpu_topology,
    ib_ports,
    nccl,
    numa_pinning,
    time_sync,
)
from preflight.consul_io import ServiceState
from preflight.parsers import ParseError, cmdline, cpulist, mlnx_qos
from preflight.parsers.common import Line
from preflight.parsers.kernel_log import KernelXids, XidEvent
from preflight.parsers.mlnx_qos import MlnxQos, PfcPriority
from preflight.parsers.topo import Topology
from preflight.profiles import profile_of
from preflight.result import Verdict
from tests.preflight.helpers import ScriptedTransport, context, fixture_text, node, only

TOPO = ("nvidia-smi", "topo", "-m")
# NICs of the HGX fixture: NIC0..3 are PIX to GPU0..3, NIC6..9 to GPU4..7 (NIC4/5 are storage).
FIXTURE_NICS = [
    {"device": "mlx5_0", "netdev": "ibp24s0", "rate_gbps": 400, "numa_node": 0, "gpu": 0},
    {"device": "mlx5_2", "netdev": "ibp41s0", "rate_gbps": 400, "numa_node": 0, "gpu": 2},
    {"device": "mlx5_6", "netdev": "ibp154s0", "rate_gbps": 400, "numa_node": 1, "gpu": 4},
    {"device": "mlx5_8", "netdev": "ibp187s0", "rate_gbps": 400, "numa_node": 1, "gpu": 6},
]


def hgx_topo() -> str:
    return fixture_text("topo", "h100-sxm-hgx-driver535-nic-legend.txt")


def hgx() -> Topology:
    return parsers.parse("topo", hgx_topo())


def with_link(topology: Topology, a: str, b: str, token: str) -> Topology:
    """The topology with the link a-b (both directions) printed as ``token``: the facts of a lost NVLink."""
    links = {row: dict(cols) for row, cols in topology.links.items()}
    links[a][b] = links[b][a] = token
    return replace(topology, links=links)


def with_numa(topology: Topology, gpu: str, numa: str) -> Topology:
    return replace(topology, gpus=[replace(g, numa_affinity=numa) if g.name == gpu else g for g in topology.gpus])


def judge_topology(topology: Topology, nics=FIXTURE_NICS, **hostvars):
    n = node(rdma_nics=nics, **hostvars)
    return gpu_topology.CHECK.evaluate(topology, profile_of(n), n)


def run_topology(text: str, **hostvars):
    t = ScriptedTransport().on("n1", *TOPO, reply=text)
    return gpu_topology.CHECK.run(context(t, node(rdma_nics=FIXTURE_NICS, **hostvars)))


# ------------------------------------------------------------------------------ gpu_topology


def test_topology_of_a_healthy_hgx_h100_passes():
    results = run_topology(hgx_topo())
    assert [r.verdict for r in results] == [Verdict.PASS] * 3
    assert only(results, iu="n1-iu0").evidence["found"]["numa"] == {0: 0, 1: 0, 2: 0, 3: 0}


def test_missing_nvlink_fails_only_that_iu_and_suggests_a_layout_that_fits():
    results = judge_topology(with_link(hgx(), "GPU1", "GPU2", "NODE"))
    bad = only(results, iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NVLINK_MISSING")
    assert "GPU1-GPU2 is NODE" in bad.reason
    # NUMA 0 holds GPUs 0-3 only and 1-2 lost NVLink: no 4-GPU IU fits there; NUMA 1 still does.
    assert bad.evidence["suggested_iu_layout"] == [[4, 5, 6, 7]]
    assert bad.evidence["unusable_gpus"] == [0, 1, 2, 3]
    assert only(results, iu="n1-iu1").verdict is Verdict.PASS


def test_suggested_layout_with_two_gpu_ius_routes_around_the_broken_link():
    broken = with_link(hgx(), "GPU1", "GPU2", "NODE")
    results = judge_topology(broken, iu_size=2, iu_layout=[[0, 2], [1, 3], [4, 5], [6, 7]])
    assert all(r.verdict is Verdict.PASS for r in results)  # the inventory's layout already avoids 1-2
    results = judge_topology(broken, iu_size=2, iu_layout=[[0, 3], [1, 2], [4, 5], [6, 7]])
    bad = only(results, iu="n1-iu1")
    assert bad.code == "NVLINK_MISSING"
    assert bad.evidence["suggested_iu_layout"] == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_fewer_nvlinks_than_the_profile_is_degraded():
    bad = only(judge_topology(with_link(hgx(), "GPU5", "GPU6", "NV12")), iu="n1-iu1")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NVLINK_DEGRADED")


def test_gpu_on_the_wrong_numa_node_fails_its_iu():
    bad = only(judge_topology(with_numa(hgx(), "GPU3", "1")), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "GPU_NUMA")
    assert "GPU3 is on NUMA 1" in bad.reason


def test_nic_that_is_not_close_to_its_gpu_fails():
    nics = [dict(n) for n in FIXTURE_NICS]
    nics[0]["gpu"] = 1  # mlx5_0 is PIX to GPU0, NODE to GPU1
    nics[1]["gpu"] = 3
    bad = only(judge_topology(hgx(), nics), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NIC_FAR")
    assert "mlx5_0 is GPU1:NODE" in bad.reason


def test_gpu_count_mismatch_fails_the_node():
    results = judge_topology(hgx(), gpu_count=16, iu_size=8)
    assert [(r.iu, r.verdict, r.code) for r in results] == [(None, Verdict.FAIL, "GPU_COUNT")]


@pytest.mark.parametrize(
    "reply",
    [
        (0, fixture_text("topo", "garbage-driver-not-loaded.txt")),
        (0, fixture_text("topo", "truncated-mid-table.txt")),
        (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."),
    ],
)
def test_unreadable_topology_is_an_error_with_the_evidence(reply):
    t = ScriptedTransport().on("n1", *TOPO, reply=reply)
    [result] = gpu_topology.CHECK.run(context(t, node(rdma_nics=FIXTURE_NICS)))
    assert result.verdict is Verdict.ERROR
    assert "nvidia-smi topo -m" in result.reason


# ------------------------------------------------------------------------------ gpu_health


def health_transport(q_text: str, kernel_log: str = "", fabric: str = "active\n") -> ScriptedTransport:
    return (
        ScriptedTransport()
        .on("n1", "nvidia-smi", "-q", reply=q_text)
        .on("n1", "journalctl", reply=kernel_log)
        .on("n1", "systemctl", "is-active", "nvidia-fabricmanager", reply=fabric)
    )


def clean_q() -> str:
    return fixture_text("nvsmi_q", "h100-sxm-driver535-full-q-clean.txt")


def test_healthy_gpus_pass():
    [result] = gpu_health.CHECK.run(context(health_transport(clean_q())))
    assert (result.verdict, result.code) == (Verdict.PASS, "GPU_HEALTH_OK")


def health_facts(report=None, xids=(), fabric_unit=None) -> gpu_health.GpuHealthFacts:
    """gpu_health's facts, built (NHC style): the clean H100 report unless given, XIDs as (bus, xid)."""
    events = [XidEvent(xid, f"0000:{bus}:00", None, n, f"NVRM: Xid (PCI:0000:{bus}:00): {xid}")
              for n, (bus, xid) in enumerate(xids, 1)]
    return gpu_health.GpuHealthFacts(report or parsers.parse("nvsmi-q", clean_q()),
                                     KernelXids(events, len(events)), fabric_unit)


def judge_health(facts: gpu_health.GpuHealthFacts):
    n = node()
    return gpu_health.CHECK.evaluate(facts, profile_of(n), n)


def with_gpus(report, **fields):
    """The report with every GPU's ``fields`` set (the first GPU's only with ``first_only``)."""
    first_only = fields.pop("first_only", False)
    gpus = [replace(g, **fields) if (i == 0 or not first_only) else g for i, g in enumerate(report.gpus)]
    return replace(report, gpus=gpus)


def test_uncorrectable_ecc_and_pending_remap_fail():
    text = fixture_text("nvsmi_q", "h100-sxm-driver550-dram-uncorrectable-remap-pending.txt")
    [result] = judge_health(health_facts(parsers.parse("nvsmi-q", text)))
    assert (result.verdict, result.code) == (Verdict.FAIL, "ECC_UNCORRECTABLE")
    assert any("row remap pending" in p for p in result.evidence["problems"])


def test_critical_xid_fails_and_other_xids_warn():
    bus = re.search(r"^GPU 0000\w{4}:(\w\w):", clean_q(), re.M).group(1).lower()  # first GPU's bus
    [result] = judge_health(health_facts(xids=[(bus, 79)]))
    assert (result.verdict, result.code) == (Verdict.FAIL, "XID_CRITICAL")
    assert result.reason.startswith("GPU0 (n1-iu0): critical XID 79")
    [result] = judge_health(health_facts(xids=[("c3", 13)]))
    assert (result.verdict, result.code) == (Verdict.WARN, "XID_OTHER")


def test_xids_in_the_kernel_log_are_gathered_through_journalctl():
    bus = re.search(r"^GPU 0000(\w{4}:\w\w):", clean_q(), re.M).group(1)  # first GPU's domain:bus
    critical = (
        f"Nov 29 07:12:01 n1 kernel: NVRM: Xid (PCI:{bus}:00): 79, pid=0, GPU has fallen off the bus.\n"
    )
    [result] = gpu_health.CHECK.run(context(health_transport(clean_q(), critical)))
    assert (result.verdict, result.code) == (Verdict.FAIL, "XID_CRITICAL")
    assert result.reason.startswith("GPU0 (n1-iu0): critical XID 79")


def test_kernel_log_falls_back_to_dmesg_without_a_journal():
    t = health_transport(clean_q()).on("n1", "journalctl", reply=(1, "No journal files were found."))
    t.on("n1", "dmesg", reply="[ 12.3] NVRM: Xid (PCI:0000:1b:00): 48, pid=1, DBE\n")
    [result] = gpu_health.CHECK.run(context(t))
    assert result.code == "XID_CRITICAL"
    assert t.called("n1", "dmesg")


def test_persistence_mode_off_fails():
    report = with_gpus(parsers.parse("nvsmi-q", clean_q()), persistence_mode="Disabled", first_only=True)
    [result] = judge_health(health_facts(report))
    assert (result.verdict, result.code) == (Verdict.FAIL, "PERSISTENCE_OFF")


def test_fabric_manager_down_on_an_nvswitch_board_fails():
    [result] = judge_health(health_facts(fabric_unit=gpu_health.FabricUnit("inactive", "inactive")))
    assert (result.verdict, result.code) == (Verdict.FAIL, "FABRIC_MANAGER_DOWN")
    [unknown] = judge_health(health_facts(fabric_unit=gpu_health.FabricUnit("", "Failed to connect to bus")))
    assert (unknown.verdict, unknown.code) == (Verdict.WARN, "FABRIC_UNKNOWN")


def test_gpu_fabric_state_is_read_where_the_driver_prints_it():
    fabric = (
        "    Fabric\n        State                             : In Progress\n"
        "        Status                            : N/A\n"
    )
    text = re.sub(r"(\n    Persistence Mode[^\n]*)", r"\1\n" + fabric.rstrip("\n"), clean_q())
    assert text.count("In Progress") == 8
    report = parsers.parse("nvsmi-q", text)  # the parser reads the section ...
    assert {(g.fabric_state, g.fabric_status) for g in report.gpus} == {("In Progress", "N/A")}
    [result] = judge_health(health_facts(report))  # ... and evaluate judges it, systemd not asked
    assert (result.verdict, result.code) == (Verdict.FAIL, "FABRIC_MANAGER_DOWN")
    assert "not trained" in result.reason
    trained = with_gpus(report, fabric_state="Completed", fabric_status="Success")
    assert judge_health(health_facts(trained))[0].verdict is Verdict.PASS


def test_one_gpu_block_of_eight_attached_is_an_error_not_a_pass():
    """The parser reads a whole lone block as `-q -i N`; gpu_health asked for every GPU, so the other 7
    are unknown: ERROR with an excerpt, never a PASS on one GPU's health."""
    text = fixture_text("nvsmi_q", "h100-sxm-driver550-i-3-one-gpu-remap-pending.txt")
    [result] = gpu_health.CHECK.run(context(health_transport(text)))
    assert result.verdict is Verdict.ERROR
    assert "printed 1 of 8 attached GPUs" in result.reason
    assert "GPU 00000000:5D:00.0" in result.evidence["output"]


def test_unparseable_nvidia_smi_q_is_an_error():
    t = health_transport(fixture_text("nvsmi_q", "truncated-after-3-of-8-gpus.txt"))
    [result] = gpu_health.CHECK.run(context(t))
    assert result.verdict is Verdict.ERROR
    assert "cannot parse" in result.reason


# ------------------------------------------------------------------------------ ib_ports

IB_NICS = [
    {"device": f"mlx5_{i}", "netdev": f"ibp{i}s0", "rate_gbps": 400, "numa_node": i // 2} for i in range(4)
]


def ports(text: str, nics=IB_NICS):
    t = ScriptedTransport().on("n1", "ibstat", reply=text)
    [result] = ib_ports.CHECK.run(context(t, node(rdma_nics=nics)))
    return result


def ibstat_text() -> str:
    return fixture_text("ibstat", "h100-hgx-cx7-ndr400-ib-plus-roce-storage.txt")


def test_active_ports_at_the_expected_rate_pass():
    assert (ports(ibstat_text()).verdict, ports(ibstat_text()).code) == (Verdict.PASS, "PORTS_OK")


def judge_ports(ibstat, nics=IB_NICS):
    n = node(rdma_nics=nics)
    [result] = ib_ports.CHECK.evaluate(ibstat, profile_of(n), n)
    return result


def with_port(ibstat, ca_name: str, **fields):
    """The ibstat facts with port 1 of ``ca_name`` changed."""
    cas = [replace(ca, ports=[replace(p, **fields) if p.port == 1 else p for p in ca.ports])
           if ca.name == ca_name else ca for ca in ibstat.cas]
    return replace(ibstat, cas=cas)


def test_a_down_port_fails():
    down = with_port(parsers.parse("ibstat", ibstat_text()), "mlx5_1", state="Down", physical_state="Disabled")
    result = judge_ports(down)
    assert (result.verdict, result.code) == (Verdict.FAIL, "PORT_DOWN")
    assert result.reason.startswith("mlx5_1:1 is Down/Disabled")


def test_wrong_rate_missing_port_and_link_layer_fail():
    healthy = parsers.parse("ibstat", ibstat_text())
    assert judge_ports(with_port(healthy, "mlx5_0", rate_gbps=200)).code == "PORT_RATE"
    missing = IB_NICS + [{"device": "mlx5_42", "netdev": "ibp99s0", "rate_gbps": 400, "numa_node": 1}]
    assert judge_ports(healthy, missing).code == "PORT_MISSING"
    roce = [dict(n, link_layer="ethernet") for n in IB_NICS]
    assert judge_ports(healthy, roce).code == "LINK_LAYER"


def test_garbage_ibstat_is_an_error():
    result = ports(fixture_text("ibstat", "garbage-command-not-found.txt"))
    assert result.verdict is Verdict.ERROR


# ------------------------------------------------------------------------------ nccl


def nccl_transport(iu_text: str, node_text: str, rc: int = 0) -> ScriptedTransport:
    t = ScriptedTransport()
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=0,1,2,3", reply=(rc, iu_text))
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=4,5,6,7", reply=(rc, iu_text))
    t.on("n1", "env", "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7", reply=(rc, node_text))
    return t


IU_NCCL = fixture_text("nccl", "h100-sxm-iu-4gpu-all_reduce-srun-label.txt")
NODE_NCCL = fixture_text("nccl", "h100-sxm-8gpu-all_reduce-g8-single-node.txt")


def test_nccl_per_iu_and_per_node_pass_at_the_largest_size():
    t = nccl_transport(IU_NCCL, NODE_NCCL)
    results = nccl.CHECK.run(context(t))
    assert [(r.iu, r.verdict) for r in results] == [
        ("n1-iu0", Verdict.PASS),
        ("n1-iu1", Verdict.PASS),
        (None, Verdict.PASS),
    ]
    assert only(results, iu="n1-iu0").evidence["found"]["size_bytes"] == 17179869184
    argv = t.called("n1", "CUDA_VISIBLE_DEVICES=4,5,6,7")[0]
    assert argv[argv.index("-g") + 1] == "4" and argv[argv.index("-e") + 1] == "16G"


def test_nccl_gates_on_out_of_place_busbw_at_the_largest_size_not_the_average():
    # The 8-GPU sweep averages far below 460 (small sizes are latency bound) yet its 16 GiB row passes.
    node_result = only(nccl.CHECK.run(context(nccl_transport(IU_NCCL, NODE_NCCL))), iu=None)
    assert (
        node_result.evidence["found"]["avg_busbw_gbps"] < 460 <= node_result.evidence["found"]["busbw_gbps"]
    )
    [run] = [r for r in nccl.CHECK.gather(context(nccl_transport(IU_NCCL, NODE_NCCL))) if r.iu == "n1-iu0"]
    largest = max(run.parsed.rows, key=lambda r: r.size_bytes)
    slow_rows = [replace(r, oop_busbw_gbps=301.0) if r is largest else r for r in run.parsed.rows]
    slow = replace(run, parsed=replace(run.parsed, rows=slow_rows))
    n = node()
    bad = only(nccl.CHECK.evaluate([slow], profile_of(n), n), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NCCL_BUSBW")
    assert "busbw 301 GB/s at 16 GiB < 330" in bad.reason


def test_wrong_values_fail_as_corruption_even_though_the_run_completed():
    text = fixture_text("nccl", "h100-sxm-all_reduce-wrong-values-oob-failed.txt")
    results = nccl.CHECK.run(context(nccl_transport(text, NODE_NCCL, rc=1)))
    assert only(results, iu="n1-iu0").code == "NCCL_WRONG"


@pytest.mark.parametrize(
    "name",
    ["h100-all_reduce-crashed-before-first-row.txt", "h100-2node-all_reduce-crashed-ib-retry-exceeded.txt"],
)
def test_crashed_run_fails_with_its_last_error_line(name):
    text = fixture_text("nccl", name)
    bad = only(nccl.CHECK.run(context(nccl_transport(text, NODE_NCCL, rc=1))), iu="n1-iu0")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, "NCCL_INCOMPLETE")
    assert bad.reason.split(": ", 1)[1]  # carries the error line


def test_hung_nccl_run_fails_incomplete():
    from preflight.transport import CommandResult

    t = nccl_transport(IU_NCCL, NODE_NCCL)
    t.on(
        "n1",
        "env",
        "CUDA_VISIBLE_DEVICES=0,1,2,3",
        reply=CommandResult(None, "# nThread 1 nGpus 4\n", "", 5.0, timed_out=True),
    )
    results = nccl.CHECK.run(context(t))
    assert only(results, iu="n1-iu0").code == "NCCL_INCOMPLETE"
    assert (
        "not run" in only(results, iu="n1-iu1").reason
    )  # the host hung once: later commands are not started


# ------------------------------------------------------------------------------ cstates

SPR = fixture_text("cpupower", "intel-sapphire-rapids-intel_idle-c6-disabled.txt")
PLAIN_CMDLINE = "BOOT_IMAGE=/vmlinuz-5.15.0-113-generic root=/dev/mapper/vg0-root ro quiet\n"


def idle(cpupower_text: str, cmdline: str = PLAIN_CMDLINE, qos: str | None = None):
    t = ScriptedTransport().on("n1", "cpupower", "idle-info", reply=cpupower_text)
    t.on("n1", "cat", "/proc/cmdline", reply=cmdline)
    if qos is not None:
        t.on("n1", "od", reply=qos)
    [result] = cstates.CHECK.run(context(t))
    return result


def test_deep_cstate_enabled_without_anything_holding_it_fails():
    result = idle(SPR)  # C6 disabled but C1E (deeper than C1) still enabled
    assert (result.verdict, result.code) == (Verdict.FAIL, "CSTATES_DEEP")
    assert "C1E" in result.reason


def judge_cstates(cpupower_text: str, cmdline_text: str = PLAIN_CMDLINE, qos_us: int | None = None):
    n = node()
    facts = cstates.CstatesFacts(parsers.parse("cpupower", cpupower_text), cmdline.parse(cmdline_text), qos_us)
    [result] = cstates.CHECK.evaluate(facts, profile_of(n), n)
    return result


def test_deep_states_disabled_or_held_by_kernel_args_or_pm_qos_pass():
    assert (
        judge_cstates(fixture_text("cpupower", "intel-skylake-sp-deep-states-disabled-two-cpus.txt")).verdict
        is Verdict.PASS
    )
    held = judge_cstates(SPR, PLAIN_CMDLINE.strip() + " intel_idle.max_cstate=0 processor.max_cstate=1\n")
    assert (held.verdict, held.evidence["found"]["kernel_args"]) == (
        Verdict.PASS,
        ["intel_idle.max_cstate=0 processor.max_cstate=1"],
    )
    assert judge_cstates(SPR, qos_us=0).reason == "held by PM QoS (0 us)"
    assert judge_cstates(SPR, qos_us=2000000000).verdict is Verdict.FAIL


def test_pm_qos_target_is_gathered_from_od():
    assert idle(SPR, qos="          0\n").reason == "held by PM QoS (0 us)"
    assert idle(SPR, qos=" 2000000000\n").verdict is Verdict.FAIL


def test_intel_idle_limit_alone_does_not_count_when_acpi_idle_is_unlimited():
    assert cstates.cmdline_limits(cmdline.parse("ro intel_idle.max_cstate=0")) == []
    assert cstates.cmdline_limits(cmdline.parse("ro idle=poll")) == ["idle=poll"]
    assert cstates.cmdline_limits(cmdline.parse("ro intel_idle.max_cstate=1")) == ["intel_idle.max_cstate=1"]


def test_unparseable_cpupower_is_an_error():
    assert idle(fixture_text("cpupower", "truncated-inside-c1e.txt")).verdict is Verdict.ERROR


# ------------------------------------------------------------------------------ dcqcn

MLNX_QOS = """DCBX mode: OS controlled
Priority trust state: {trust}
dscp2prio mapping:
	prio:0 dscp:07,06,05,04,03,02,01,00,
	prio:3 dscp:31,30,29,28,27,26,25,24,
Receive buffer size (bytes): 130944,130944,0,0,0,0,0,0,
Cable len: 7
PFC configuration:
	priority    0   1   2   3   4   5   6   7
	enabled     0   0   0   {pfc}   0   0   0   0
	buffer      0   0   0   1   0   0   0   0
tc: 0 ratelimit: unlimited, tsa: vendor
	priority:  1
tc: 3 ratelimit: unlimited, tsa: ets, bw: 50%
	priority:  3
"""
ROCE_NICS = [
    {
        "device": "mlx5_0",
        "netdev": "ens1f0np0",
        "link_layer": "ethernet",
        "rate_gbps": 400,
        "numa_node": 0,
        "gpu": 0,
    }
]


def roce(trust="dscp", pfc="1", np_on="1", rp_on="1"):
    t = ScriptedTransport()
    t.on("n1", "cat", "/sys/class/net/ens1f0np0/ecn/roce_np/enable/3", reply=np_on + "\n")
    t.on("n1", "cat", "/sys/class/net/ens1f0np0/ecn/roce_rp/enable/3", reply=rp_on + "\n")
    t.on("n1", "mlnx_qos", "-i", "ens1f0np0", reply=MLNX_QOS.format(trust=trust, pfc=pfc))
    [result] = dcqcn.CHECK.run(context(t, node(rdma_nics=ROCE_NICS)))
    return result


def test_dcqcn_skips_infiniband_and_passes_a_configured_roce_port():
    [skipped] = dcqcn.CHECK.run(context(ScriptedTransport()))
    assert skipped.verdict is Verdict.SKIP
    assert (roce().verdict, roce().code) == (Verdict.PASS, "DCQCN_OK")


def port_qos(trust="dscp", pfc=True, np_on="1", rp_on="1") -> dcqcn.PortQos:
    """dcqcn's facts for one port, built: PFC on priority 3 only when ``pfc``."""
    table = [PfcPriority(p, pfc and p == 3, 1 if p == 3 else 0) for p in range(8)]
    return dcqcn.PortQos(np_on, rp_on, MlnxQos("OS controlled", trust, table))


@pytest.mark.parametrize(
    "kwargs, code",
    [
        ({"np_on": "0"}, "ECN_NP_OFF"),
        ({"rp_on": "0"}, "ECN_RP_OFF"),
        ({"trust": "pcp"}, "TRUST_NOT_DSCP"),
        ({"pfc": False}, "PFC_OFF"),
    ],
)
def test_each_missing_dcqcn_setting_fails(kwargs, code):
    n = node(rdma_nics=ROCE_NICS)
    profile = profile_of(n)
    assert dcqcn.CHECK.evaluate({"ens1f0np0": port_qos()}, profile, n)[0].verdict is Verdict.PASS
    [result] = dcqcn.CHECK.evaluate({"ens1f0np0": port_qos(**kwargs)}, profile, n)
    assert (result.verdict, result.code) == (Verdict.FAIL, code)


def test_mlnx_qos_without_pfc_table_is_an_error():
    with pytest.raises(ParseError):
        mlnx_qos.parse("Priority trust state: dscp\n")
    t = ScriptedTransport()
    for point in ("roce_np", "roce_rp"):
        t.on("n1", "cat", f"/sys/class/net/ens1f0np0/ecn/{point}/enable/3", reply="1\n")
    t.on("n1", "mlnx_qos", "-i", "ens1f0np0", reply="Priority trust state: dscp\n")
    [result] = dcqcn.CHECK.run(context(t, node(rdma_nics=ROCE_NICS)))
    assert (result.verdict, result.code) == (Verdict.ERROR, "GATHER")
    assert "cannot parse `mlnx_qos -i ens1f0np0`" in result.reason


# ------------------------------------------------------------------------------ numa_pinning


def pinning(shows: dict[int, str], cpulists=("0-47,96-143\n", "48-95,144-191\n")):
    t = ScriptedTransport()
    for numa, cpus in enumerate(cpulists):
        t.on("n1", "cat", f"/sys/devices/system/node/node{numa}/cpulist", reply=cpus)
    for index, text in shows.items():
        t.on(
            "n1",
            "systemctl",
            "show",
            "-p",
            "LoadState,CPUAffinity,NUMAPolicy,NUMAMask",
            f"vllm-iu@{index}.service",
            reply=text,
        )
    return numa_pinning.CHECK.run(context(t))


GOOD = {
    0: "LoadState=loaded\nCPUAffinity=0-47 96-143\nNUMAPolicy=bind\nNUMAMask=0\n",
    1: "LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=bind\nNUMAMask=1\n",
}


def test_units_pinned_to_their_numa_node_pass():
    assert [r.verdict for r in pinning(GOOD)] == [Verdict.PASS, Verdict.PASS]


@pytest.mark.parametrize(
    "text, code",
    [
        ("LoadState=loaded\nCPUAffinity=\nNUMAPolicy=bind\nNUMAMask=1\n", "CPU_AFFINITY"),
        ("LoadState=loaded\nCPUAffinity=0-47 96-143\nNUMAPolicy=bind\nNUMAMask=0\n", "CPU_AFFINITY"),
        ("LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=default\nNUMAMask=\n", "NUMA_POLICY"),
        ("LoadState=loaded\nCPUAffinity=48-95 144-191\nNUMAPolicy=bind\nNUMAMask=0\n", "NUMA_MASK"),
        ("LoadState=not-found\nCPUAffinity=\nNUMAPolicy=\nNUMAMask=\n", "UNIT_MISSING"),
    ],
)
def test_wrong_pinning_fails_the_iu(text, code):
    def facts(index: int, show: str, numa: str):
        return numa_pinning.IuPinning(parsers.parse("cpulist", numa), parsers.parse("systemctl-show", show).units[0])

    n = node()
    readings = {"n1-iu0": facts(0, GOOD[0], "0-47,96-143\n"), "n1-iu1": facts(1, text, "48-95,144-191\n")}
    results = numa_pinning.CHECK.evaluate(readings, profile_of(n), n)
    assert only(results, iu="n1-iu0").verdict is Verdict.PASS
    bad = only(results, iu="n1-iu1")
    assert (bad.verdict, bad.code) == (Verdict.FAIL, code)


def test_systemctl_without_a_manager_is_an_error_not_a_pass():
    results = pinning({0: "", 1: ""})
    assert {r.verdict for r in results} == {Verdict.ERROR}


def test_cpu_lists_in_both_spellings():
    line = Line(1, "")
    assert cpulist.cpus_of("0-2,8", line) == cpulist.cpus_of("0 1 2 8", line) == {0, 1, 2, 8}
    assert cpulist.format_cpus({0, 1, 2, 8, 9}) == "0-2,8-9"


# ------------------------------------------------------------------------------ time_sync


def tracking(name: str):
    t = ScriptedTransport().on("n1", "chronyc", "tracking", reply=fixture_text("chrony", name))
    [result] = time_sync.CHECK.run(context(t))
    return result


def test_synchronised_clock_passes():
    assert tracking("aws-time-sync-linklocal-chrony4.2-normal.txt").verdict is Verdict.PASS


@pytest.mark.parametrize(
    "name, code",
    [
        ("offset-4.5ms-slow-after-step.txt", "CLOCK_OFFSET"),
        ("unsynchronised-reference-00000000.txt", "CLOCK_UNSYNCED"),
        ("leap-insert-second.txt", "LEAP_STATUS"),
    ],
)
def test_clock_faults_fail(name, code):
    n = node()
    facts = parsers.parse("chrony", fixture_text("chrony", name))  # recorded faults, parsed: the facts
    [result] = time_sync.CHECK.evaluate(facts, profile_of(n), n)
    assert (result.verdict, result.code) == (Verdict.FAIL, code)
    fast = replace(facts, system_time_offset_s=0.0045, stratum=3, reference="A9FEA97B (169.254.169.123)",
                   leap_status="Normal")
    [result] = time_sync.CHECK.evaluate(fast, profile_of(n), n)
    assert (result.code, "fast" in result.reason) == ("CLOCK_OFFSET", True)


def test_chronyc_that_cannot_talk_to_chronyd_is_an_error():
    assert tracking("garbage-cannot-talk-to-daemon.txt").verdict is Verdict.ERROR


# ------------------------------------------------------------------------------ consul


def judge_consul(**facts):
    n = node()
    return consul.CHECK.evaluate(consul.ConsulFacts("127.0.0.1:8500", **facts), profile_of(n), n)[0]


def services(*ids, maintenance=()):
    return {i: ServiceState(i, "n1", "n1", {f"_service_maintenance:{i}": "critical"} if i in maintenance else {})
            for i in ids}


def test_consul_judged_on_what_the_agent_said():
    alive = {"serf_health": "passing"}
    ok = judge_consul(alive=alive, services=services("n1-iu0", "n1-iu1", maintenance=("n1-iu1",)))
    assert (ok.verdict, ok.code) == (Verdict.PASS, "CONSUL_OK") and "in maintenance: n1-iu1" in ok.reason
    down = judge_consul(agent_error="connection refused")
    assert (down.verdict, down.code, down.reason) == (Verdict.FAIL, "CONSUL_AGENT_DOWN",
                                                       "Consul at 127.0.0.1:8500: connection refused")
    sick = judge_consul(alive={"serf_health": "critical"}, services=services("n1-iu0", "n1-iu1"))
    assert (sick.verdict, sick.code) == (Verdict.FAIL, "CONSUL_NODE_UNHEALTHY")
    missing = judge_consul(alive=alive, services=services("n1-iu0"))
    assert (missing.verdict, missing.code, missing.reason) == (Verdict.FAIL, "CONSUL_SERVICE_MISSING",
                                                               "not registered in Consul: n1-iu1")
    unread = judge_consul(alive=alive, services_error="ACL not found")
    assert (unread.verdict, unread.code) == (Verdict.ERROR, "GATHER")
