"""cpu_cstates' Redfish step (roles/cpu_cstates/tasks/redfish.yml) run by ansible-playbook against the stand-in
BMCs of sim/redfish_bmc.py, as strict as the vendors': the host's System found among an HGX baseboard's, every
value checked against the BIOS's own attribute registry before anything is PATCHed, and the PATCH conditional
on the settings object's ETag. The hosts are local connections (the step runs on the controller anyway); the
whole role on simulated machines is tests/machines/provision/test_redfish.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sim import redfish_bmc
from sim.redfish_bmc import EXPECTED_PATCH, PASSWORD, PERSONALITIES, USER, FakeBmc
from tests.helpers import REPO

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmc-tls")
    key, cert = directory / "bmc.key", directory / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=bmc.test", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def start(fakes: dict[str, FakeBmc], tls, first: int) -> list:
    """Serve each stand-in on its own 127.0.76.N, N from ``first`` on."""
    return [redfish_bmc.serve(fake, *tls, f"127.0.76.{first + n}") for n, fake in enumerate(fakes.values())]


def stop(servers: list) -> None:
    for server in servers:
        server.shutdown()
        server.server_close()


def run_step(tmp_path: Path, fakes: dict[str, FakeBmc], host_vars: dict[str, dict] | None = None) -> tuple[int, str]:
    """The Redfish step for one host per BMC (host name -> its BMC, and its own variables); returns the exit
    status and the output on one line."""
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Redfish step", "ansible.builtin.include_role": {"name": "cpu_cstates", "tasks_from": "redfish"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    hosts = {host: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "cpu_cstates_redfish": True, "bmc_address": fake.address, "bmc_username": USER,
                    "bmc_password": PASSWORD, "bmc_validate_certs": False, **(host_vars or {}).get(host, {})}
             for host, fake in fakes.items()}
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.json"),
                           str(tmp_path / "play.yml")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert PASSWORD not in out
    return done.returncode, " ".join(out.split())


def recap(flat: str, host: str) -> str:
    found = re.search(rf"\b{host} : ok=\S+ changed=\S+ unreachable=\S+ failed=\S+", flat)
    assert found, flat[-2000:]
    return found.group(0)


def two_systems_with_a_bios() -> FakeBmc:
    fake = redfish_bmc.dell()
    fake.other_systems = [{"@odata.id": "/redfish/v1/Systems/System.Embedded.2", "Manufacturer": "Dell Inc.",
                           "Bios": {"@odata.id": "/redfish/v1/Systems/System.Embedded.2/Bios"}}]
    return fake


def baseboard_only() -> FakeBmc:
    fake = redfish_bmc.behind_hgx_baseboard(redfish_bmc.dell())
    fake.system_has_bios = False  # a BMC that manages only the GPU baseboard, or a System link misconfigured
    return fake


@pytest.fixture(scope="module")
def strict(tls, tmp_path_factory):
    """One run over hosts whose BMCs are the stricter platforms, each host its own case."""
    fakes = {
        "hgx-dell": redfish_bmc.behind_hgx_baseboard(redfish_bmc.dell()),
        "hgx-lenovo": redfish_bmc.behind_hgx_baseboard(redfish_bmc.lenovo()),
        "ami-lenovo": redfish_bmc.requiring_if_match(redfish_bmc.lenovo(), 428),
        "ibmc-dell": redfish_bmc.requiring_if_match(redfish_bmc.dell(), 412),
        "baseboard-only": baseboard_only(),
        "two-systems": two_systems_with_a_bios(),
        "two-systems-named": two_systems_with_a_bios(),
        "setup-spelling": redfish_bmc.lenovo(),
    }
    host_vars = {
        "two-systems-named": {"bmc_system_id": "System.Embedded.1"},
        "setup-spelling": {"cpu_cstates_redfish_attributes": {"lenovo": {
            "OperatingModes_ChooseOperatingMode": "Custom Mode", "Processors_CStates": ["Disabled", "Disable"]}}},
    }
    servers = start(fakes, tls, 21)
    try:
        rc, out = run_step(tmp_path_factory.mktemp("strict"), fakes, host_vars)
        assert rc != 0  # the hosts that must stop did
        yield fakes, out
    finally:
        stop(servers)


def test_each_vendor_gets_its_one_correct_patch_conditional_on_the_etag_and_none_on_the_second_run(tmp_path, tls):
    fakes = {f"{vendor}-node": make() for vendor, make in sorted(PERSONALITIES.items())}
    servers = start(fakes, tls, 11)
    try:
        rc, out = run_step(tmp_path, fakes)
        assert rc == 0, out[-3000:]
        for host, fake in fakes.items():
            vendor = host.removesuffix("-node")
            assert fake.rejected == [], (vendor, fake.rejected)
            assert fake.patches == [EXPECTED_PATCH[vendor]], (vendor, fake.patches)
            assert fake.if_match_seen == ['"00000001"'], (vendor, fake.if_match_seen)  # the ETag the GET returned
            assert f"apply at the next reboot of {host}" in out, vendor
        rc2, out2 = run_step(tmp_path, fakes)
        assert rc2 == 0, out2[-3000:]
        for host, fake in fakes.items():
            assert len(fake.patches) == 1, f"{host}: the second run must not PATCH again"
            assert "changed=0" in recap(out2, host)
    finally:
        stop(servers)


@pytest.mark.parametrize("host", ["hgx-dell", "hgx-lenovo"])
def test_behind_an_hgx_baseboard_listed_first_the_system_with_a_bios_is_the_hosts(strict, host):
    fakes, out = strict
    assert "failed=0" in recap(out, host)
    assert fakes[host].patches == [EXPECTED_PATCH[host.removeprefix("hgx-")]]


def test_no_system_with_a_bios_stops_the_host_naming_the_bmc_and_the_members(strict):
    fakes, out = strict
    fake = fakes["baseboard-only"]
    assert fake.patches == [] and "failed=1" in recap(out, "baseboard-only")
    assert (f"baseboard-only: no System of BMC {fake.address} has a Bios link (members: "
            "/redfish/v1/Systems/HGX_Baseboard_0, /redfish/v1/Systems/System.Embedded.1)") in out, out[-3000:]


def test_several_systems_with_a_bios_stop_the_host_unless_the_inventory_names_one(strict):
    fakes, out = strict
    fake = fakes["two-systems"]
    assert fake.patches == [] and "failed=1" in recap(out, "two-systems")
    assert (f"two-systems: 2 Systems of BMC {fake.address} have a Bios link (/redfish/v1/Systems/System.Embedded.2, "
            "/redfish/v1/Systems/System.Embedded.1): set cpu_cstates_bmc.system") in out, out[-3000:]
    assert "failed=0" in recap(out, "two-systems-named")
    assert fakes["two-systems-named"].patches == [EXPECTED_PATCH["dell"]]


@pytest.mark.parametrize("host", ["ami-lenovo", "ibmc-dell"])
def test_a_bmc_that_requires_if_match_gets_the_settings_etag(strict, host):
    fakes, out = strict
    fake = fakes[host]
    assert "failed=0" in recap(out, host)
    assert fake.rejected == [] and fake.if_match_seen == ['W/"00000001"']
    assert fake.patches == [EXPECTED_PATCH[host.split("-")[1]]]


def test_a_value_the_bios_registry_does_not_list_is_never_patched(strict):
    fakes, out = strict
    fake = fakes["setup-spelling"]
    assert "failed=1" in recap(out, "setup-spelling")
    assert fake.patches == [], "nothing is PATCHed while one wanted value is unknown to the BIOS"
    assert (f"setup-spelling: the BIOS attribute registry of BMC {fake.address} has no value Custom Mode for "
            "OperatingModes_ChooseOperatingMode (its values: MaximumEfficiency, MaximumPerformance, CustomMode)") in out, out[-3000:]
