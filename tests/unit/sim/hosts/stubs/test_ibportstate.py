"""The stand-in ``ibportstate`` (sim/hosts/stubs/ibportstate.py): the query block as infiniband-diags prints it,
disable / on changing what ``ibstat`` reads, and its failures as the real tool prints them: no permission on
the UMAD device, no such CA or port, a RoCE port (exit 255, ibexit's ``iberror`` line on stdout)."""

from __future__ import annotations

import json
import os

import pytest

from sim.hosts import create
from sim.hosts.hardware import Hardware, resolve
from sim.hosts.stubs import ibportstate, infiniband

pytestmark = pytest.mark.unit

ARGS = ["-C", "mlx5_0", "-P", "1", "-D", "0", "1"]


@pytest.fixture
def host(tmp_path):
    hw = resolve("n1", {"gpu_count": 8, "rdma_nics": create.nics("h100-sxm", False)})
    (tmp_path / "host.json").write_text(json.dumps({"hardware": hw.to_json()}))
    return hw, tmp_path


def saved(run_dir) -> Hardware:
    return Hardware.from_json(json.loads((run_dir / "host.json").read_text())["hardware"])


def test_the_query_prints_the_port_info_block_with_dotted_fields(host, capsys):
    hw, run_dir = host
    assert ibportstate.main(hw, ARGS, run_dir, euid=0) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == ["CA/RT PortInfo:", "# Port info: DR path slid 65535; dlid 65535; 0 port 1",
                       "LinkState:.......................Active", "PhysLinkState:...................LinkUp"]
    assert out[4] == f"Lid:.............................{hw.hcas[0].lid}"


def test_disable_takes_the_port_down_where_ibstat_reads_and_on_brings_it_back(host, capsys):
    hw, run_dir = host
    assert ibportstate.main(hw, [*ARGS, "disable"], run_dir, euid=0) == 0
    out = capsys.readouterr().out
    assert out.startswith("Initial CA/RT PortInfo:\n") and "\nDisable may be irreversible\n\nAfter PortInfo set:\n" in out
    assert out.rstrip().endswith("ProtectBits:.....................0")
    after = saved(run_dir)
    assert (after.hcas[0].state, after.hcas[0].phys_state) == ("Down", "Disabled")
    assert (after.hcas[1].state, after.hcas[1].phys_state) == ("Active", "LinkUp")  # only the port named
    infiniband.ibstat(after, ["mlx5_0"])
    assert "\t\tState: Down\n\t\tPhysical state: Disabled\n" in capsys.readouterr().out
    assert ibportstate.main(after, [*ARGS, "on"], run_dir, euid=0) == 0
    assert (saved(run_dir).hcas[0].state, saved(run_dir).hcas[0].phys_state) == ("Active", "LinkUp")
    capsys.readouterr()
    assert ibportstate.main(saved(run_dir), [*ARGS, "on"], run_dir, euid=0) == 0  # on an enabled port: nothing set
    assert capsys.readouterr().out.splitlines()[-1] == "Port is already in enable state"


@pytest.mark.parametrize(("args", "euid", "warning"), [
    (ARGS, 1000, "smi_gsi_port_open: Can't open SMI UMAD port (Permission denied) (mlx5_0:1)"),
    (["-C", "mlx5_9", "-P", "1", "-D", "0", "1"], 0, "smi_gsi_port_open: Can't open UMAD port (No such device) "
                                                     "(mlx5_9:1)"),
    (["-C", "mlx5_0", "-P", "2", "-D", "0", "2"], 0, "smi_gsi_port_open: Can't open UMAD port (No such device) "
                                                     "(mlx5_0:2)"),
])
def test_a_port_that_cannot_be_opened_fails_as_libibmad_and_ibexit_print_it(host, capsys, args, euid, warning):
    hw, run_dir = host
    before = (run_dir / "host.json").read_text()
    assert ibportstate.main(hw, [*args, "disable"], run_dir, euid=euid) == 255
    captured = capsys.readouterr()
    ca, port = args[1], args[3]
    assert captured.err.splitlines() == [f"ibwarn: [{os.getpid()}] {warning}",
                                         f"ibwarn: [{os.getpid()}] mad_rpc_open_port2: can't open UMAD port ({ca}:{port})"]
    assert captured.out == f"ibportstate: iberror: failed: Failed to open '{ca}' port '{port}'\n"
    assert (run_dir / "host.json").read_text() == before  # nothing changed


def test_a_roce_port_has_no_subnet_management_interface(tmp_path, capsys):
    hw = resolve("n1", {"gpu_count": 8, "rdma_nics": create.nics("h100-sxm", True)})
    assert ibportstate.main(hw, ARGS, tmp_path, euid=0) == 255
    assert "Can't open SMI UMAD port (Input/output error) (mlx5_0:1)" in capsys.readouterr().err
