"""cpu_cstates' Redfish step (roles/cpu_cstates/tasks/redfish.yml) run by ansible-playbook against the stand-in
BMCs of sim/redfish_bmc.py, each answering like its vendor, including how it fails (its docstring is the
behaviour table with the sources). Any 400 loses the whole PATCH, so a role that sends a wrong name or spelling
fails the host.

The hosts are local connections (the step runs on the controller anyway), one BMC each, all in one play as a
mixed fleet is provisioned, each host its own case: every vendor's one correct PATCH conditional on the
settings object's ETag; the host's System found among an HGX baseboard's; every value checked against the
BIOS's own attribute registry before anything is PATCHed; render-only; attributes the BIOS lacks; an unknown
vendor. A second run over the hosts that succeeded sends nothing. That every request leaves from the
controller, never from the node, needs a node of its own: tests/machines/provision/test_redfish.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from sim import redfish_bmc
from sim.redfish_bmc import EXPECTED_PATCH, PASSWORD, PERSONALITIES, USER, FakeBmc
from tests.helpers import REPO

pytestmark = pytest.mark.integration

VENDOR_HOSTS = {f"{vendor}-node": vendor for vendor in sorted(PERSONALITIES)}
# Hosts run a second time, with render-only off: what a normal run after the first does.
SECOND_RUN = [*VENDOR_HOSTS, "render-only"]


@pytest.fixture(scope="module")
def tls(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmc-tls")
    key, cert = directory / "bmc.key", directory / "bmc.crt"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=bmc.test", "-days", "1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return str(cert), str(key)


def run_step(directory: Path, fakes: dict[str, FakeBmc], host_vars: dict[str, dict], limit: list[str]) -> tuple[int, str]:
    """The Redfish step over the hosts in ``limit`` (host name -> its BMC, and its own variables); returns the
    exit status and the output on one line."""
    play = [{"hosts": "all", "gather_facts": False, "tasks": [
        {"name": "Redfish step", "ansible.builtin.include_role": {"name": "cpu_cstates", "tasks_from": "redfish"}}]}]
    (directory / "play.yml").write_text(yaml.safe_dump(play))
    hosts = {host: {"ansible_connection": "local", "ansible_python_interpreter": sys.executable,
                    "cpu_cstates_redfish": True, "bmc_address": fake.address, "bmc_username": USER,
                    "bmc_password": PASSWORD, "bmc_validate_certs": False, **host_vars.get(host, {})}
             for host, fake in fakes.items()}
    (directory / "inventory.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    done = subprocess.run([str(Path(sys.executable).with_name("ansible-playbook")), "-i", str(directory / "inventory.json"),
                           "--limit", ",".join(limit), str(directory / "play.yml")],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
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


def older_bios() -> FakeBmc:
    fake = redfish_bmc.dell()
    del fake.current["ProcC1E"]  # an older BIOS without the C1E switch
    fake.current.update(ProcCStates="Disabled", SysProfile="Custom")
    return fake


def unknown_vendor() -> FakeBmc:
    fake = redfish_bmc.dell()
    fake.manufacturer = "NVIDIA"
    return fake


@dataclass
class Runs:
    fakes: dict[str, FakeBmc]
    first: str  # the first run's output on one line
    second: str  # the second run's, over SECOND_RUN
    first_patches: dict[str, list[dict]]  # host -> what its BMC got in the first run


@pytest.fixture(scope="module")
def runs(tls, tmp_path_factory):
    """Every case in one play, then the hosts of SECOND_RUN again: two ansible-playbook runs for the module."""
    fakes = {
        **{host: PERSONALITIES[vendor]() for host, vendor in VENDOR_HOSTS.items()},
        # HGX platforms whose BMC firmware refuses a PATCH without If-Match: AMI MegaRAC's 428, iBMC's 412.
        "hgx-ami-lenovo": redfish_bmc.requiring_if_match(redfish_bmc.behind_hgx_baseboard(redfish_bmc.lenovo()), 428),
        "hgx-ibmc-dell": redfish_bmc.requiring_if_match(redfish_bmc.behind_hgx_baseboard(redfish_bmc.dell()), 412),
        "baseboard-only": baseboard_only(),
        "two-systems": two_systems_with_a_bios(),
        "two-systems-named": two_systems_with_a_bios(),
        "setup-spelling": redfish_bmc.lenovo(),
        "render-only": redfish_bmc.dell(),
        "older-bios": older_bios(),
        "unknown-vendor": unknown_vendor(),
    }
    host_vars = {
        "two-systems-named": {"bmc_system_id": "System.Embedded.1"},
        "setup-spelling": {"cpu_cstates_redfish_attributes": {"lenovo": {
            "OperatingModes_ChooseOperatingMode": "Custom Mode", "Processors_CStates": ["Disabled", "Disable"]}}},
        "render-only": {"clusterctl_render_only": True},
    }
    # Each stand-in on its own 127.0.76.N.
    servers = [redfish_bmc.serve(fake, *tls, f"127.0.76.{11 + n}") for n, fake in enumerate(fakes.values())]
    directory = tmp_path_factory.mktemp("redfish")
    try:
        rc, first = run_step(directory, fakes, host_vars, list(fakes))
        assert rc != 0  # the hosts that must stop did
        first_patches = {host: list(fake.patches) for host, fake in fakes.items()}
        host_vars["render-only"] = {}
        rc2, second = run_step(directory, fakes, host_vars, SECOND_RUN)
        assert rc2 == 0, second[-3000:]
        yield Runs(fakes, first, second, first_patches)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@pytest.mark.parametrize("host", sorted(VENDOR_HOSTS))
def test_each_vendor_gets_its_one_correct_patch_conditional_on_the_etag_and_none_on_the_second_run(runs, host):
    fake = runs.fakes[host]
    assert "failed=0" in recap(runs.first, host)
    assert fake.rejected == [] and fake.unauthorized == 0
    assert runs.first_patches[host] == [EXPECTED_PATCH[VENDOR_HOSTS[host]]]
    assert fake.if_match_seen == ['"00000001"']  # the ETag the GET returned
    assert f"apply at the next reboot of {host}" in runs.first
    assert len(fake.patches) == 1, "the second run must not PATCH again"
    assert "changed=0" in recap(runs.second, host)
    assert f"apply at the next reboot of {host}" in runs.second  # still pending: staged, not yet applied


@pytest.mark.parametrize("host", ["hgx-ami-lenovo", "hgx-ibmc-dell"])
def test_behind_an_hgx_baseboard_listed_first_the_system_with_a_bios_is_the_hosts(runs, host):
    assert runs.fakes[host].resources()["/redfish/v1/Systems"]["Members"][0]["@odata.id"].endswith("HGX_Baseboard_0")
    assert "failed=0" in recap(runs.first, host)
    assert runs.fakes[host].patches == [EXPECTED_PATCH[host.split("-")[2]]]


def test_no_system_with_a_bios_stops_the_host_naming_the_bmc_and_the_members(runs):
    fake = runs.fakes["baseboard-only"]
    assert fake.patches == [] and "failed=1" in recap(runs.first, "baseboard-only")
    assert (f"baseboard-only: no System of BMC {fake.address} has a Bios link (members: "
            "/redfish/v1/Systems/HGX_Baseboard_0, /redfish/v1/Systems/System.Embedded.1)") in runs.first


def test_several_systems_with_a_bios_stop_the_host_unless_the_inventory_names_one(runs):
    fake = runs.fakes["two-systems"]
    assert fake.patches == [] and "failed=1" in recap(runs.first, "two-systems")
    assert (f"two-systems: 2 Systems of BMC {fake.address} have a Bios link (/redfish/v1/Systems/System.Embedded.2, "
            "/redfish/v1/Systems/System.Embedded.1): set cpu_cstates_bmc.system") in runs.first
    assert "failed=0" in recap(runs.first, "two-systems-named")
    assert runs.fakes["two-systems-named"].patches == [EXPECTED_PATCH["dell"]]


@pytest.mark.parametrize(("host", "missing_status"), [("hgx-ami-lenovo", 428), ("hgx-ibmc-dell", 412)])
def test_a_bmc_that_requires_if_match_gets_the_settings_etag(runs, host, missing_status):
    fake = runs.fakes[host]
    assert fake.if_match_missing_status == missing_status
    assert "failed=0" in recap(runs.first, host)
    assert fake.rejected == [] and fake.if_match_seen == ['W/"00000001"']
    assert fake.patches == [EXPECTED_PATCH[host.split("-")[2]]]


def test_a_value_the_bios_registry_does_not_list_is_never_patched(runs):
    fake = runs.fakes["setup-spelling"]
    assert "failed=1" in recap(runs.first, "setup-spelling")
    assert fake.patches == [], "nothing is PATCHed while one wanted value is unknown to the BIOS"
    assert (f"setup-spelling: the BIOS attribute registry of BMC {fake.address} has no value Custom Mode for "
            "OperatingModes_ChooseOperatingMode (its values: MaximumEfficiency, MaximumPerformance, CustomMode)") in runs.first


def test_render_only_stages_no_bios_change_and_reports_what_differs(runs):
    """Render-only touches nothing that applies at the next boot (playbooks/README.md, "Render only"): no PATCH,
    the differing attributes reported as not staged and no "reboot pending" for them; a normal run stages them."""
    assert "failed=0" in recap(runs.first, "render-only")
    assert runs.first_patches["render-only"] == [], "render-only must not stage BIOS settings"
    staged = re.search(r"render only: BIOS C-state attributes ([^':]*) of render-only differ; not staged", runs.first)
    assert staged and set(staged.group(1).split(", ")) == {"SysProfile", "ProcCStates"}, runs.first[-3000:]
    assert "reboot of render-only" not in runs.first
    assert runs.fakes["render-only"].patches == [EXPECTED_PATCH["dell"]]
    pending = re.search(r"reboot pending: BIOS C-state attributes ([^':]*) apply at the next reboot of render-only\b",
                        runs.second)
    assert pending and set(pending.group(1).split(", ")) == {"SysProfile", "ProcCStates"}, runs.second[-3000:]


def test_attributes_the_bios_lacks_are_reported_not_patched(runs):
    fake = runs.fakes["older-bios"]
    assert "failed=0" in recap(runs.first, "older-bios")
    assert fake.patches == [], "nothing differs among the attributes this BIOS has"
    assert f"older-bios: BIOS of {fake.address} (dell) has no attribute ProcC1E: not set" in runs.first


def test_an_unknown_vendor_stops_the_host_naming_it(runs):
    fake = runs.fakes["unknown-vendor"]
    assert "failed=1" in recap(runs.first, "unknown-vendor") and fake.patches == []
    assert (f"unknown-vendor: BMC {fake.address} reports Manufacturer 'NVIDIA', which has no BIOS attribute map"
            ) in runs.first
