"""cpu_cstates through Redfish against a local HTTPS BMC that behaves like iDRAC's BIOS resources.

The fake keeps current and pending BIOS attributes; a PATCH to the settings object updates the pending
ones. The role must PATCH only the attributes whose next-boot value differs, report "reboot pending",
send nothing on the second run, and never print the BMC password.
"""

from __future__ import annotations

import base64
import json
import ssl
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.provision.conftest import ansible_playbook, clusterctl

pytestmark = pytest.mark.timeout(900)  # two site.yml runs (cpu_cstates only) on one simulated host

USER, PASSWORD = "root", "bmc-Pa55-word-for-test"


class FakeIdrac:
    def __init__(self):
        self.current = {"SysProfile": "PerfPerWattOptimizedDapc", "ProcCStates": "Enabled", "ProcC1E": "Disabled",
                        "LogicalProc": "Enabled"}
        self.pending: dict[str, str] = {}
        self.patches: list[dict] = []
        self.unauthorized = 0

    def handler(self):
        bmc = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _authorized(self) -> bool:
                expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    bmc.unauthorized += 1
                    self.send_response(401)
                    self.end_headers()
                    return False
                return True

            def _json(self, body: dict, status: int = 200) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if not self._authorized():
                    return
                routes = {
                    "/redfish/v1/Systems": {"Members": [{"@odata.id": "/redfish/v1/Systems/System.Embedded.1"}]},
                    "/redfish/v1/Systems/System.Embedded.1": {"Manufacturer": "Dell Inc.", "Model": "PowerEdge XE9680"},
                    "/redfish/v1/Systems/System.Embedded.1/Bios": {
                        "Attributes": bmc.current,
                        "@Redfish.Settings": {"SettingsObject": {
                            "@odata.id": "/redfish/v1/Systems/System.Embedded.1/Bios/Settings"}},
                    },
                    "/redfish/v1/Systems/System.Embedded.1/Bios/Settings": {"Attributes": bmc.pending},
                }
                if self.path in routes:
                    self._json(routes[self.path])
                else:
                    self._json({"error": "not found"}, 404)

            def do_PATCH(self):
                if not self._authorized():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path != "/redfish/v1/Systems/System.Embedded.1/Bios/Settings":
                    self._json({"error": "not found"}, 404)
                    return
                bmc.patches.append(body)
                bmc.pending.update(body["Attributes"])
                self._json({}, 202)

        return Handler


@pytest.fixture(scope="module")
def one_host(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("redfish") / "inventory"
    assert clusterctl("virtual", "create", str(inventory), "--nodes", "1", "--racks", "1", "--faults", "none").returncode == 0
    up = clusterctl("virtual", "up", str(inventory))
    assert up.returncode == 0, up.stderr
    try:
        yield inventory
    finally:
        clusterctl("virtual", "down", str(inventory))


@pytest.fixture
def bmc(tmp_path):
    key, cert = tmp_path / "bmc.key", tmp_path / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    fake = FakeIdrac()
    server = ThreadingHTTPServer(("127.0.0.1", 0), fake.handler())
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    fake.address = f"127.0.0.1:{server.server_address[1]}"
    try:
        yield fake
    finally:
        server.shutdown()


def test_redfish_patches_only_what_differs_and_reports_reboot_pending(one_host, bmc, tmp_path):
    extra = tmp_path / "bmc-vars.json"
    extra.write_text(json.dumps({
        "cpu_cstates_redfish": True, "bmc_address": bmc.address, "bmc_username": USER, "bmc_password": PASSWORD,
        "bmc_validate_certs": False,
    }))
    first = ansible_playbook(one_host, "playbooks/site.yml", "--tags", "cpu_cstates", "-e", f"@{extra}")
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-3000:]
    assert bmc.patches == [{"Attributes": {"SysProfile": "Custom", "ProcCStates": "Disabled"},
                            "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}]
    assert "reboot pending: BIOS C-state attributes SysProfile, ProcCStates apply at the next reboot" in " ".join(out.split())
    assert bmc.unauthorized == 0

    second = ansible_playbook(one_host, "playbooks/site.yml", "--tags", "cpu_cstates", "-e", f"@{extra}")
    out2 = second.stdout + second.stderr
    assert second.returncode == 0, out2[-3000:]
    assert len(bmc.patches) == 1, "second run must not PATCH again"
    assert "reboot pending" in out2 and "changed=0" in out2
    assert PASSWORD not in out + out2
