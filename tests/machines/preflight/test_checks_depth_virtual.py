"""The issue-17 checks on simulated hosts: each new fault FAILs exactly its check on exactly its host,
every other (host, check) passes, and the report says which depth ran (JSON summary, JUnit property).

Runs under the virtual-cluster lock like the other simulated-host tests (`flock /tmp/clusterctl-virtual.lock`).
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
# The machines' own 127.45.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 45

# 2 racks x 4 nodes; one new fault per host, two healthy hosts. Depth standard: DCGM level 2 runs the memory
# test that dcgm_fail breaks (level 1, quick, runs only the software checks and would pass it, as real DCGM).
FAULTS = {
    "r01n01": [{"kind": "pcie_downtrained", "gpu": 2}],
    "r01n02": [{"kind": "gpu_low_bandwidth", "gpu": 5}],
    "r01n03": [{"kind": "nvlink_errors", "gpu": 1, "link": 3}],
    "r02n01": [{"kind": "gpu_throttle", "gpu": 0}],
    "r02n02": [{"kind": "dcgm_fail", "gpu": 3, "test": "memory"}],
    "r02n03": [{"kind": "ib_link_flaps", "device": "mlx5_1", "count": 3}],
}
EXPECTED = {
    ("r01n01", "pcie_link"): "PCIE_GEN",
    ("r01n02", "gpu_bandwidth"): "GPU_BW_H2D",
    ("r01n03", "nvlink"): "NVLINK_REPLAY",
    ("r02n01", "gpu_throttle"): "THROTTLE_ACTIVE",
    ("r02n02", "dcgm_diag"): "DCGM_FR_FAULTY_MEMORY",
    ("r02n03", "ib_link_health"): "IB_LINK_FLAP",
}
NEW = {"pcie_link", "nvlink", "gpu_throttle", "ib_link_health", "gpu_bandwidth", "dcgm_diag"}


@pytest.fixture(scope="module")
def depth_run(tmp_path_factory):
    from tests.helpers.preflight import VirtualInventory

    inv = VirtualInventory(tmp_path_factory.mktemp("depth"), nodes=8, racks=2,
                           host_vars={h: {"sim_faults": f} for h, f in FAULTS.items()}, net=NET)
    inv.up()
    try:
        cluster = load_cluster(inv.root)
        for node in cluster.nodes():
            inv.install_dcgm(node.name)  # dcgm_diag needs DCGM's package, as on a real host
        profiles = {n.name: profile_of(n) for n in cluster.nodes()}
        transport = RoutingTransport()
        try:
            outcome = run_preflight(cluster, select(None, ["consul", "numa_pinning"]), profiles, transport,
                                    RunOptions(timeout=20.0, probe_timeout=10.0, depth="standard"),
                                    parallel=8)
        finally:
            transport.close()
        yield outcome, json.loads(json.dumps(report.to_json(outcome)))
    finally:
        inv.down()


def test_each_new_fault_fails_exactly_its_check(depth_run):
    outcome, document = depth_run
    by_key: dict[tuple[str, str], list[dict]] = {}
    for r in document["results"]:
        by_key.setdefault((r["node"], r["check"]), []).append(r)
    for key, code in EXPECTED.items():
        assert [(r["verdict"], r["evidence"]["code"]) for r in by_key[key]] == [("FAIL", code)], (key, by_key[key])
    for key, results in by_key.items():
        if key in EXPECTED:
            continue
        for r in results:
            assert r["verdict"] in ("PASS", "SKIP"), (key, r["reason"])
    assert {c for _, c in by_key} >= NEW
    assert exit_code(outcome.results) == 1


def test_the_report_names_the_depth(depth_run):
    outcome, document = depth_run
    assert document["summary"]["depth"] == "standard"
    junit = report.to_junit(outcome)
    assert junit.find("properties/property[@name='depth']").get("value") == "standard"
    dcgm = next(r for r in document["results"] if r["check"] == "dcgm_diag" and r["node"] == "r01n04")
    assert (dcgm["evidence"]["level"], dcgm["evidence"]["depth"]) == (2, "standard")
