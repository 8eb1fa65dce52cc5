"""The rdma_network role's RoCE boot script (rendered, run against a stand-in /sys/class/net and stub tools):
ECN, PFC and DSCP with MLNX_OFED, dcb with inbox rdma-core, and a loud failure naming the port otherwise."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from tests.helpers import GOLDEN

pytestmark = pytest.mark.integration


def _roce_script(tmp_path: Path) -> tuple[Path, Path]:
    """The rendered boot script with /sys/class/net and mlnx_qos under tmp_path, and a PATH dir for stubs."""
    root, bin_dir = tmp_path / "root", tmp_path / "bin"
    bin_dir.mkdir()
    text = (GOLDEN / "roce-dcqcn.sh").read_text()
    text = text.replace("/sys/class/net/", f"{root}/sys/class/net/").replace("/usr/bin/mlnx_qos", f"{bin_dir}/mlnx_qos")
    text = re.sub(r"-le 30 \]", "-le 1 ]", text).replace("sleep 1", "sleep 0.01")
    script = tmp_path / "roce-dcqcn"
    script.write_text(text)
    script.chmod(0o755)
    return script, bin_dir


NETDEVS = ("enp26s0np0", "enp60s0np0", "enp156s0np0", "enp188s0np0")


def _stub(bin_dir: Path, name: str, log: Path) -> None:
    (bin_dir / name).write_text(f"#!/bin/sh\necho {name} \"$@\" >> {log}\n")
    (bin_dir / name).chmod(0o755)


def _run(script: Path, bin_dir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def test_roce_on_mlnx_ofed_sets_ecn_pfc_and_dscp(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    log = tmp_path / "calls"
    _stub(bin_dir, "mlnx_qos", log)
    for netdev in NETDEVS:
        for role in ("roce_np", "roce_rp"):
            enable = tmp_path / "root/sys/class/net" / netdev / "ecn" / role / "enable"
            enable.mkdir(parents=True)
            (enable / "3").write_text("0\n")
    done = _run(script, bin_dir)
    assert done.returncode == 0, done.stderr
    for netdev in NETDEVS:
        assert (tmp_path / f"root/sys/class/net/{netdev}/ecn/roce_rp/enable/3").read_text().strip() == "1"
    calls = log.read_text().splitlines()
    assert f"mlnx_qos -i {NETDEVS[0]} --trust dscp --pfc 0,0,0,1,0,0,0,0" in calls
    assert f"mlnx_qos -i {NETDEVS[0]} --dscp2prio set,26,3" in calls


def test_roce_on_ofed_without_mlnx_qos_fails_loudly(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev / "ecn/roce_np/enable").mkdir(parents=True)
    done = _run(script, bin_dir)
    assert done.returncode != 0 and "mlnx_qos" in done.stderr and NETDEVS[0] in done.stderr


def test_roce_on_inbox_rdma_core_uses_dcb(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    log = tmp_path / "calls"
    _stub(bin_dir, "dcb", log)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev).mkdir(parents=True)  # inbox mlx5: no ecn directory
    done = _run(script, bin_dir)
    assert done.returncode == 0, done.stderr
    calls = log.read_text().splitlines()
    for netdev in NETDEVS:
        assert f"dcb pfc set dev {netdev} prio-pfc all:off 3:on" in calls
        assert f"dcb app replace dev {netdev} dscp-prio 26:3" in calls


def test_roce_with_neither_stack_fails_naming_the_port(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    for netdev in NETDEVS:
        (tmp_path / "root/sys/class/net" / netdev).mkdir(parents=True)
    done = subprocess.run([str(script)], capture_output=True, text=True, timeout=30,
                          env={"PATH": str(bin_dir) + ":/nonexistent"})
    assert done.returncode != 0
    assert f"{NETDEVS[0]}: neither MLNX_OFED" in done.stderr and "stays lossy" in done.stderr


def test_roce_fails_when_a_netdev_never_appears(tmp_path):
    script, bin_dir = _roce_script(tmp_path)
    _stub(bin_dir, "dcb", tmp_path / "calls")
    done = _run(script, bin_dir)
    assert done.returncode != 0 and f"{NETDEVS[0]}: no such network interface" in done.stderr
