"""Filters for cpu_cstates' Redfish BIOS step: which vendor a System is, and what to PATCH.

``redfish_vendor(manufacturer)``: ``dell``, ``hpe``, ``supermicro``, ``lenovo`` or ``""`` (unknown: the role
fails and names the Manufacturer instead of guessing attribute names).

``redfish_bios_plan(wanted, current, pending)``: compares the wanted attributes with the BIOS's current ones and
its pending settings (what applies at the next reboot) and returns::

    {"patch": {name: value}, "missing": [name], "already_pending": [name]}

- Names resolve against the BIOS's own attribute keys: exactly, or with a Supermicro per-BIOS hash suffix
  (``CPUC6Report`` -> ``CPUC6Report#0840``). A wanted attribute the BIOS does not have is ``missing``:
  reported, never PATCHed (a BMC answers 400 to an unknown attribute and the whole PATCH is lost).
- A wanted value may be a list of spellings of the same setting (Lenovo XCC1 ``Disable`` vs ``Disabled`` from
  Whitley on). Any of them counts as already set; to change, the spelling written is the one sharing the
  longest ending with the current value (``Enable`` -> ``Disable``, ``Enabled`` -> ``Disabled``).
- ``already_pending``: set in the pending settings but not yet current (applies at the next reboot).
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


def _common_ending(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[-1 - n] == b[-1 - n]:
        n += 1
    return n


def redfish_bios_plan(wanted: Mapping[str, Any], current: Mapping[str, Any] | None,
                      pending: Mapping[str, Any] | None) -> dict[str, Any]:
    current, pending = dict(current or {}), dict(pending or {})
    patch: dict[str, Any] = {}
    missing: list[str] = []
    already_pending: list[str] = []
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
        patch[key] = max(spellings, key=lambda s: _common_ending(str(s), str(now)))
    return {"patch": patch, "missing": missing, "already_pending": already_pending}


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"redfish_vendor": redfish_vendor, "redfish_bios_plan": redfish_bios_plan}
