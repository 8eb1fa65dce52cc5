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
    assert plan == {"patch": {"CPUC6Report#0840": "Disable"}, "missing": ["NoSuchKnob"], "already_pending": [],
                    "invalid": []}


def test_plan_picks_the_bios_spelling_and_counts_pending():
    f = _filters()
    wanted = {"Processors_CStates": ["Disabled", "Disable"]}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {})["patch"] == {"Processors_CStates": "Disable"}
    assert f.redfish_bios_plan(wanted, {"Processors_CStates": "Enabled"}, {})["patch"] == {"Processors_CStates": "Disabled"}
    pending = f.redfish_bios_plan(wanted, {"Processors_CStates": "Enable"}, {"Processors_CStates": "Disable"})
    assert pending == {"patch": {}, "missing": [], "already_pending": ["Processors_CStates"], "invalid": []}


def test_plan_treats_an_ambiguous_suffix_match_as_missing():
    plan = _filters().redfish_bios_plan({"X": "1"}, {"X#0001": "0", "X#0002": "0"}, {})
    assert plan["patch"] == {} and plan["missing"] == ["X"]


def _registry(**values):
    return {"RegistryEntries": {"Attributes": [
        {"AttributeName": name, "Type": "Enumeration", "Value": [{"ValueName": v} for v in names]}
        for name, names in values.items()] + [{"AttributeName": "AdminPhone", "Type": "String"}]}}


def test_plan_writes_only_spellings_the_registry_lists():
    f = _filters()
    registry = _registry(Processors_CStates=["Enable", "Disable"], OperatingModes_ChooseOperatingMode=["CustomMode"])
    wanted = {"Processors_CStates": ["Disabled", "Disable"], "OperatingModes_ChooseOperatingMode": "CustomMode"}
    current = {"Processors_CStates": "Enabled", "OperatingModes_ChooseOperatingMode": "MaximumEfficiency"}
    # without the registry the ending of the current value picks "Disabled"; the registry allows only "Disable"
    assert f.redfish_bios_plan(wanted, current, {})["patch"]["Processors_CStates"] == "Disabled"
    plan = f.redfish_bios_plan(wanted, current, {}, registry)
    assert plan["patch"] == {"Processors_CStates": "Disable", "OperatingModes_ChooseOperatingMode": "CustomMode"}
    assert plan["invalid"] == []


def test_plan_patches_nothing_when_the_registry_lists_no_wanted_spelling():
    plan = _filters().redfish_bios_plan(
        {"OperatingModes_ChooseOperatingMode": "Custom Mode", "Processors_CStates": "Disable"},
        {"OperatingModes_ChooseOperatingMode": "MaximumEfficiency", "Processors_CStates": "Enable"}, {},
        _registry(OperatingModes_ChooseOperatingMode=["MaximumEfficiency", "CustomMode"], Processors_CStates=["Enable", "Disable"]))
    assert plan["patch"] == {}
    assert plan["invalid"] == ["no value Custom Mode for OperatingModes_ChooseOperatingMode "
                               "(its values: MaximumEfficiency, CustomMode)"]


def test_an_attribute_the_registry_does_not_enumerate_is_not_checked():
    plan = _filters().redfish_bios_plan({"AdminPhone": "1"}, {"AdminPhone": ""}, {}, _registry())
    assert plan["patch"] == {"AdminPhone": "1"} and plan["invalid"] == []


def test_the_host_system_is_the_one_with_a_bios_or_the_one_named():
    f = _filters()
    baseboard = {"@odata.id": "/redfish/v1/Systems/HGX_Baseboard_0", "Manufacturer": "NVIDIA"}
    host = {"@odata.id": "/redfish/v1/Systems/1/", "Bios": {"@odata.id": "/redfish/v1/Systems/1/Bios/"}}
    other = {"@odata.id": "/redfish/v1/Systems/2", "Id": "2", "Bios": {"@odata.id": "/redfish/v1/Systems/2/Bios"}}
    assert f.redfish_host_systems([baseboard, host], "") == [host]
    assert f.redfish_host_systems([baseboard], "") == []
    assert f.redfish_host_systems([baseboard, host, other], "") == [host, other]
    assert f.redfish_host_systems([baseboard, host, other], "1") == [host]  # HPE's ids end in "/"
    assert f.redfish_host_systems([baseboard, host, other], "2") == [other]
    assert f.redfish_host_systems([baseboard, host], "HGX_Baseboard_0") == []


@pytest.mark.parametrize(("members", "name", "found"), [
    (["/redfish/v1/Registries/Base.1.15.0", "/redfish/v1/Registries/BiosAttributeRegistry.1.0.0"],
     "BiosAttributeRegistry.1.0.0", "/redfish/v1/Registries/BiosAttributeRegistry.1.0.0"),
    (["/redfish/v1/Registries/BiosAttributeRegistryU30.v1_2_68/"], "BiosAttributeRegistryU30.v1_2_68",
     "/redfish/v1/Registries/BiosAttributeRegistryU30.v1_2_68/"),
    (["/redfish/v1/Registries/Messages", "/redfish/v1/Registries/BiosAttributeRegistry"],
     "BiosAttributeRegistry.v1_0_3", "/redfish/v1/Registries/BiosAttributeRegistry"),
    (["/redfish/v1/Registries/Base.1.15.0"], "BiosAttributeRegistry.1.0.0", ""),
    (["/redfish/v1/Registries/Base.1.15.0"], None, ""),
])
def test_the_registry_member_is_found_by_name(members, name, found):
    assert _filters().redfish_registry_member([{"@odata.id": m} for m in members], name) == found


def test_the_registry_file_is_the_english_location():
    f = _filters()
    assert f.redfish_registry_uri([{"Language": "ja", "Uri": "/ja.json"}, {"Language": "en", "Uri": "/en.json"}]) == "/en.json"
    assert f.redfish_registry_uri([{"Language": "ja", "Uri": "/ja.json"}]) == "/ja.json"
    assert f.redfish_registry_uri([{"Language": "en", "PublicationUri": "https://example.invalid/r.json"}]) == ""
    assert f.redfish_registry_uri(None) == ""
