"""cpu_cstates through Redfish against local HTTPS BMCs with the four vendors' personalities (sim/redfish_bmc.py:
each keeps current and pending BIOS attributes, serves its attribute registry and answers like its vendor,
including how it fails; its docstring is the behaviour table with the sources). Any 400 loses the whole PATCH,
so a role that sends a wrong name or spelling fails the host.

The role must run every request on the controller (the fake checks the client's mount namespace: a simulated
host's processes have their own), PATCH only what differs, report "reboot pending", send nothing on the second
run, report attributes the BIOS lacks instead of PATCHing them, stop on an unknown vendor naming it, and never
print the BMC password. tests/integration/roles/test_cpu_cstates_redfish.py runs the Redfish step alone against
the stricter platforms (an HGX baseboard among the Systems, a BMC that requires If-Match).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from sim import redfish_bmc
from sim.hosts import create
from sim.redfish_bmc import EXPECTED_PATCH, PASSWORD, PERSONALITIES, USER, FakeBmc
from tests.helpers.provision import ansible_playbook, clusterctl

pytestmark = [pytest.mark.machines(own_net=True), pytest.mark.timeout(1200)]  # site.yml (cpu_cstates only) on four simulated hosts, one BMC vendor each
# The machines' own 127.48.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 48

REPO = Path(__file__).resolve().parents[3]


def _client_socket_inode(tcp_table: str, client_port: int) -> str | None:
    """The inode of the open client socket 127.0.0.1:<client_port> in a /proc/net/tcp table: the port may also
    be on a closed connection in TIME_WAIT (inode 0, owned by no process), before or after the live one."""
    for line in tcp_table.splitlines()[1:]:
        fields = line.split()
        if fields[1] == f"0100007F:{client_port:04X}" and fields[9] != "0":
            return fields[9]
    return None


def test_the_client_socket_is_the_live_one_not_a_closed_connection_on_the_same_port():
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
    live = "   0: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000     0        0 123456 1\n"
    closed = "   1: 0100007F:9C40 0100007F:2382 06 00000000:00000000 03:00000F9E 00000000     0        0 0 3\n"
    assert _client_socket_inode(header + live + closed, 0x9C40) == "123456"
    assert _client_socket_inode(header + closed + live, 0x9C40) == "123456"
    assert _client_socket_inode(header + closed, 0x9C40) is None


def _client_mount_ns(client_port: int) -> str:
    """The mount namespace of the process that owns the client socket 127.0.0.1:<client_port>."""
    inode = _client_socket_inode(Path("/proc/net/tcp").read_text(), client_port)
    if inode is None:
        return "unknown"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return os.readlink(f"/proc/{pid}/ns/mnt")
        except OSError:
            continue
    return "unknown"


# vendor -> (stand-in, the one PATCH a correct role sends)
VENDORS = {vendor: (PERSONALITIES[vendor], EXPECTED_PATCH[vendor]) for vendor in PERSONALITIES}


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    """Four machines: the vendor test gives each its own BMC (one site.yml run for all four vendors, as a
    mixed fleet is provisioned); the other tests run on the first with ``--limit``."""
    inventory = tmp_path_factory.mktemp("redfish") / "inventory"
    create.write(inventory, 4, 1, faults="none", net=NET)  # `virtual create --nodes 4 --racks 1`, on NET
    up = clusterctl("virtual", "up", str(inventory))
    assert up.returncode == 0, up.stderr
    try:
        yield inventory, ("r01n01", "r01n02", "r01n03", "r01n04")
    finally:
        clusterctl("virtual", "down", str(inventory))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmc-tls")
    key, cert = directory / "bmc.key", directory / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def serve(fake: FakeBmc, tls) -> ThreadingHTTPServer:
    """The stand-in on 127.0.0.1, where the mount namespace of each client's socket can be looked up."""
    fake.clients_mount_ns = set()
    fake.on_request = lambda client: fake.clients_mount_ns.add(_client_mount_ns(client[1]))
    return redfish_bmc.serve(fake, str(tls[1]), str(tls[0]), "127.0.0.1")


def run_role(hosts, fake: FakeBmc, tmp_path: Path, **extra) -> tuple[int, str]:
    """site.yml's cpu_cstates on the first machine, its BMC ``fake``."""
    inventory, names = hosts
    path = tmp_path / "bmc-vars.json"
    path.write_text(json.dumps({"cpu_cstates_redfish": True, "bmc_address": fake.address, "bmc_username": USER,
                                "bmc_password": PASSWORD, "bmc_validate_certs": False, **extra}))
    done = ansible_playbook(inventory, "playbooks/site.yml", "--tags", "cpu_cstates", "--limit", names[0],
                            "-e", f"@{path}")
    return done.returncode, done.stdout + done.stderr


def recap(out: str) -> dict[str, str]:
    """host -> its PLAY RECAP line."""
    return {m.group(1): m.group(0) for m in re.finditer(r"^(\S+)\s+: ok=.*$", out, re.MULTILINE)}


def test_redfish_patches_only_what_differs_with_each_vendors_rules(hosts, tls):
    """One run over four hosts, each BMC a different vendor's (its address and credentials in host_vars, as
    an inventory gives them): each gets exactly its vendor's one correct PATCH; the second run sends none."""
    inventory, names = hosts
    host_of = dict(zip(sorted(VENDORS), names, strict=True))
    fakes = {vendor: VENDORS[vendor][0]() for vendor in host_of}
    servers = [serve(fake, tls) for fake in fakes.values()]
    host_vars = inventory / "host_vars"
    host_vars.mkdir(exist_ok=True)
    try:
        for vendor, host in host_of.items():
            (host_vars / f"{host}.yml").write_text(yaml.safe_dump({
                "cpu_cstates_redfish": True, "bmc_address": fakes[vendor].address, "bmc_username": USER,
                "bmc_password": PASSWORD, "bmc_validate_certs": False}))
        first = ansible_playbook(inventory, "playbooks/site.yml", "--tags", "cpu_cstates")
        out = first.stdout + first.stderr
        assert first.returncode == 0, out[-3000:]
        flat = " ".join(out.split())
        for vendor, host in host_of.items():
            fake = fakes[vendor]
            assert fake.rejected == [], (vendor, fake.rejected)
            assert fake.patches == [VENDORS[vendor][1]], (vendor, fake.patches)
            assert f"apply at the next reboot of {host}" in flat, (vendor, flat[-3000:])
            assert fake.unauthorized == 0, vendor
            # Every request came from the controller, none from the node (a simulated host has its own mount ns).
            assert fake.clients_mount_ns == {os.readlink("/proc/self/ns/mnt")}, (vendor, fake.clients_mount_ns)

        second = ansible_playbook(inventory, "playbooks/site.yml", "--tags", "cpu_cstates")
        out2 = second.stdout + second.stderr
        assert second.returncode == 0, out2[-3000:]
        lines = recap(out2)
        for vendor, host in host_of.items():
            assert len(fakes[vendor].patches) == 1, f"{vendor}: the second run must not PATCH again"
            assert "changed=0" in lines[host], (vendor, lines)
            assert f"apply at the next reboot of {host}" in " ".join(out2.split()), vendor  # still pending
        assert PASSWORD not in out + out2
    finally:
        for host in names:
            (host_vars / f"{host}.yml").unlink(missing_ok=True)
        for server in servers:
            server.shutdown()


def test_render_only_stages_no_bios_change_and_reports_what_differs(hosts, tls, tmp_path):
    """Render-only touches nothing that applies at the next boot (playbooks/README.md, "Render only"): no PATCH,
    the differing attributes reported as not staged and no "reboot pending" for them; a normal run stages them."""
    fake = redfish_bmc.dell()
    server = serve(fake, tls)
    try:
        rc, out = run_role(hosts, fake, tmp_path, clusterctl_render_only=True)
        assert rc == 0, out[-3000:]
        assert fake.patches == [], "render-only must not stage BIOS settings"
        flat = " ".join(out.split())
        staged = re.search(r"render only: BIOS C-state attributes (.*?) of \S+ differ; not staged", flat)
        assert staged and set(staged.group(1).split(", ")) == {"SysProfile", "ProcCStates"}, flat[-3000:]
        assert "reboot pending" not in out
        rc2, out2 = run_role(hosts, fake, tmp_path)
        assert rc2 == 0, out2[-3000:]
        assert fake.patches == [VENDORS["dell"][1]]
        assert "reboot pending: BIOS C-state attributes" in " ".join(out2.split())
    finally:
        server.shutdown()


def test_attributes_the_bios_lacks_are_reported_not_patched(hosts, tls, tmp_path):
    fake = redfish_bmc.dell()
    del fake.current["ProcC1E"]  # an older BIOS without the C1E switch
    fake.current["ProcCStates"] = "Disabled"
    fake.current["SysProfile"] = "Custom"
    server = serve(fake, tls)
    try:
        rc, out = run_role(hosts, fake, tmp_path)
        assert rc == 0, out[-3000:]
        assert fake.patches == [], "nothing differs among the attributes this BIOS has"
        assert "has no attribute ProcC1E: not set" in " ".join(out.split())
    finally:
        server.shutdown()


def test_an_unknown_vendor_stops_the_host_naming_it(hosts, tls, tmp_path):
    fake = redfish_bmc.dell()
    fake.manufacturer = "NVIDIA"
    server = serve(fake, tls)
    try:
        rc, out = run_role(hosts, fake, tmp_path)
        assert rc != 0
        assert fake.patches == []
        assert "reports Manufacturer 'NVIDIA', which has no BIOS attribute map" in " ".join(out.split())
        assert PASSWORD not in out
    finally:
        server.shutdown()


def test_every_redfish_request_runs_on_the_controller_throttled():
    """Static companion of the namespace check: every uri task is delegated to localhost and throttled."""
    def walk(tasks):
        for task in tasks:
            yield task
            yield from walk(task.get("block", []))

    tasks = yaml.safe_load((REPO / "roles/cpu_cstates/tasks/redfish.yml").read_text())
    uri_tasks = [t for t in walk(tasks) if "ansible.builtin.uri" in t]
    assert len(uri_tasks) >= 8
    for task in uri_tasks:
        assert task.get("delegate_to") == "localhost", task["name"]
        assert re.fullmatch(r"\{\{ cpu_cstates_redfish_throttle \}\}", str(task.get("throttle"))), task["name"]
        assert task.get("no_log") is True, task["name"]
        assert task.get("become") is False, task["name"]  # the play's sudo is for the node, not the controller
