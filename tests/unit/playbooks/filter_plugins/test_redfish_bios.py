"""The Redfish BIOS filters (playbooks/filter_plugins/redfish_bios.py): the vendor from the manufacturer, and the
plan that resolves attribute names, counts pending changes and treats an ambiguous suffix as missing."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers import REPO

pytestmark = pytest.mark.unit


def _filters():
    spec = importlib.util.spec_from_file_location("redfish_bios", REPO / "playbooks/filter_plugins/redfish_bios.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("manufacturer", "vendor"), [
    ("Dell Inc.", "dell"), ("HPE", "hpe"), ("HP", "hpe"), ("Supermicro", "supermicro"), ("Super Micro", "supermicro"),
    ("Lenovo", "lenovo"), ("NVIDIA", ""), ("", ""), (None, ""), ("Hpecorp", ""),
])
def test_vendor_from_manufacturer(manufacturer, vendor):
    assert _filters().redfish_vendor(manufacturer) == vendor


def test_plan_resolves_supermicro_suffixes_and_reports_missing():
    plan = _filters().redfish_bios_plan(
        {"CPUC6Report": "Disable", "EnhancedHaltState(C1E)": "Disable", "NoSuchKnob": "Off"},
        {"CPUC6Report#0840": "Enable", "EnhancedHaltState(C1E)#0841": "Disable"}, {})
    assert plan == {"patch": {"CPUC6Report#0840": "Disable"}, "missing": ["NoSuchKnob"], "already_pending": []}


def test_plan_picks_the_bios_spelling_and_counts_pending():
    f = _filters()
    wanted = {"Processors_CStates": ["Disabled", "Disable"]}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {})["patch"] == {"Processors_CStates": "Disable"}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enabled"}, {})["patch"] == {"Processors_CStates": "Disabled"}
    pending = f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {"Processors_CStates": "Disable"})
    assert pending == {"patch": {}, "missing": [], "already_pending": ["Processors_CStates"]}


def test_plan_treats_an_ambiguous_suffix_match_as_missing():
    plan = _filters().redfish_bios_plan({"X": "1"}, {"X#0001": "0", "X#0002": "0"}, {})
    assert plan["patch"] == {} and plan["missing"] == ["X"]
