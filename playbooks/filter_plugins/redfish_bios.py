"""Filters for cpu_cstates' Redfish BIOS step: which System is the host's, which vendor it is, and what to PATCH.

``redfish_host_systems(systems, system_id)``: of a BMC's Systems (their GET bodies), those that can be the
host's: the ones with a ``Bios`` link (an HGX platform's BMC also lists the GPU baseboard, ``HGX_Baseboard_0``,
without one, in no specified order), narrowed to the one whose ``Id`` (or last ``@odata.id`` segment) is
``system_id`` when that is set. The role needs exactly one.

``redfish_vendor(manufacturer)``: ``dell``, ``hpe``, ``supermicro``, ``lenovo`` or ``""`` (unknown: the role
fails and names the Manufacturer instead of guessing attribute names).

``redfish_ids(resources)``: their ``@odata.id`` s (Jinja's ``map(attribute=...)`` reads the dot as a path).

``redfish_registry_member(members, name)`` and ``redfish_registry_uri(locations)``: where the BIOS's attribute
registry is. ``members`` are ``/redfish/v1/Registries``' members, ``name`` the Bios's ``AttributeRegistry``
(``BiosAttributeRegistry.v1_0_3``): the member named so, else the one named by its unversioned part (iDRAC's
``/redfish/v1/Registries/BiosAttributeRegistry``), else one whose path contains it (as Lenovo's examples search);
``""`` when none. Of the member's ``Location`` entries, the English one's ``Uri`` first; ``""`` when none has one.

``redfish_bios_plan(wanted, current, pending, registry)``: compares the wanted attributes with the BIOS's current
ones and its pending settings (what applies at the next reboot) and returns::

    {"patch": {name: value}, "missing": [name], "already_pending": [name], "invalid": [text]}

- Names resolve against the BIOS's own attribute keys: exactly, or with a Supermicro per-BIOS hash suffix
  (``CPUC6Report`` -> ``CPUC6Report#0840``). A wanted attribute the BIOS does not have is ``missing``:
  reported, never PATCHed (a BMC answers 400 to an unknown attribute and the whole PATCH is lost).
- A wanted value may be a list of spellings of the same setting (Lenovo XCC1 ``Disable`` vs ``Disabled`` from
  Whitley on). Any of them counts as already set; to change, the spelling written is the one sharing the
  longest ending with the current value (``Enable`` -> ``Disable``, ``Enabled`` -> ``Disabled``).
- ``already_pending``: set in the pending settings but not yet current (applies at the next reboot).
- ``registry``: the BIOS's attribute registry (``RegistryEntries.Attributes[]``), when the BMC offers it. Only
  spellings among an attribute's ``ValueName`` s are written; an attribute none of whose wanted spellings the
  registry lists is ``invalid`` (a text naming it, the wanted and the registry's values): the role PATCHes
  nothing then, since the BMC would refuse the whole PATCH with a 400.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_VENDORS = (("dell", r"^dell\b"), ("hpe", r"^hpe?\b"), ("supermicro", r"^super ?micro\b"), ("lenovo", r"^lenovo\b"))
_HASH_SUFFIX = r"#[0-9A-Fa-f]{4}"


def redfish_vendor(manufacturer: Any) -> str:
    text = str(manufacturer or "").strip().lower()
    return next((vendor for vendor, pattern in _VENDORS if re.search(pattern, text)), "")


def _resolve(name: str, current: Mapping[str, Any]) -> str | None:
    if name in current:
        return name
    pattern = re.compile(re.escape(name) + _HASH_SUFFIX)
    matches = [key for key in current if pattern.fullmatch(str(key))]
    return matches[0] if len(matches) == 1 else None


def _system_id(system: Mapping[str, Any]) -> str:
    return str(system.get("Id") or str(system.get("@odata.id", "")).rstrip("/").rsplit("/", 1)[-1])


def redfish_host_systems(systems: list[Mapping[str, Any]], system_id: Any = "") -> list[Mapping[str, Any]]:
    with_bios = [s for s in systems if isinstance(s, Mapping) and isinstance(s.get("Bios"), Mapping)]
    return [s for s in with_bios if _system_id(s) == str(system_id)] if system_id else with_bios


def redfish_ids(resources: list[Any]) -> list[str]:
    return [str(r.get("@odata.id", "")) for r in resources or [] if isinstance(r, Mapping)]


def redfish_registry_member(members: list[Any], name: Any) -> str:
    ids = redfish_ids(members)
    name = str(name or "")
    if not name:
        return ""
    last = {i: i.rstrip("/").rsplit("/", 1)[-1] for i in ids}
    for match in (lambda i: last[i] == name, lambda i: name.startswith(last[i] + "."), lambda i: name in i):
        found = [i for i in ids if match(i)]
        if found:
            return found[0]
    return ""


def redfish_registry_uri(locations: list[Any]) -> str:
    with_uri = [loc for loc in locations or [] if isinstance(loc, Mapping) and loc.get("Uri")]
    english = [loc for loc in with_uri if str(loc.get("Language", "")).lower() in ("en", "en-us")]
    return str((english + with_uri)[0]["Uri"]) if with_uri else ""


def _registry_values(registry: Mapping[str, Any] | None) -> dict[str, list[str]]:
    entries = ((registry or {}).get("RegistryEntries") or {}).get("Attributes") or []
    return {str(e["AttributeName"]): [str(v.get("ValueName")) for v in e["Value"]]
            for e in entries if isinstance(e, Mapping) and "AttributeName" in e and isinstance(e.get("Value"), list)}


def _common_ending(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def redfish_bios_plan(wanted: Mapping[str, Any], current: Mapping[str, Any] | None,
                      pending: Mapping[str, Any] | None, registry: Mapping[str, Any] | None = None) -> dict[str, Any]:
    current, pending = dict(current or {}), dict(pending or {})
    values = _registry_values(registry)
    patch: dict[str, Any] = {}
    missing: list[str] = []
    already_pending: list[str] = []
    invalid: list[str] = []
    for name, value in wanted.items():
        key = _resolve(str(name), current)
        if key is None:
            missing.append(str(name))
            continue
        spellings = list(value) if isinstance(value, list | tuple) else [value]
        now = current[key]
        if pending.get(key, now) in spellings:
            if key in pending and now not in spellings:
                already_pending.append(key)
            continue
        if key in values:
            known = [s for s in spellings if str(s) in values[key]]
            if not known:
                invalid.append(f"no value {' or '.join(map(str, spellings))} for {key} (its values: {', '.join(values[key])})")
                continue
            spellings = known
        patch[key] = max(spellings, key=lambda s: _common_ending(str(s), str(now)))
    return {"patch": patch if not invalid else {}, "missing": missing, "already_pending": already_pending,
            "invalid": invalid}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"redfish_vendor": redfish_vendor, "redfish_bios_plan": redfish_bios_plan,
                "redfish_host_systems": redfish_host_systems, "redfish_registry_member": redfish_registry_member,
                "redfish_registry_uri": redfish_registry_uri, "redfish_ids": redfish_ids}
