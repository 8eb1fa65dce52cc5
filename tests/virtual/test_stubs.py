"""Stub tools on simulated machines, run over SSH (as root through sudo) and read with preflight's own parsers."""

from __future__ import annotations

import subprocess
import time

import pytest

from preflight.parsers import parse
from sim.hosts import create
from sim.hosts import lifecycle as simulate
from tests.helpers import wait_for
from tests.virtual.helpers import calls_of, leftovers, needs_root, run_on

pytestmark = needs_root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The default virtual inventory's shape (2 racks, last one RoCE, 3 faulty nodes), up for the module."""
    directory = tmp_path_factory.mktemp("stubs") / "inv"
    create.write(directory, 4, 2, fabric="mixed")
    simulate.up(directory)
    try:
        yield directory
    finally:
        simulate.down(directory)
        assert leftovers(directory) == []


def stub(cluster, host, *argv):
    result = run_on(cluster, host, *argv)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_topo_matrix(cluster):
    healthy = parse("topo", stub(cluster, "r01n01", "nvidia-smi", "topo", "-m"))
    assert {healthy.link(f"GPU{a}", f"GPU{b}") for a in range(8) for b in range(8) if a != b} == {"NV18"}
    assert [g.cpu_affinity for g in healthy.gpus] == ["0-47,96-143"] * 4 + ["48-95,144-191"] * 4
    assert [nic.device for nic in healthy.nics] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    assert healthy.link("GPU2", "NIC1") == "PIX" and healthy.link("GPU2", "NIC2") == "SYS"
    broken = parse("topo", stub(cluster, "r01n02", "nvidia-smi", "topo", "-m"))  # nvlink_down 2-3
    assert broken.link("GPU2", "GPU3") == broken.link("GPU3", "GPU2") == "NODE"
    pcie = parse("topo", stub(cluster, "r01n01", "nvidia-smi", "topo", "-mp"))
    assert pcie.link("GPU0", "GPU1") == "NODE" and pcie.link("GPU0", "GPU4") == "SYS"


def test_memory_health(cluster):
    report = parse("nvsmi-q", stub(cluster, "r01n02", "nvidia-smi", "-q", "-d", "ECC,ROW_REMAPPER,PAGE_RETIREMENT"))
    assert len(report.gpus) == 8
    assert [g.remap_pending for g in report.gpus] == [False] * 6 + [True, False]
    assert {g.volatile_uncorrectable for g in report.gpus} == {0}
    full = parse("nvsmi-q", stub(cluster, "r01n01", "nvidia-smi", "-q"))
    assert full.driver_version == "550.90.07" and full.gpus[0].product_name == "NVIDIA H100 80GB HBM3"
    one = stub(cluster, "r01n01", "nvidia-smi", "-q", "-i", "3")  # "Attached GPUs" still counts all 8
    assert [line for line in one.splitlines() if line.startswith("GPU ")] == ["GPU 00000000:5D:00.0"]


def test_query_gpu_csv(cluster):
    out = stub(cluster, "r01n01", "nvidia-smi", "--query-gpu=index,pci.bus_id,persistence_mode,memory.total",
               "--format=csv,noheader,nounits")
    assert out.splitlines()[0] == "0, 00000000:18:00.0, Enabled, 81559"
    result = run_on(cluster, "r01n01", "nvidia-smi", "--query-gpu=bogus", "--format=csv")
    assert result.returncode != 0 and 'Field "bogus" is not a valid field to query.' in result.stderr


def test_ibstat_ib_and_roce(cluster):
    ib = parse("ibstat", stub(cluster, "r01n01", "ibstat"))
    port = ib.port("mlx5_0", 1)
    assert (port.state, port.rate_gbps, port.link_layer) == ("Active", 400, "InfiniBand")
    roce = parse("ibstat", stub(cluster, "r02n01", "ibstat"))
    assert roce.port("mlx5_2", 1).rate_gbps == 200  # ib_port_rate fault
    assert roce.port("mlx5_0", 1).link_layer == "Ethernet"


def test_perftest_between_hosts(cluster):
    lat = parse("perftest", stub(cluster, "r01n02", "ib_write_lat", "-d", "mlx5_0", "-F", "127.0.1.11"))
    assert lat.test == "ib_write_lat" and 1.0 <= lat.rows[-1].t_typical_us <= 1.2
    bw = parse("perftest", stub(cluster, "r01n02", "ib_write_bw", "-d", "mlx5_0", "--report_gbits", "r01n01"))
    assert 370 <= bw.rows[-1].bw_avg <= 390 and bw.rows[-1].bw_unit == "Gb/sec"
    slow = parse("perftest", stub(cluster, "r02n02", "ib_write_lat", "-d", "mlx5_1", "127.0.2.11"))
    assert slow.rows[-1].t_typical_us == 25.0  # the server's end of the link has ib_high_latency
    mb = parse("perftest", stub(cluster, "r01n02", "ib_write_bw", "-d", "mlx5_0", "127.0.1.11"))
    assert mb.rows[-1].bw_unit == "MB/sec" and 370 <= mb.rows[-1].bw_avg_gbps <= 390
    mixed = run_on(cluster, "r01n01", "ib_write_lat", "-d", "mlx5_0", "127.0.2.12")  # IB port vs RoCE port
    assert mixed.returncode == 1 and "Unable to Connect" in mixed.stdout


def test_ibping_by_lid(cluster):
    lid = parse("ibstat", stub(cluster, "r01n02", "ibstat")).port("mlx5_0", 1).base_lid
    result = parse("ibping", stub(cluster, "r01n01", "ibping", "-C", "mlx5_0", "-c", "5", "-L", str(lid)))
    assert (result.transmitted, result.received) == (5, 5)
    assert 0.04 <= result.rtt_avg_ms_corrected <= 0.09  # ~60 us MAD round trip
    lost = parse("ibping", stub(cluster, "r01n01", "ibping", "-c", "3", "-L", "4"))
    assert lost.received == 0


def test_all_reduce_perf(cluster):
    result = parse("nccl", stub(cluster, "r01n01", "all_reduce_perf", "-b", "8", "-e", "8G", "-f", "2", "-g", "8"))
    assert result.complete and result.wrong_total() == 0
    assert 470 <= result.largest_row().oop_busbw_gbps <= 485
    four = run_on(cluster, "r01n01", "env", "CUDA_VISIBLE_DEVICES=4,5,6,7", "all_reduce_perf", "-b", "1G", "-e",
                  "1G", "-g", "4").stdout
    assert 355 <= parse("nccl", four).largest_row().oop_busbw_gbps <= 366
    assert "[0x9a] NVIDIA H100 80GB HBM3" in four


def test_chrony_cpupower(cluster):
    assert abs(parse("chrony", stub(cluster, "r01n01", "chronyc", "tracking")).system_time_offset_s) < 1e-4
    assert parse("chrony", stub(cluster, "r02n02", "chronyc", "tracking")).system_time_offset_s == 0.0025
    info = parse("cpupower", stub(cluster, "r01n01", "cpupower", "idle-info"))
    assert info.driver == "intel_idle" and [s.name for s in info.states if s.disabled] == ["C1E", "C6"]
    enabled = parse("cpupower", stub(cluster, "r02n02", "cpupower", "idle-info"))  # cstates_enabled
    assert not any(s.disabled for s in enabled.states)


def test_lscpu_numactl_agree_with_sysfs(cluster):
    lscpu = dict(line.split(":", 1) for line in stub(cluster, "r01n01", "lscpu").splitlines())
    assert lscpu["CPU(s)"].strip() == "192" and lscpu["Model name"].strip() == "Intel(R) Xeon(R) Platinum 8468"
    sysfs = stub(cluster, "r01n01", "cat", "/sys/devices/system/node/node0/cpulist").strip()
    assert lscpu["NUMA node0 CPU(s)"].strip() == sysfs == "0-47,96-143"
    numa = stub(cluster, "r01n01", "numactl", "-H").splitlines()
    assert numa[0] == "available: 2 nodes (0-1)" and numa[-3:] == ["node   0   1 ", "  0:  10  21 ", "  1:  21  10 "]


def test_mlnx_qos_and_dcqcn_sysfs(cluster):
    from preflight.parsers import mlnx_qos

    qos = mlnx_qos.parse(stub(cluster, "r02n01", "mlnx_qos", "-i", "enp26s0np0"))
    assert qos.trust == "dscp" and [p.priority for p in qos.pfc if p.enabled] == [3]
    assert run_on(cluster, "r01n01", "mlnx_qos", "-i", "ibp26s0").returncode == 1  # no DCB on IPoIB
    # what roce-dcqcn's boot script sets is the simulated port's state: accepted; anything else is refused
    script = "mlnx_qos -i enp26s0np0 --trust dscp --pfc 0,0,0,1,0,0,0,0 && mlnx_qos -i enp26s0np0 --dscp2prio set,26,3"
    assert stub(cluster, "r02n01", "sh", "-c", script) == ""
    other = run_on(cluster, "r02n01", "mlnx_qos", "-i", "enp26s0np0", "--pfc", "0,0,0,0,1,0,0,0")
    assert other.returncode != 0 and "--pfc 0,0,0,0,1,0,0,0: only the provisioned QoS state" in other.stderr, other.stderr
    ecn = "cat /sys/class/net/enp26s0np0/ecn/roce_np/enable/3 /sys/class/net/enp26s0np0/ecn/roce_rp/enable/3"
    assert stub(cluster, "r02n01", "sh", "-c", ecn).split() == ["1", "1"]
    assert stub(cluster, "r02n02", "sh", "-c", ecn).split() == ["0", "0"]  # dcqcn_off
    assert run_on(cluster, "r01n01", "test", "-e", "/sys/class/net/ibp26s0/ecn").returncode == 1


def test_kernel_log_has_xid_for_gpu_faults(cluster):
    assert "NVRM: Xid (PCI:0000:ba:00): 63," in stub(cluster, "r01n02", "dmesg")
    journal = stub(cluster, "r01n02", "journalctl", "-k")
    assert " r01n02 kernel: NVRM: Xid (PCI:0000:ba:00): 63," in journal
    assert "Xid" not in stub(cluster, "r01n01", "dmesg")


def test_journalctl_reads_the_machines_own_journal_beyond_the_kernel_log(cluster):
    """Only -k is simulated: a unit's or a script's lines come from the machine's journald (rdma_network reads
    a failed boot unit's reason there; the stub answered '-- No entries --' to every such call)."""
    assert run_on(cluster, "r01n01", "logger", "-t", "clusterctl-stub-test", "the reason").returncode == 0
    read = ("journalctl", "-t", "clusterctl-stub-test", "-o", "cat", "--no-pager")
    wait_for(lambda: "the reason" in stub(cluster, "r01n01", *read), 10, "the logged line in the machine's journal")


def test_systemctl_show_reads_unit_files_offline(cluster):
    unit = ("[Service]\nExecStart=/bin/true %i\nCPUAffinity=0-47 96-143\nNUMAPolicy=bind\nNUMAMask=0\n"
            "[Install]\nWantedBy=multi-user.target\n")
    script = (f"printf '{unit}' > /etc/systemd/system/vllm-iu@.service && systemctl enable vllm-iu@0 2>/dev/null && "
              "systemctl show -p CPUAffinity,NUMAPolicy,NUMAMask,UnitFileState vllm-iu@0")
    out = stub(cluster, "r01n01", "sh", "-c", script)
    assert out.splitlines() == ["CPUAffinity=0-47 96-143", "NUMAPolicy=bind", "NUMAMask=0", "UnitFileState=enabled"]
    verify = run_on(cluster, "r01n01", "systemd-analyze", "verify", "/etc/systemd/system/vllm-iu@0.service")
    assert verify.returncode == 0 and verify.stderr == ""
    fabric = run_on(cluster, "r01n01", "systemctl", "is-active", "nvidia-fabricmanager")
    assert (fabric.returncode, fabric.stdout) == (0, "active\n")  # an HGX node runs it from boot
    vllm = run_on(cluster, "r01n01", "systemctl", "is-active", "vllm-iu@0")
    assert (vllm.returncode, vllm.stdout) == (3, "inactive\n")  # no live actions: never started


def test_calls_are_logged(cluster):
    stub(cluster, "r01n01", "nvidia-smi", "-L")
    last = calls_of(cluster, "r01n01")[-1]
    assert last["argv"] == ["nvidia-smi", "-L"] and abs(last["time"] - time.time()) < 30


def test_command_delay_and_hang(up_inventory):
    # Addresses of their own: the module's cluster (127.0.1.x, 127.0.2.x) is still up.
    directory = up_inventory(2, 1, faults="none", host_vars={
        "r01n01": "ansible_host: 127.0.9.11\nsim_command_delay_s: 1.0\n",
        "r01n02": "ansible_host: 127.0.9.12\nsim_faults: [{kind: hang, command: all_reduce_perf}]\n",
    })
    start = time.monotonic()
    assert run_on(directory, "r01n01", "chronyc", "tracking").returncode == 0
    assert 1.0 <= time.monotonic() - start < 5
    assert run_on(directory, "r01n02", "nvidia-smi", "-L").returncode == 0  # only the named tool hangs
    with pytest.raises(subprocess.TimeoutExpired):
        run_on(directory, "r01n02", "all_reduce_perf", "-g", "8", timeout=5)  # SSH set-up included
    assert calls_of(directory, "r01n02")[-1]["argv"][0] == "all_reduce_perf"
