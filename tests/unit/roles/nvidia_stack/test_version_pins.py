"""Version pins: one mapping (cluster.spec.PIN_VARS) from a component to the nvidia_stack role variable
that installs it; the versions check pins what the inventory sets for those variables."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster import spec
from cluster.model import build_node
from preflight.result import Verdict
from tests.unit.preflight.checks.test_versions import version_transport, versions_run

pytestmark = pytest.mark.unit

ROLE = Path(__file__).resolve().parents[4] / "roles" / "nvidia_stack"


def test_the_role_variable_pins_driver_and_fabric_manager():
    """The bug: the check read ``nvidia_driver_version`` while the role installs ``nvidia_stack_driver_version``,
    so a driver the role pinned was never checked against its pin."""
    names = ["a", "b"]
    results = versions_run(names, version_transport(names), nvidia_stack_driver_version="550.90.07")
    assert {(r.node, r.verdict, r.code) for r in results} == {(n, Verdict.FAIL, "VERSION_PIN") for n in names}
    assert {r.reason for r in results} == {"driver 535.161.08, pinned 550.90.07 (+1 more)"}
    assert all(r.evidence["expected"]["pins"] == {"driver": "550.90.07", "fabric_manager": "550.90.07"}
               for r in results)


def test_the_role_nccl_variable_is_the_nccl_pin():
    names = ["a", "b"]
    passed = versions_run(names, version_transport(names), nvidia_stack_nccl_version="2.21.5-1+cuda12.4")
    assert {r.verdict for r in passed} == {Verdict.PASS}
    failed = versions_run(names, version_transport(names), nvidia_stack_nccl_version="2.20.5-1+cuda12.4")
    assert {r.code for r in failed} == {"VERSION_PIN"}


def test_the_old_unprefixed_name_is_not_a_pin():
    node = build_node("a", {"gpu_model": "h100-sxm", "rack": "r1", "nvidia_driver_version": "1.2.3"})
    assert node.settings.version_pins == {}


def test_preflight_version_pins_win_over_the_role_variables():
    node = build_node("a", {"gpu_model": "h100-sxm", "rack": "r1", "nvidia_stack_driver_version": "550.127.08",
                            "preflight_version_pins": {"driver": "550.90.07", "ofed": "MLNX_OFED_LINUX-24.04"}})
    assert node.settings.version_pins == {"driver": "550.90.07", "fabric_manager": "550.127.08",
                                          "ofed": "MLNX_OFED_LINUX-24.04"}


def test_every_pin_variable_is_the_roles_own():
    """A rename in the role without the mapping (or the reverse) fails here, not silently in preflight."""
    defaults = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
    specs = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]["main"]["options"]
    tasks = "".join(p.read_text() for p in (ROLE / "tasks").glob("*.yml"))
    for component, variable in spec.PIN_VARS.items():
        assert variable in defaults and variable in specs, (component, variable)
        assert variable in tasks, (component, variable)
    assert set(spec.PIN_VARS) <= set(spec.COMPONENTS)
