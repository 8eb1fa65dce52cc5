"""preflight/checks/gpu_topology.py: ``evaluate`` judged on facts built directly (NHC style: the facts of a fault, never fixture text
edited to produce one), ``gather`` through a scripted transport on canned real-format outputs (a healthy
node passes; unreadable output is an ERROR)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from preflight import parsers
from preflight.checks import (
    gpu_topology,
)
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


def test_a_matrix_read_with_parse_warnings_says_so_in_every_result():
    """A row whose cells ran together is not read: the results carry the parse's warnings, and a PASS says it
    was read with warnings (it never passes silently on a GPU whose NUMA affinity nobody saw)."""
    text = hgx_topo()
    row = next(line for line in text.split("\n") if line.startswith("GPU1 "))
    damaged = text.replace(row, row.replace(" NV18 ", " NV18NV18 ", 1).replace("NV18NV18  ", "NV18NV18 ", 1), 1)
    results = run_topology(damaged)
    assert results and all(r.evidence["parse_warnings"] for r in results)
    assert all("row GPU1 has 'NV18NV18'" in r.evidence["parse_warnings"][0] for r in results)
    assert all(r.evidence["parse_warnings"][0].startswith("`nvidia-smi topo -m` line ") for r in results)
    passed = [r for r in results if r.verdict is Verdict.PASS]
    assert passed and all(r.reason.endswith("(read with 1 parse warning)") for r in passed)


def test_a_clean_matrix_has_no_parse_warnings_in_its_evidence():
    assert all("parse_warnings" not in r.evidence for r in run_topology(hgx_topo()))
