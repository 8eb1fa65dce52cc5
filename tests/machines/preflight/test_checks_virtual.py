"""Every check against simulated hosts with injected faults: the faulty host gets exactly the expected
fault code, every other (host, check) passes, an unreachable host is UNREACHABLE and a hanging one ERROR
while the rest of the cluster finishes.

One inventory holds one fault per host (IB-affecting faults one per rack, so ib_pairs can tell which
end is bad). vllm-iu units are written into every host (one pinned to the wrong socket); consul needs a
Consul server and is covered in tests/machines/preflight/test_e2e_virtual.py.
"""

from __future__ import annotations

import json

import pytest

from cluster import load_cluster
from preflight import report
from preflight.checks import select
from preflight.checks.base import RunOptions
from preflight.profiles import profile_of
from preflight.runner import exit_code, run_preflight
from preflight.transport import RoutingTransport

pytestmark = pytest.mark.machines(own_net=True)
# The machines' own 127.44.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 44

# 6 racks x 3 nodes (`virtual create --nodes 18 --racks 6 --fabric mixed`: r06 is RoCE). Each of r01-r04
# has one fault that shows on the fabric and two that do not; r05 has the unreachable and the hanging host.
FAULTS = {
    "r01n01": [{"kind": "ib_port_down", "device": "mlx5_1"}],
    "r01n02": [{"kind": "nvlink_down", "gpus": [5, 6]}],
    "r01n03": [{"kind": "gpu_wrong_numa", "gpu": 3}],
    "r02n01": [{"kind": "ib_port_rate", "device": "mlx5_2"}],
    "r02n02": [{"kind": "ecc_uncorrectable", "gpu": 1}],
    "r02n03": [{"kind": "row_remap_pending", "gpu": 6}],
    "r03n01": [{"kind": "ib_high_latency", "device": "mlx5_3"}],
    "r03n02": [{"kind": "nccl_low_bw"}],
    "r03n03": [{"kind": "nccl_wrong"}],
    "r04n01": [{"kind": "ib_low_bandwidth", "device": "mlx5_0"}],
    "r04n02": [{"kind": "cstates_enabled"}],
    "r04n03": [{"kind": "clock_offset"}],
    "r05n01": [{"kind": "unreachable"}],
    "r05n02": [{"kind": "hang"}],
    "r06n01": [{"kind": "dcqcn_off"}],
    "r06n02": [{"kind": "version_drift"}],
}
# 18 machines on CI's 2 shared cores: a 5 s command limit timed out healthy ibping runs (an ssh round trip
# plus a stub's Python start under load), and on CI 20 s timed out four perftest runs in one rack (IB_TEST_FAILED
# where the fault is IB_BANDWIDTH); the hanging host costs this once, later commands on it never start.
COMMAND_TIMEOUT_S = 45.0
HOSTS = [f"r{r:02d}n{n:02d}" for r in range(1, 7) for n in range(1, 4)]

# (node, check, iu) -> (verdict, fault code) for every result that must not be PASS/SKIP.
EXPECTED = {
    ("r01n01", "ib_ports", None): ("FAIL", "PORT_DOWN"),
    ("r01n01", "ib_pairs", None): ("FAIL", "IB_UNREACHABLE"),
    ("r01n02", "gpu_topology", "r01n02-iu1"): ("FAIL", "NVLINK_MISSING"),
    ("r01n02", "nccl", "r01n02-iu1"): ("FAIL", "NCCL_BUSBW"),  # the broken NVLink slows its IU and the node
    ("r01n02", "nccl", None): ("FAIL", "NCCL_BUSBW"),
    # the broken NVLink's pair also reads low device-to-device bandwidth (nvbandwidth over that link)
    ("r01n02", "gpu_bandwidth", None): ("FAIL", "GPU_BW_D2D"),
    # and its two GPUs' links read <inactive> in nvidia-smi nvlink -s; the simulated DCGM passes anyway, as real
    # DCGM level 2 does with NVLinks down (NVIDIA/DCGM#198), so dcgm_diag WARNs its cross-check
    ("r01n02", "nvlink", None): ("FAIL", "NVLINK_INACTIVE"),
    ("r01n02", "dcgm_diag", None): ("WARN", "DCGM_CROSS_CHECK"),
    ("r01n03", "gpu_topology", "r01n03-iu0"): ("FAIL", "GPU_NUMA"),
    ("r02n01", "ib_ports", None): ("FAIL", "PORT_RATE"),
    ("r02n01", "ib_pairs", None): ("FAIL", "IB_BANDWIDTH"),
    ("r02n02", "gpu_health", None): ("FAIL", "ECC_UNCORRECTABLE"),
    ("r02n03", "gpu_health", None): ("FAIL", "ROW_REMAP_PENDING"),
    ("r03n01", "ib_pairs", None): ("FAIL", "IB_LATENCY"),
    ("r03n02", "nccl", "r03n02-iu0"): ("FAIL", "NCCL_BUSBW"),
    ("r03n02", "nccl", "r03n02-iu1"): ("FAIL", "NCCL_BUSBW"),
    ("r03n02", "nccl", None): ("FAIL", "NCCL_BUSBW"),
    ("r03n03", "nccl", "r03n03-iu0"): ("FAIL", "NCCL_WRONG"),
    ("r03n03", "nccl", "r03n03-iu1"): ("FAIL", "NCCL_WRONG"),
    ("r03n03", "nccl", None): ("FAIL", "NCCL_WRONG"),
    ("r04n01", "ib_pairs", None): ("FAIL", "IB_BANDWIDTH"),
    ("r04n02", "cstates", None): ("FAIL", "CSTATES_DEEP"),
    ("r04n03", "time_sync", None): ("FAIL", "CLOCK_OFFSET"),
    ("r04n03", "numa_pinning", "r04n03-iu1"): ("FAIL", "CPU_AFFINITY"),
    ("r06n01", "dcqcn", None): ("FAIL", "ECN_NP_OFF"),
    ("r06n02", "versions", None): ("FAIL", "VERSION_DRIFT"),
    ("r05n03", "ib_pairs", None): ("SKIP", "IB_NO_PEERS"),  # its rack-mates are down
}
CHECKS = [
    "gpu_topology",
    "gpu_health",
    "ib_ports",
    "ib_pairs",
    "nccl",
    "cstates",
    "dcqcn",
    "numa_pinning",
    "time_sync",
    "versions",
    "os_support",
    "secure_boot",
    # the deeper checks run here too; of the faults above only nvlink_down makes them FAIL (gpu_bandwidth, nvlink)
    # or WARN (dcgm_diag), as listed in EXPECTED
    "pcie_link",
    "nvlink",
    "gpu_throttle",
    "ib_link_health",
    "gpu_bandwidth",
    "dcgm_diag",
]


@pytest.fixture(scope="module")
def faulty_run(tmp_path_factory):
    from tests.helpers.preflight import VirtualInventory

    inv = VirtualInventory(
        tmp_path_factory.mktemp("faults"),
        nodes=18,
        racks=6,
        fabric="mixed",
        host_vars={h: {"sim_faults": f} for h, f in FAULTS.items()},
        net=NET,
    )
    inv.up()
    try:
        for name in HOSTS:
            if name != "r05n01":  # unreachable
                # r04n03's IU 1 unit is pinned to the other socket: the numa_pinning fault.
                inv.install_iu_units(name, {0: 0, 1: 0 if name == "r04n03" else 1})
                inv.install_dcgm(name)
        cluster = load_cluster(inv.root)
        profiles = {n.name: profile_of(n) for n in cluster.nodes()}
        transport = RoutingTransport()
        outcome = run_preflight(
            cluster,
            select(None, ["consul"]),
            profiles,
            transport,
            RunOptions(timeout=COMMAND_TIMEOUT_S, probe_timeout=5.0),
            parallel=32,
        )
        document = json.loads(json.dumps(report.to_json(outcome)))  # exactly what --json writes
        yield exit_code(outcome.results), None, document
    finally:
        inv.down()


def test_each_injected_fault_fails_exactly_its_host_and_check(faulty_run):
    code, _, document = faulty_run
    results = document["results"]
    by_key = {(r["node"], r["check"], r["iu"]): r for r in results}
    for key, (verdict, fault_code) in EXPECTED.items():
        assert key in by_key, f"no result for {key}"
        got = by_key[key]
        assert (got["verdict"], got["evidence"]["code"]) == (verdict, fault_code), (key, got["reason"])
    for key, result in by_key.items():
        if key in EXPECTED or key[0] in ("r05n01", "r05n02"):
            continue
        assert result["verdict"] in ("PASS", "SKIP"), (key, result["reason"])
    assert code == 1


def test_every_check_ran_on_every_host(faulty_run):
    _, _, document = faulty_run
    ran = {(r["node"], r["check"]) for r in document["results"]}
    for name in HOSTS:
        assert {c for n, c in ran if n == name} == set(CHECKS), name


def test_unreachable_and_hanging_hosts_are_reported_while_the_rest_finishes(faulty_run):
    _, _, document = faulty_run
    unreachable = [r for r in document["results"] if r["node"] == "r05n01"]
    assert {r["verdict"] for r in unreachable} == {"UNREACHABLE"}
    assert "port 22" in unreachable[0]["reason"]  # the fault masks the machine's sshd: nothing listens
    hung = [r for r in document["results"] if r["node"] == "r05n02"]
    assert {r["verdict"] for r in hung} == {"ERROR", "SKIP"}  # SKIP: dcqcn on IB needs no command
    assert any(f"timed out after {COMMAND_TIMEOUT_S:g}s" in r["reason"] for r in hung)
    # the healthy host of that rack finished every check
    healthy = [r for r in document["results"] if r["node"] == "r05n03"]
    assert {r["verdict"] for r in healthy} == {"PASS", "SKIP"}
    s = document["summary"]
    assert (s["nodes_unreachable"], s["nodes_error"]) == (["r05n01"], ["r05n02"])


def test_layout_suggestion_and_evidence_on_the_simulated_topology(faulty_run):
    _, _, document = faulty_run
    numa = next(
        r
        for r in document["results"]
        if (r["node"], r["check"], r["iu"]) == ("r01n03", "gpu_topology", "r01n03-iu0")
    )
    assert numa["evidence"]["found"]["numa"]["3"] == 1
    assert numa["evidence"]["suggested_iu_layout"] == [[3, 4, 5, 6]]
    assert "suggested iu_layout: [[3, 4, 5, 6]]" in numa["reason"]
