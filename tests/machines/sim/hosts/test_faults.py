"""Each injected fault changes exactly the outputs a real node with that fault would show, nothing else.

Stub tools and simulated trees are pure functions of the hardware description, so this runs in-process:
every observable (tool output, /sys subtree, /proc file) of a faulted host is compared with the same
host healthy, both talking to a healthy peer.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import time

import pytest

from sim.hosts import create, faults, hardware, sysfs
from sim.hosts.stubs import gpu_depth, peers
from sim.hosts.stubs import main as stub_main
from tests.helpers import run_cli

pytestmark = pytest.mark.machines(order=4)

EXPECTED_CHANGES = {
    # D2D of the pair over PCIe; the two GPUs' links <inactive> in nvlink -s (their -e counters N/A)
    "nvlink_down": {"nvidia-smi topo -m", "all_reduce_perf", "nvbandwidth", "nvidia-smi nvlink -s",
                    "nvidia-smi nvlink -e"},
    "gpu_wrong_numa": {"nvidia-smi topo -m", "nvidia-smi topo -mp", "sys/pci"},
    "ib_port_down": {"ibstat", "ibping", "ib_write_lat", "ib_write_bw", "sys/class"},
    "ib_port_rate": {"ibstat", "ib_write_bw", "sys/class"},
    "ib_high_latency": {"ib_write_lat", "ibping"},
    "ib_low_bandwidth": {"ib_write_bw"},
    "nccl_low_bw": {"all_reduce_perf"},
    "nccl_wrong": {"all_reduce_perf"},
    "ecc_uncorrectable": {"nvidia-smi", "nvidia-smi -q", "nvidia-smi --query-gpu", "dmesg", "journalctl -k"},
    "row_remap_pending": {"nvidia-smi -q", "nvidia-smi --query-gpu", "dmesg", "journalctl -k"},
    "cstates_enabled": {"sys/cpu", "proc/cmdline", "cpupower idle-info", "dmesg", "journalctl -k"},
    "dcqcn_off": {"sys/class"},
    "clock_offset": {"chronyc tracking"},
    "version_drift": {"nvidia-smi", "nvidia-smi -q", "nvidia-smi --query-gpu", "dmesg", "journalctl -k",
                      "nvbandwidth"},
    # faults of the deeper checks
    "pcie_downtrained": {"nvidia-smi -q", "sys/pci"},
    "gpu_low_bandwidth": {"nvbandwidth"},
    "nvlink_errors": {"nvidia-smi nvlink -e"},
    "gpu_throttle": {"nvidia-smi -q"},
    "dcgm_fail": {"dcgmi diag"},
    "ib_link_flaps": {"dmesg", "journalctl -k"},
}
QUERY = "--query-gpu=index,driver_version,ecc.errors.uncorrected.volatile.total,remapped_rows.pending"


def hostvars(roce: bool) -> dict:
    return {"gpu_model": "h100-sxm", "group_names": ["rack_r01"], "rdma_nics": create.nics("h100-sxm", roce)}


def observe(tmp_path, monkeypatch, hw: hardware.Hardware, peer: hardware.Hardware) -> dict[str, str]:
    """Every observable of ``hw``, with ``peer`` as the other end of its links."""
    state_dir = tmp_path / f"state-{len(list(tmp_path.iterdir()))}"
    for host in (hw, peer):
        (state_dir / host.host / "state").mkdir(parents=True)
        (state_dir / host.host / "state" / "host.json").write_text(
            json.dumps({"hardware": host.to_json(), "state_dir": str(state_dir)}))
    peers.write_index(state_dir, {hw.host: (hw, "127.0.1.11"), peer.host: (peer, "127.0.1.12")})
    monkeypatch.setattr(stub_main, "SIM_RUN_DIR", state_dir / hw.host / "state")
    engine_pid = state_dir / hw.host / "state" / "nv-hostengine.pid"
    engine_pid.write_text(f"{os.getpid()}\n")  # DCGM's host engine runs (this process), as once provisioned
    monkeypatch.setattr(gpu_depth, "HOSTENGINE_PID_FILE", str(engine_pid))
    monkeypatch.setattr(time, "time", lambda: 1_800_000_000.0)
    calls = {
        "nvidia-smi": ("nvidia-smi", []),
        "nvidia-smi -q": ("nvidia-smi", ["-q"]),
        "nvidia-smi topo -m": ("nvidia-smi", ["topo", "-m"]),
        "nvidia-smi topo -mp": ("nvidia-smi", ["topo", "-mp"]),
        "nvidia-smi --query-gpu": ("nvidia-smi", [QUERY, "--format=csv"]),
        "ibstat": ("ibstat", []),
        "ibping": ("ibping", ["-C", "mlx5_0", "-c", "3", "-L", str(peer.hcas[0].lid)]),
        "ib_write_lat": ("ib_write_lat", ["-d", "mlx5_0", peer.host]),
        "ib_write_bw": ("ib_write_bw", ["-d", "mlx5_0", "--report_gbits", peer.host]),
        "all_reduce_perf": ("all_reduce_perf", ["-b", "1M", "-e", "1G", "-f", "4", "-g", "8"]),
        "chronyc tracking": ("chronyc", ["tracking"]),
        "lscpu": ("lscpu", []),
        "numactl -H": ("numactl", ["-H"]),
        "cpupower idle-info": ("cpupower", ["idle-info"]),
        "dmesg": ("dmesg", []),
        "journalctl -k": ("journalctl", ["-k"]),
        "mlnx_qos": ("mlnx_qos", ["-i", hw.hcas[0].netdev]),
        "ofed_info -s": ("ofed_info", ["-s"]),
        "nv-fabricmanager --version": ("nv-fabricmanager", ["--version"]),
        "nvidia-smi nvlink -s": ("nvidia-smi", ["nvlink", "-s"]),
        "nvidia-smi nvlink -e": ("nvidia-smi", ["nvlink", "-e"]),
        "nvbandwidth": ("nvbandwidth", ["-t", "host_to_device_memcpy_ce", "device_to_host_memcpy_ce",
                                        "device_to_device_memcpy_read_ce"]),
        "dcgmi diag": ("dcgmi", ["diag", "-r", "3", "-j"]),
    }
    seen = {}
    for name, (tool, args) in calls.items():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = stub_main.run_tool(tool, args, hw)
        seen[name] = f"{code}\n{out.getvalue()}"
    trees = {"cpu": sysfs.cpu_tree, "node": sysfs.node_tree, "class": sysfs.class_tree, "pci": sysfs.pci_tree,
             "virtual": sysfs.virtual_tree}
    for name, tree in trees.items():
        seen[f"sys/{name}"] = repr(sorted(tree(hw).items()))
    for name, text in {**sysfs.proc_files(hw), **sysfs.etc_files(hw)}.items():
        seen[f"proc/{name}" if name in ("cpuinfo", "meminfo", "cmdline") else f"etc/{name}"] = text
    return seen


@pytest.mark.parametrize("kind", sorted(EXPECTED_CHANGES))
def test_fault_changes_exactly_its_outputs(tmp_path, monkeypatch, kind):
    roce = kind == "dcqcn_off"
    healthy = hardware.resolve("r01n01", hostvars(roce))
    peer = hardware.resolve("r01n02", hostvars(roce))
    broken = faults.apply(healthy, [{"kind": kind}])
    before = observe(tmp_path, monkeypatch, healthy, peer)
    after = observe(tmp_path, monkeypatch, broken, peer)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == EXPECTED_CHANGES[kind]


@pytest.mark.parametrize(("component", "changes"), [
    ("cuda", {"nvidia-smi", "nvidia-smi -q"}),
    ("nccl", {"all_reduce_perf"}),
    ("ofed", {"ofed_info -s"}),
    ("fabric_manager", {"nv-fabricmanager --version"}),
])
def test_version_drift_shows_where_that_component_reports_its_version(tmp_path, monkeypatch, component, changes):
    healthy = hardware.resolve("r01n01", hostvars(False))
    peer = hardware.resolve("r01n02", hostvars(False))
    broken = faults.apply(healthy, [{"kind": "version_drift", "component": component, "version": "2.18.3"}])
    before = observe(tmp_path, monkeypatch, healthy, peer)
    after = observe(tmp_path, monkeypatch, broken, peer)
    assert {name for name in before if before[name] != after[name]} == changes


def test_every_fault_kind_of_the_issue_is_covered():
    assert set(EXPECTED_CHANGES) | {"unreachable", "hang"} == set(faults.FAULTS)


def test_fault_parameters_are_applied():
    hw = hardware.resolve("h", hostvars(False))
    broken = faults.apply(hw, [
        {"kind": "nvlink_down", "gpus": [5, 6], "links": 12},
        {"kind": "ib_port_rate", "device": "mlx5_3", "rate_gbps": 100},
        {"kind": "version_drift", "component": "nccl", "version": "2.18.1"},
    ])
    assert broken.nvlinks(5, 6) == 12 and broken.nvlinks(2, 3) == 18
    # each GPU of the pair shows its links above the 12 left as <inactive> in nvlink -s; the other GPUs none
    assert [broken.gpus[g].nvlink_inactive for g in (4, 5, 6)] == [[], list(range(12, 18)), list(range(12, 18))]
    assert [h.rate_gbps for h in broken.hcas] == [400, 400, 400, 100]
    assert broken.versions["nccl"] == "2.18.1"
    assert hw.nvlinks(5, 6) == 18  # apply() copies; the healthy description is untouched


@pytest.mark.parametrize(("fault", "message"), [
    ({"kind": "melted"}, "unknown fault kind 'melted'"),
    ({"kind": "ib_port_down", "device": "mlx5_9"}, "no HCA 'mlx5_9'"),
    ({"kind": "nvlink_down", "gpus": [0, 8]}, "GPU 8 out of range"),
    ({"kind": "dcqcn_off"}, "no RoCE"),
])
def test_bad_faults_are_named(fault, message):
    with pytest.raises(faults.FaultError, match=message):
        faults.apply(hardware.resolve("h", hostvars(False)), [fault])


def test_bad_fault_in_an_inventory_stops_up_before_any_host_is_touched(make_inventory, capsys):
    directory = make_inventory(2, 1, faults="none")
    (directory / "host_vars").mkdir()
    (directory / "host_vars" / "r01n02.yml").write_text("sim_faults: [{kind: ib_port_down, device: mlx5_7}]\n")
    code, _, err = run_cli(capsys, "virtual", "up", str(directory))
    assert code == 2 and "r01n02" in err and "mlx5_7" in err
    assert not (directory / ".sim" / "r01n01").exists()
