"""The stand-in BMCs answer like the vendors' (sim/redfish_bmc.py's behaviour table), over plain HTTP on loopback."""

from __future__ import annotations

import base64
import json
import threading
import urllib.error
import urllib.request
from http.server import ThreadingHTTPServer

import pytest

from sim import redfish_bmc
from sim.redfish_bmc import PASSWORD, USER, FakeBmc

pytestmark = pytest.mark.unit

AUTH = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()


class Client:
    def __init__(self, fake: FakeBmc):
        self.httpd = ThreadingHTTPServer(("127.0.76.2", 0), fake.handler())
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        self.base = f"http://127.0.76.2:{self.httpd.server_address[1]}"

    def request(self, method: str, path: str, body: dict | None = None, **headers: str) -> tuple[int, dict, dict]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Authorization": AUTH, "Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(request, timeout=5) as answer:
                return answer.status, dict(answer.headers), json.loads(answer.read() or b"{}")
        except urllib.error.HTTPError as error:
            return error.code, dict(error.headers), json.loads(error.read() or b"{}")


@pytest.fixture
def client():
    clients = []

    def make(fake: FakeBmc) -> Client:
        clients.append(Client(fake))
        return clients[-1]

    yield make
    for c in clients:
        c.httpd.shutdown()
        c.httpd.server_close()


def test_an_hgx_bmc_lists_the_gpu_baseboard_first_without_a_bios(client):
    c = client(redfish_bmc.behind_hgx_baseboard(redfish_bmc.dell()))
    _, _, systems = c.request("GET", "/redfish/v1/Systems")
    first, host = (m["@odata.id"] for m in systems["Members"])
    assert first == "/redfish/v1/Systems/HGX_Baseboard_0"
    _, _, baseboard = c.request("GET", first)
    assert baseboard["Manufacturer"] == "NVIDIA" and "Bios" not in baseboard
    assert "Bios" in c.request("GET", host)[2]


def test_the_bios_registry_is_found_through_registries_and_lists_lenovos_value_names(client):
    fake = redfish_bmc.lenovo()
    c = client(fake)
    bios = c.request("GET", fake.bios)[2]
    members = [m["@odata.id"] for m in c.request("GET", "/redfish/v1/Registries")[2]["Members"]]
    entry = c.request("GET", next(m for m in members if bios["AttributeRegistry"] in m))[2]
    registry = c.request("GET", entry["Location"][0]["Uri"])[2]
    values = {a["AttributeName"]: [v["ValueName"] for v in a["Value"]] for a in registry["RegistryEntries"]["Attributes"]}
    assert "CustomMode" in values["OperatingModes_ChooseOperatingMode"]
    assert "Custom Mode" not in values["OperatingModes_ChooseOperatingMode"]


def test_lenovo_refuses_the_setup_display_name_with_400_and_loses_the_whole_patch(client):
    fake = redfish_bmc.lenovo()
    c = client(fake)
    status, _, body = c.request("PATCH", fake.settings, {"Attributes": {
        "OperatingModes_ChooseOperatingMode": "Custom Mode", "Processors_CStates": "Disable"}})
    assert status == 400 and "PropertyValueNotInList" in body["error"]["code"]
    assert fake.pending == {}
    assert c.request("PATCH", fake.settings, {"Attributes": {"OperatingModes_ChooseOperatingMode": "CustomMode"}})[0] == 202


@pytest.mark.parametrize("missing_status", [428, 412])
def test_a_bmc_requiring_if_match_refuses_a_patch_without_it_or_with_a_stale_etag(client, missing_status):
    fake = redfish_bmc.requiring_if_match(redfish_bmc.lenovo(), missing_status)
    c = client(fake)
    patch = {"Attributes": {"OperatingModes_ChooseOperatingMode": "CustomMode"}}
    _, headers, settings = c.request("GET", fake.settings)
    etag = headers["ETag"]
    assert etag == settings["@odata.etag"] and etag.startswith('W/"')
    assert c.request("PATCH", fake.settings, patch)[0] == missing_status
    assert c.request("PATCH", fake.settings, patch, **{"If-Match": 'W/"stale"'})[0] == 412
    assert fake.pending == {}
    assert c.request("PATCH", fake.settings, patch, **{"If-Match": etag})[0] == 202
    assert c.request("GET", fake.settings)[1]["ETag"] != etag  # every accepted PATCH makes a new ETag
    assert c.request("PATCH", fake.settings, patch, **{"If-Match": etag})[0] == 412


def test_an_if_match_is_checked_even_where_it_is_optional(client):
    fake = redfish_bmc.dell()
    c = client(fake)
    patch = {"Attributes": {"SysProfile": "Custom"}, "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"}}
    assert c.request("PATCH", fake.settings, patch, **{"If-Match": '"0000beef"'})[0] == 412
    assert c.request("PATCH", fake.settings, patch)[0] == 202


def test_wrong_credentials_are_a_401(client):
    fake = redfish_bmc.hpe()
    c = client(fake)
    assert c.request("GET", fake.system, Authorization="Basic " + base64.b64encode(b"root:wrong").decode())[0] == 401
    assert fake.unauthorized == 1
