"""The remediation breaker over Consul listings: which units count as out, the share and per-rack limits, and
the one line that says why it is open."""

from __future__ import annotations

import pytest

from cluster.model import build_cluster
from common.errors import UsageError
from operate.remediate_breaker import Limits, judge, units_out

pytestmark = pytest.mark.unit


def fleet(racks: int = 2, nodes_per_rack: int = 5, gpus: int = 8):
    """``racks`` x ``nodes_per_rack`` nodes of two 4-GPU units each (20 units by default)."""
    return build_cluster({f"r{r}n{n}": {"ansible_host": f"127.0.73.{r * 10 + n}", "rack": f"r{r}",
                                        "gpu_model": "h100-sxm", "gpu_count": gpus, "iu_size": 4}
                          for r in range(1, racks + 1) for n in range(1, nodes_per_rack + 1)})


def listing(cluster, critical: dict[str, str] | None = None, missing: tuple[str, ...] = ()) -> list:
    critical = critical or {}
    return [{"Service": {"ID": iu.id}, "Checks": [{"CheckID": "serfHealth", "Status": "passing"}]
             + ([{"CheckID": critical[iu.id], "Status": "critical"}] if iu.id in critical else [])}
            for iu in cluster.ius() if iu.id not in missing]


def test_critical_and_unlisted_units_are_out_passing_and_warning_ones_are_not():
    cluster = fleet()
    entries = listing(cluster, {"r1n1-iu0": "_service_maintenance:r1n1-iu0"}, missing=("r2n5-iu1",))
    entries[2]["Checks"].append({"CheckID": "vllm-iu:r1n2-iu0:health", "Status": "warning"})
    assert units_out(cluster, entries) == {"r1n1-iu0": "_service_maintenance:r1n1-iu0 critical",
                                           "r2n5-iu1": "not registered in Consul"}


def test_a_healthy_fleet_lets_one_unit_out():
    cluster = fleet()
    verdict = judge(cluster, listing(cluster), "r1n1", ("r1n1-iu0",), Limits())
    assert not verdict.open and verdict.units_out == 1 and verdict.units_allowed == 2
    assert verdict.reason == "breaker closed: 1 of 20 units out with this one (at most 2), 1 node(s) of rack r1 (at most 1)"


def test_ten_percent_of_the_units_is_the_limit():
    cluster = fleet()
    out = {"r2n1-iu0": "vllm-iu:r2n1-iu0:health", "r2n1-iu1": "vllm-iu:r2n1-iu1:health"}
    verdict = judge(cluster, listing(cluster, out), "r1n1", ("r1n1-iu0",), Limits())
    assert verdict.open and verdict.units_out == 3
    assert verdict.reason.startswith("breaker open: 3 of 20 units would be out of rotation, more than 2 (10% of the "
                                     "fleet); already out: r2n1-iu0: vllm-iu:r2n1-iu0:health critical; r2n1-iu1:")


def test_a_second_node_of_the_same_rack_opens_it_another_racks_node_does_not():
    cluster = fleet()
    same = judge(cluster, listing(cluster, {"r1n2-iu0": "x"}), "r1n1", ("r1n1-iu0",), Limits())
    assert same.open and same.rack_nodes_out == ("r1n1", "r1n2")
    assert same.reason.startswith("breaker open: 2 nodes of rack r1 would have a unit out (r1n1, r1n2), more than 1")
    other = judge(cluster, listing(cluster, {"r2n2-iu0": "x"}), "r1n1", ("r1n1-iu0",), Limits())
    assert not other.open


def test_the_target_already_out_is_not_counted_twice_and_its_sibling_keeps_the_node_at_one():
    cluster = fleet()
    entries = listing(cluster, {"r1n1-iu0": "vllm-iu:r1n1-iu0:health", "r1n1-iu1": "x"})
    verdict = judge(cluster, entries, "r1n1", ("r1n1-iu0",), Limits())
    assert not verdict.open and verdict.units_out == 2 and verdict.rack_nodes_out == ("r1n1",)


def test_taking_a_whole_node_counts_each_of_its_units():
    cluster = fleet(racks=1, nodes_per_rack=2)  # 4 units: 10% still allows one
    assert judge(cluster, listing(cluster), "r1n1", ("r1n1-iu0", "r1n1-iu1"), Limits()).open
    assert not judge(cluster, listing(cluster), "r1n1", ("r1n1-iu0", "r1n1-iu1"), Limits(max_unit_share=0.5)).open


def test_a_small_fleet_may_always_remediate_one_unit():
    cluster = fleet(racks=1, nodes_per_rack=1, gpus=4)
    assert Limits().units_allowed(1) == 1
    assert not judge(cluster, listing(cluster), "r1n1", ("r1n1-iu0",), Limits()).open


@pytest.mark.parametrize("share, nodes, message", [
    (0.0, 1, "--max-unit-share: must be in (0, 1] (got 0)"),
    (1.5, 1, "--max-unit-share: must be in (0, 1] (got 1.5)"),
    (0.1, 0, "--max-nodes-per-rack: must be at least 1 (got 0)"),
])
def test_limits_out_of_range_are_usage_errors(share, nodes, message):
    with pytest.raises(UsageError, match=None) as caught:
        Limits(share, nodes)
    assert str(caught.value) == message
