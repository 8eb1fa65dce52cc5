"""The eas-agent unit's device allow-list (roles/eas_agent): its DeviceAllow=char-... globs grant the GPUs'
character major on the R550 and R535 drivers' /proc/devices."""

from __future__ import annotations

import fnmatch
import re

import pytest

from tests.helpers import GOLDEN, REPO

pytestmark = pytest.mark.unit


FIXTURES = REPO / "tests" / "fixtures" / "proc_devices"


def char_groups(proc_devices: str) -> dict[str, int]:
    groups, section = {}, None
    for line in proc_devices.splitlines():
        if line.endswith("devices:"):
            section = line
        elif line.strip() and section == "Character devices:":
            major, name = line.split(None, 1)
            groups[name] = int(major)
    return groups


def allowed_majors(unit: str, proc_devices: str) -> set[int]:
    """Majors a unit's DeviceAllow=char-<glob> lines grant (systemd matches /proc/devices names with fnmatch)."""
    groups = char_groups(proc_devices)
    majors = set()
    for spec in re.findall(r"^DeviceAllow=char-(\S+)\s", unit, re.M):
        majors |= {major for name, major in groups.items() if fnmatch.fnmatchcase(name, spec)}
    return majors


@pytest.mark.parametrize("fixture", ["r550-hgx.txt", "r535.txt"])
def test_eas_agent_device_allow_covers_the_gpus_on_r550_and_r535(fixture):
    unit = (GOLDEN / "eas-agent.service").read_text()
    assert "DevicePolicy=closed" in unit
    assert 195 in allowed_majors(unit, (FIXTURES / fixture).read_text()), (
        f"no DeviceAllow=char-... of eas-agent.service names major 195 (/dev/nvidia0..N) in {fixture}")


def test_the_old_frontend_name_alone_misses_r550():
    """Negative control: what the role had before (char-nvidia-frontend only) grants nothing on R550."""
    assert allowed_majors("DeviceAllow=char-nvidia-frontend rw\n", (FIXTURES / "r550-hgx.txt").read_text()) == set()
