"""End to end: `clusterctl preflight -i <virtual inventory>` on simulated hosts with a Consul dev server:
the table, --json, --junit, exit codes, --release, history and diff, and the usage/inventory errors that
stop a run before any host is contacted. Every check runs, numa_pinning included (the fixture writes the
vllm-iu units the way provisioning does; the simulated `systemctl show` reads them back)."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest
import yaml

from cluster import load_cluster
from tests.helpers import run_cli
from tests.helpers.preflight import VirtualInventory
from tests.integration.preflight.test_release import register

pytestmark = pytest.mark.machines(own_net=True)
# The machines' own 127.46.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 46


@pytest.fixture
def virtual_copy(tmp_path, consul_addr):
    """`virtual create --nodes 4 --racks 2` pointed at the dev Consul, every IU registered in maintenance,
    its vllm-iu unit pinned to its NUMA node and DCGM's host engine running (what provisioning leaves behind)."""
    inv = VirtualInventory(
        tmp_path / "virtual", nodes=4, racks=2, group_vars={"consul_http_addr": consul_addr}, net=NET
    )
    inv.up()
    try:
        nodes = list(load_cluster(inv.root).nodes())
        for n in nodes:
            inv.install_iu_units(n.name, {iu.index: iu.numa_node for iu in n.ius})
            inv.install_dcgm(n.name)
        clients = [register(consul_addr, n) for n in nodes]
        yield inv, clients[0]
    finally:
        inv.down()


def maintenance(client) -> set[str]:
    _, names = client.catalog.services()
    entries = [e for name in names if name.startswith("vllm-iu-") for e in client.health.service(name)[1]]
    return {
        e["Service"]["ID"]
        for e in entries
        for ch in e["Checks"]
        if ch["CheckID"].startswith("_service_maintenance:")
    }


def test_preflight_of_the_virtual_inventory(virtual_copy, tmp_path, capsys):
    inv, consul = virtual_copy
    state = tmp_path / "state"
    assert len(maintenance(consul)) == 8
    code, out, _ = run_cli(
        capsys,
        "preflight",
        "-i",
        str(inv.root),
        "--timeout",
        "30",
        "--json",
        str(tmp_path / "run.json"),
        "--junit",
        str(tmp_path / "junit.xml"),
        "--state-dir",
        str(state),
        "--release",
    )
    document = json.loads((tmp_path / "run.json").read_text())
    bad = [
        (r["node"], r["check"], r["reason"])
        for r in document["results"]
        if r["verdict"] not in ("PASS", "SKIP")
    ]
    assert bad == [] and code == 0
    for name in ("r01n01", "r01n02", "r02n01", "r02n02"):
        assert name in out
    assert "exit code 0: every check passed" in out and "every check passed on 4 nodes" in out
    summary = document["summary"]
    assert (summary["nodes"], summary["nodes_passed"], summary["exit_code"]) == (4, 4, 0)
    assert sorted(summary["released"]) == ["r01n01", "r01n02", "r02n01", "r02n02"]
    assert maintenance(consul) == set()
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.get("tests") == str(len(document["results"])) and root.get("failures") == "0"
    assert {s.get("name") for s in root.iter("testsuite")} == {"rack r01", "rack r02"}

    # A fault appears on r02n01: the next run fails it, history lists both runs, diff shows what changed.
    host_vars = inv.root / "host_vars"
    host_vars.mkdir(exist_ok=True)
    (host_vars / "r02n01.yml").write_text("sim_faults: [{kind: clock_offset, offset_us: 4000}]\n")
    inv.up()
    code, out, _ = run_cli(
        capsys,
        "preflight",
        "-i",
        str(inv.root),
        "--checks",
        "time_sync,gpu_health",
        "--state-dir",
        str(state),
        "--timeout",
        "30",
    )
    assert code == 1 and "clock 4.000 ms fast of NTP" in out and "1 failed (r02n01)" in out
    assert "FAIL r02n01 - time_sync " in out  # the greppable fault line
    code, out, _ = run_cli(capsys, "preflight", "history", "--state-dir", str(state), "--json")
    runs = json.loads(out)
    assert code == 0 and [r["exit_code"] for r in runs] == [0, 1]
    code, out, _ = run_cli(
        capsys, "preflight", "diff", "previous", "latest", "--state-dir", str(state), "--json"
    )
    diff = json.loads(out)
    changes = {(c["node"], c["check"], c["change"]) for c in diff["changes"]}
    assert code == 1  # a regression
    assert ("r02n01", "time_sync", "regression") in changes
    assert "nccl" in diff["only_in_from"]["checks"]  # the second run checked less: not a change
    assert not any(c[1] == "nccl" for c in changes)
    assert not any(c[0] != "r02n01" and c[2] == "regression" for c in changes)
    code, out, _ = run_cli(
        capsys, "preflight", "diff", runs[0]["id"], runs[1]["id"], "--state-dir", str(state)
    )
    assert code == 1 and "r02n01" in out and "FAIL" in out and "the runs cover different nodes/checks" in out


def test_strict_turns_warnings_into_failure(tmp_path, capsys):
    # 2-GPU IUs: the profile has no 2-GPU floor, so each IU's nccl result is NCCL_NO_THRESHOLD (WARN).
    inv = VirtualInventory(tmp_path / "virtual", nodes=1, racks=1, host_vars={"r01n01": {"iu_size": 2}}, net=NET)
    inv.up()
    try:
        args = [
            "preflight",
            "-i",
            str(inv.root),
            "--checks",
            "nccl",
            "--state-dir",
            str(tmp_path),
            "--timeout",
            "30",
            "--json",
            str(tmp_path / "run.json"),
        ]
        code, out, _ = run_cli(capsys, *args)
        warned = [
            r for r in json.loads((tmp_path / "run.json").read_text())["results"] if r["verdict"] == "WARN"
        ]
        assert code == 0 and "WARN" in out
        assert [r["evidence"]["code"] for r in warned] == ["NCCL_NO_THRESHOLD"] * 4
        code, _, _ = run_cli(capsys, *args, "--strict")
        assert code == 1
    finally:
        inv.down()


def test_inventory_and_usage_errors_exit_2_before_any_host_is_contacted(tmp_path, capsys):
    import socket

    # The hosts' "sshd"s: listening sockets on loopback; a connection to one would be a contacted host.
    sshds = []
    for address in ("127.0.0.1", "127.0.0.2"):
        sshd = socket.socket()
        sshd.bind((address, 0))
        sshd.listen()
        sshd.setblocking(False)
        sshds.append(sshd)

    class Touched:
        def exists(self) -> bool:
            for sshd in sshds:
                try:
                    sshd.accept()[0].close()
                    return True
                except BlockingIOError:
                    continue
            return False

    touched = Touched()

    def reach(index: int) -> dict:
        address, port = sshds[index].getsockname()
        return {"ansible_host": address, "ansible_port": port}

    inventory = tmp_path / "hosts.yml"
    inventory.write_text(
        yaml.safe_dump(
            {
                "all": {
                    "hosts": {
                        "good": {"rack": "r1", "gpu_model": "h100-sxm", **reach(0)},
                        "broken": {"rack": "r1", "gpu_model": "h100-sxm", "iu_size": 3, **reach(1)},
                    }
                }
            }
        )
    )
    code, _, err = run_cli(capsys, "preflight", "-i", str(inventory), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "iu_size" in err and not touched.exists()
    code, _, err = run_cli(capsys, "preflight", "-i", str(inventory), "--limit", "good", "--checks", "nope")
    assert code == 2 and "--checks: unknown check 'nope'" in err
    bad_profile = yaml.safe_load(inventory.read_text())
    bad_profile["all"]["hosts"]["broken"]["iu_size"] = 4
    bad_profile["all"]["hosts"]["broken"]["preflight_overrides"] = {"ib": {"write_lat_max_us": 0}}
    inventory.write_text(yaml.safe_dump(bad_profile))
    code, _, err = run_cli(capsys, "preflight", "-i", str(inventory), "--state-dir", str(tmp_path / "s"))
    assert code == 2 and "broken: preflight_overrides: ib.write_lat_max_us" in err and not touched.exists()
    code, _, err = run_cli(capsys, "preflight")
    assert code == 2 and "missing -i/--inventory" in err
    code, _, err = run_cli(
        capsys, "preflight", "-i", str(inventory), "--json", str(tmp_path / "no" / "run.json")
    )
    assert code == 2 and "does not exist" in err and not touched.exists()
    code, out, _ = run_cli(capsys, "preflight", "history", "--state-dir", str(tmp_path / "none"))
    assert code == 0 and "no runs saved" in out
    for sshd in sshds:
        sshd.close()
