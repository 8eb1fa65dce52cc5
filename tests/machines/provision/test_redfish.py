"""cpu_cstates' Redfish step on a simulated host, through site.yml over SSH, against a local HTTPS BMC
(sim/redfish_bmc.py): every request runs on the controller, none on the node. BMCs sit on an out-of-band
network the node's OS normally cannot reach, and the BMC password must never go to the node. The stand-in
records the mount namespace of each request's client: a simulated host's processes have their own, and the
machines share this host's network, so the node could reach the BMC if a task ran there.

What the step sends, for each vendor and each stricter platform, is tests/integration/roles/
test_cpu_cstates_redfish.py (local connections, one play); that every uri task is delegated and throttled is
tests/unit/roles/cpu_cstates/test_redfish_tasks.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sim import redfish_bmc
from sim.hosts import create
from sim.redfish_bmc import EXPECTED_PATCH, PASSWORD, PERSONALITIES, USER
from tests.helpers.provision import ansible_playbook, clusterctl

pytestmark = [pytest.mark.machines(own_net=True), pytest.mark.timeout(1200)]  # site.yml (cpu_cstates only) on one simulated host
# The machines' own 127.48.R.N (tests/conftest.py): this module runs beside the machine chain, not in it.
NET = 48


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


VENDOR = "supermicro"  # any: every vendor's requests come from the same tasks


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    """One machine (``virtual create --nodes 1 --racks 1``, on NET)."""
    inventory = tmp_path_factory.mktemp("redfish") / "inventory"
    create.write(inventory, 1, 1, faults="none", net=NET)
    up = clusterctl("virtual", "up", str(inventory))
    assert up.returncode == 0, up.stderr
    try:
        yield inventory
    finally:
        clusterctl("virtual", "down", str(inventory))


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmc-tls")
    key, cert = directory / "bmc.key", directory / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


def test_every_redfish_request_leaves_from_the_controller_not_the_node(host, tls, tmp_path):
    fake = PERSONALITIES[VENDOR]()
    fake.clients_mount_ns = set()
    fake.on_request = lambda client: fake.clients_mount_ns.add(_client_mount_ns(client[1]))
    # On 127.0.0.1, where the mount namespace of each client's socket can be looked up.
    server = redfish_bmc.serve(fake, str(tls[1]), str(tls[0]), "127.0.0.1")
    bmc_vars = tmp_path / "bmc-vars.json"
    bmc_vars.write_text(json.dumps({"cpu_cstates_redfish": True, "bmc_address": fake.address, "bmc_username": USER,
                                    "bmc_password": PASSWORD, "bmc_validate_certs": False}))
    try:
        done = ansible_playbook(host, "playbooks/site.yml", "--tags", "cpu_cstates", "-e", f"@{bmc_vars}")
        out = done.stdout + done.stderr
        assert done.returncode == 0, out[-3000:]
        # The write among them: a PATCH sent from the node would add the node's namespace.
        assert fake.patches == [EXPECTED_PATCH[VENDOR]], fake.patches
        assert fake.clients_mount_ns == {os.readlink("/proc/self/ns/mnt")}, fake.clients_mount_ns
    finally:
        server.shutdown()
        server.server_close()
