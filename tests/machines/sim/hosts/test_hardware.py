"""Hardware descriptions: per-generation defaults, inventory overrides, consistency with the model."""

from __future__ import annotations

import pytest

from sim.hosts import create, hardware
from sim.hosts.stubs import cpu, nvidia_smi

pytestmark = pytest.mark.machines(order=4)


def hv(**extra) -> dict:
    return {"gpu_model": "h100-sxm", "group_names": ["rack_r01"], "rdma_nics": create.nics("h100-sxm", False), **extra}


def test_h100_defaults_describe_an_hgx_board():
    hw = hardware.resolve("n1", hv())
    assert (hw.vcpus, hw.memory_gib, len(hw.gpus)) == (192, 2048, 8)
    assert [n.id for n in hw.numa] == [0, 1] and hw.numa[0].cpus[:2] == [0, 1] and 96 in hw.numa[0].cpus
    assert [g.numa_node for g in hw.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert hw.gpus[4].bus_id == "00000000:9A:00.0" and hw.hcas[2].bus_id == "0000:9c:00.0"
    assert hw.nvlinks(0, 7) == 18 and hw.nccl_busbw_gbs[8] == 480.0
    assert hw.gpus[0].uuid != hardware.resolve("n2", hv()).gpus[0].uuid  # identifiers differ per host
    assert hw.gpus[0].uuid == hardware.resolve("n1", hv()).gpus[0].uuid  # ... and are stable


def test_inventory_overrides_merge_over_the_generation_defaults():
    hw = hardware.resolve("n1", hv(gpu_model="h200-sxm", sim_hardware={
        "memory_gib": 1024, "cores_per_socket": 56, "cpu_model": "Intel(R) Xeon(R) Platinum 8480C",
        "versions": {"driver": "560.35.03"}, "ib_latency_us": 1.2,
    }))
    assert hw.gpu_name == "NVIDIA H200" and hw.gpu_memory_mib == 143771
    assert hw.vcpus == 224 and hw.memory_gib == 1024
    assert hw.versions["driver"] == "560.35.03" and hw.versions["cuda"] == "12.4"  # nested keys merge
    assert {h.latency_us for h in hw.hcas} == {1.2}
    assert "Platinum 8480C" in cpu_output(hw)


def cpu_output(hw) -> str:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cpu.lscpu(hw, [])
    return out.getvalue()


def test_model_variables_shape_the_board():
    hw = hardware.resolve("n1", hv(gpu_count=4, gpu_numa_nodes=[0, 0, 1, 1], rdma_nics=create.nics("h100-sxm", False)[:2]))
    assert len(hw.gpus) == 4 and [g.numa_node for g in hw.gpus] == [0, 0, 1, 1]
    matrix = nvidia_smi.topo(hw, pcie_only=False)
    assert matrix.splitlines()[0] == "\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID"


def test_an_hca_on_a_gpus_pci_address_is_refused():
    nics = [{"device": "mlx5_0", "netdev": "ibp24s0", "gpu": 0}]  # bus 24 = 0x18 = GPU0 on HGX H100
    with pytest.raises(ValueError, match="GPU0's address"):
        hardware.resolve("n1", hv(rdma_nics=nics))


def test_cpulist_and_cpumask_formats():
    from sim.hosts.sysfs import cpumask

    assert hardware.cpulist([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    node0 = list(range(0, 48)) + list(range(96, 144))
    assert cpumask(node0, 192) == "00000000,0000ffff,ffffffff,00000000,0000ffff,ffffffff"
