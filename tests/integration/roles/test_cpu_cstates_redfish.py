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

ADDRESSES = [f"127.0.76.{n}" for n in range(11, 15)]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmc-tls")
    key, cert = directory / "bmc.key", directory / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=bmc.test", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


@pytest.fixture
def bmcs(tls):
    """Start stand-ins: ``start(fake, ...)`` serves each on its own 127.0.76.N; all stop after the test."""
    servers = []

    def start(*fakes: FakeBmc) -> tuple[FakeBmc, ...]:
        for fake in fakes:
            servers.append(redfish_bmc.serve(fake, *tls, ADDRESSES[len(servers)]))
        return fakes

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def run_step(tmp_path: Path, fakes: dict[str, FakeBmc], **extra) -> tuple[int, str]:
    """The Redfish step for one host per BMC (host name -> its BMC); returns the exit status and the output."""
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Redfish step", "ansible.builtin.include_role": {"name": "cpu_cstates", "tasks_from": "redfish"}}]}]
    (tmp_path / "play.yml").write_text(yaml.safe_dump(play))
    hosts = {host: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "cpu_cstates_redfish": True, "bmc_address": fake.address, "bmc_username": USER,
                    "bmc_password": PASSWORD, "bmc_validate_certs": False} for host, fake in fakes.items()}
    (tmp_path / "inventory.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    (tmp_path / "extra.json").write_text(json.dumps(extra))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(tmp_path / "inventory.json"),
                           str(tmp_path / "play.yml"), "-e", f"@{tmp_path / 'extra.json'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert PASSWORD not in out
    return done.returncode, " ".join(out.split())


def recap(flat: str, host: str) -> str:
    found = re.search(rf"\b{host} : ok=\S+ changed=\S+ unreachable=\S+ failed=\S+", flat)
    assert found, flat[-2000:]
    return found.group(0)


def test_each_vendor_gets_its_one_correct_patch_conditional_on_the_etag_and_none_on_the_second_run(tmp_path, bmcs):
    fakes = {f"{vendor}-node": make() for vendor, make in sorted(PERSONALITIES.items())}
    bmcs(*fakes.values())
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


@pytest.mark.parametrize("vendor", ["dell", "lenovo"])
def test_behind_an_hgx_baseboard_listed_first_the_system_with_a_bios_is_the_hosts(tmp_path, bmcs, vendor):
    fake = redfish_bmc.behind_hgx_baseboard(PERSONALITIES[vendor]())
    bmcs(fake)
    rc, out = run_step(tmp_path, {"node": fake})
    assert rc == 0, out[-3000:]
    assert fake.patches == [EXPECTED_PATCH[vendor]]


def test_no_system_with_a_bios_stops_the_host_naming_the_bmc_and_the_members(tmp_path, bmcs):
    fake = redfish_bmc.behind_hgx_baseboard(redfish_bmc.dell())
    fake.system_has_bios = False  # a BMC that manages only the GPU baseboard, or a System link misconfigured
    bmcs(fake)
    rc, out = run_step(tmp_path, {"node": fake})
    assert rc != 0 and fake.patches == []
    assert (f"node: no System of BMC {fake.address} has a Bios link (members: /redfish/v1/Systems/HGX_Baseboard_0, "
            "/redfish/v1/Systems/System.Embedded.1)") in out, out[-3000:]


def test_several_systems_with_a_bios_stop_the_host_unless_the_inventory_names_one(tmp_path, bmcs):
    fake = redfish_bmc.dell()
    fake.other_systems = [{"@odata.id": "/redfish/v1/Systems/System.Embedded.2", "Manufacturer": "Dell Inc.",
                           "Bios": {"@odata.id": "/redfish/v1/Systems/System.Embedded.2/Bios"}}]
    bmcs(fake)
    rc, out = run_step(tmp_path, {"node": fake})
    assert rc != 0 and fake.patches == []
    assert (f"node: 2 Systems of BMC {fake.address} have a Bios link (/redfish/v1/Systems/System.Embedded.2, "
            "/redfish/v1/Systems/System.Embedded.1): set cpu_cstates_bmc.system") in out, out[-3000:]
    rc2, out2 = run_step(tmp_path, {"node": fake}, bmc_system_id="System.Embedded.1")
    assert rc2 == 0, out2[-3000:]
    assert fake.patches == [EXPECTED_PATCH["dell"]]


@pytest.mark.parametrize("missing_status", [428, 412])
def test_a_bmc_that_requires_if_match_gets_the_settings_etag(tmp_path, bmcs, missing_status):
    fake = redfish_bmc.requiring_if_match(redfish_bmc.lenovo(), missing_status)
    bmcs(fake)
    rc, out = run_step(tmp_path, {"node": fake})
    assert rc == 0, out[-3000:]
    assert fake.rejected == [] and fake.if_match_seen == ['W/"00000001"']
    assert fake.patches == [EXPECTED_PATCH["lenovo"]]


def test_a_value_the_bios_registry_does_not_list_is_never_patched(tmp_path, bmcs):
    fake = redfish_bmc.lenovo()
    bmcs(fake)
    wanted = {"lenovo": {"OperatingModes_ChooseOperatingMode": "Custom Mode", "Processors_CStates": ["Disabled", "Disable"]}}
    rc, out = run_step(tmp_path, {"node": fake}, cpu_cstates_redfish_attributes=wanted)
    assert rc != 0
    assert fake.patches == [], "nothing is PATCHed while one wanted value is unknown to the BIOS"
    assert (f"node: the BIOS attribute registry of BMC {fake.address} has no value Custom Mode for "
            "OperatingModes_ChooseOperatingMode (its values: MaximumEfficiency, MaximumPerformance, CustomMode)") in out, out[-3000:]
