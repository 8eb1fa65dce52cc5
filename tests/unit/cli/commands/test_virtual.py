"""`clusterctl virtual` (cli/commands/virtual.py) as a user types it: `-i DIR` and the older positional form,
no discarding of a provisioned cluster, `down` where nothing was brought up (nothing is booted here)."""

from __future__ import annotations

import pytest

from tests.helpers.cli import one_line, stamp_provisioned

pytestmark = pytest.mark.unit


def test_virtual_takes_dash_i_and_the_positional_form_still_works(clusterctl, tmp_path):
    code, out, err = clusterctl("virtual", "create", "-i", str(tmp_path / "a"), "--faults", "none")
    assert code == 0 and err == ""
    assert out.splitlines() == [f"{tmp_path / 'a'}: 4 nodes in 2 racks (h100-sxm, ib); no injected faults",
                                f"next: clusterctl virtual up -i {tmp_path / 'a'}"]
    code, out, err = clusterctl("virtual", "create", str(tmp_path / "b"), "--nodes", "1", "--racks", "1")
    assert code == 0 and "1 node in 1 rack" in out
    assert (tmp_path / "b" / "hosts.yml").read_text().startswith(
        "# A virtual inventory: 1 node of 8x h100-sxm in 1 rack (InfiniBand).\n")  # not "1 rack(s) x 1 node(s)"
    assert err.strip() == f"note: the positional inventory is deprecated; use -i {tmp_path / 'b'}"
    code, _, err = clusterctl("virtual", "status")
    assert code == 2 and "missing -i/--inventory DIR" in err


def test_virtual_up_refuses_to_discard_a_provisioned_cluster(clusterctl, brought_up_inventory, tmp_path, monkeypatch):
    import shutil
    from datetime import datetime

    from sim.hosts import lifecycle, run_state
    from sim.hosts.machines import MachineState

    monkeypatch.chdir(tmp_path)
    ups = []
    running = {"r01n01": "running", "r01n02": "stopped"}

    def fresh_machines(inv, limit, secrets):  # `up` recreates every machine's overlay, as prepare_host does
        ups.append(inv)
        shutil.rmtree(lifecycle.layout(inv).machines_dir, ignore_errors=True)
        return lifecycle.UpResult(list(running), [], 0.1)

    monkeypatch.setattr(lifecycle, "status", lambda inv: [MachineState(h, s, [], "127.0.1.11") for h, s in running.items()])
    monkeypatch.setattr(lifecycle, "up", fresh_machines)
    assert clusterctl("virtual", "up", "-i", str(brought_up_inventory))[0] == 0  # never provisioned: fine
    stamp_provisioned(brought_up_inventory, "r01n02")
    assert clusterctl("virtual", "up", "-i", str(brought_up_inventory))[0] == 0  # provisioned, but not running
    stamp_provisioned(brought_up_inventory, "r01n01", when=1_700_000_000)
    code, _, err = clusterctl("virtual", "up", "-i", str(brought_up_inventory))
    assert code == 2 and len(ups) == 2
    line = one_line(err)
    when = datetime.fromtimestamp(1_700_000_000).strftime("%H:%M:%S")
    assert f"1 machine up and provisioned at {when}" in line and "add --reset" in line
    code, out, _ = clusterctl("virtual", "status", "-i", str(brought_up_inventory))
    assert code == 0 and out.splitlines()[0].split()[2:] == ["running", "healthy", "provisioned", when]
    assert out.splitlines()[1].split()[2:] == ["stopped", "healthy"]
    code, out, _ = clusterctl("virtual", "up", "-i", str(brought_up_inventory), "--reset")
    assert code == 0 and len(ups) == 3 and "next: clusterctl provision" in out
    assert run_state.provisioned(lifecycle.layout(brought_up_inventory)) == {}  # fresh hosts: nothing to lose again


def test_the_written_inventory_names_the_dash_i_form(virtual_inventory):
    assert "`clusterctl virtual up -i DIR` creates the simulated hosts." in (virtual_inventory / "hosts.yml").read_text()


def test_virtual_down_where_nothing_was_brought_up_says_so(clusterctl, tmp_path):
    code, out, err = clusterctl("virtual", "down", "-i", str(tmp_path))
    assert code == 0 and err == ""  # idempotent: nothing up is not an error
    assert one_line(out) == (f"{tmp_path}: no simulated machines here (nothing was brought up with "
                             f"`clusterctl virtual up -i {tmp_path}`); nothing to stop")
