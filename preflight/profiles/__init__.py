"""Threshold profiles: expected values per GPU SKU (``<gpu_model>.yml`` here), overridable per host.

A node's profile is the file named by its ``preflight_profile`` variable (set it per inventory group),
else by its ``gpu_model``; ``preflight_overrides`` (a nested mapping with the same keys) is merged on top.
Every file and every override is checked against :data:`SCHEMA`; a mistake is a :class:`ProfileError`
(exit code 2) naming the file or host, the key and what was expected, before any host is contacted.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from common.errors import ClusterctlError, ExitCode

PROFILE_DIR = Path(__file__).parent
_SIZE = re.compile(r"^\d+[KMG]?$")
_PCI_DISTANCES = ("PIX", "PXB", "PHB", "NODE", "SYS")


class ProfileError(ClusterctlError):
    exit_code = ExitCode.USAGE


def _positive_int(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v > 0 else "a positive integer"


def _non_negative_number(v: Any) -> str | None:
    return None if isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 else "a number >= 0"


def _positive_number(v: Any) -> str | None:
    return None if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else "a number > 0"


def _fraction(v: Any) -> str | None:
    return (
        None
        if isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1
        else "a number in (0, 1]"
    )


def _boolean(v: Any) -> str | None:
    return None if isinstance(v, bool) else "true or false"


def _size(v: Any) -> str | None:
    return (
        None if isinstance(v, str | int) and _SIZE.match(str(v)) else "a size such as 16G, 512M or 1073741824"
    )


def _pci_distance(v: Any) -> str | None:
    return None if v in _PCI_DISTANCES else f"one of {', '.join(_PCI_DISTANCES)}"


def _int_list(v: Any) -> str | None:
    ok = isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
    return None if ok else "a list of integers"


def _str_list(v: Any) -> str | None:
    return (
        None
        if isinstance(v, list) and v and all(isinstance(x, str) for x in v)
        else "a non-empty list of names"
    )


def _busbw_by_size(v: Any) -> str | None:
    ok = (
        isinstance(v, Mapping)
        and v
        and all(_positive_int(int(k) if str(k).isdigit() else k) is None for k in v)
        and all(_positive_number(x) is None for x in v.values())
    )
    return None if ok else "a mapping GPU count -> minimum busbw in GB/s, e.g. {4: 330, 8: 460}"


def _optional_positive_number(v: Any) -> str | None:
    return None if v is None or _positive_number(v) is None else "a number > 0, or null (not gated)"


def _pcie_gen(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 6 else "a PCIe generation 1-6"


def _pcie_width(v: Any) -> str | None:
    return None if v in (1, 2, 4, 8, 16, 32) else "a PCIe link width (1, 2, 4, 8, 16 or 32)"


def _reasons(v: Any) -> str | None:
    from preflight.parsers.nvsmi_sections import REASONS

    known = set(REASONS.values())
    ok = isinstance(v, list) and all(isinstance(x, str) and x in known for x in v)
    return None if ok else f"a list of clock event reasons ({', '.join(sorted(known))})"


DEPTHS = ("quick", "standard", "full")
_DEPTH_KEYS = {"dcgm_level": (1, 4), "nvbandwidth_samples": (1, 100), "minutes": (1, 1440)}


def _depths(v: Any) -> str | None:
    expected = (f"a mapping {{quick, standard, full}} -> {{{', '.join(_DEPTH_KEYS)}}} "
                "(integers: dcgm_level 1-4, nvbandwidth_samples 1-100, minutes 1-1440)")
    if not isinstance(v, Mapping) or set(v) != set(DEPTHS):
        return expected
    for settings in v.values():
        if not isinstance(settings, Mapping) or set(settings) != set(_DEPTH_KEYS):
            return expected
        for key, (low, high) in _DEPTH_KEYS.items():
            value = settings[key]
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                return expected
    return None


Validator = Callable[[Any], "str | None"]
SCHEMA: dict[str, dict[str, Validator]] = {
    "gpu": {
        "count": _positive_int,
        "nvlink_min": _positive_int,
        "nvswitch": _boolean,
        "nic_max_distance": _pci_distance,
    },
    "health": {
        "persistence_mode": _boolean,
        "xid_window_hours": _positive_number,
        "critical_xids": _int_list,
    },
    "nccl": {"min_size_bytes": _positive_int, "max_size": _size, "busbw_min_gbps": _busbw_by_size},
    "ib": {
        "port_rate_gbps": _positive_number,
        "write_lat_max_us": _positive_number,
        "write_bw_min_fraction": _fraction,
        "rack_outlier_fraction": _fraction,
        "ping_count": _positive_int,
        "ping_max_loss_pct": _non_negative_number,
    },
    "cstates": {"allowed_states": _str_list},
    "time_sync": {"max_offset_ms": _positive_number},
    "dcqcn": {"priority": lambda v: None if isinstance(v, int) and 0 <= v <= 7 else "a priority 0-7"},
    # Preflight depth: one section per check, and what each --depth runs.
    "pcie": {"gpu_gen": _pcie_gen, "gpu_width": _pcie_width, "hca_gen": _pcie_gen, "hca_width": _pcie_width},
    "gpu_bandwidth": {
        "h2d_min_gbps": _positive_number,
        "d2h_min_gbps": _positive_number,
        "d2d_read_min_gbps": _optional_positive_number,
    },
    "nvlink": {
        "speed_gbps": _positive_number,
        "replay_max": _non_negative_number,
        "recovery_max": _non_negative_number,
        "crc_max_per_s": _non_negative_number,
    },
    "throttle": {"fail_reasons": _reasons},
    "ib_health": {
        "flap_window_hours": _positive_number,
        "flap_max": _non_negative_number,
        "link_downed_max": _non_negative_number,
        "symbol_error_max": _non_negative_number,
        "port_rcv_errors_max": _non_negative_number,
        "link_error_recovery_max": _non_negative_number,
        "mlxlink": _boolean,
        "effective_ber_max": _positive_number,
    },
    "depth": {"default": lambda v: None if v in DEPTHS else f"one of {', '.join(DEPTHS)}", "levels": _depths},
}


def validate(data: Any, where: str, partial: bool = False) -> list[str]:
    """Problems in a profile (or, with ``partial``, an override that may leave keys out)."""
    if not isinstance(data, Mapping):
        return [f"{where}: expected a mapping of sections ({', '.join(SCHEMA)}), got {type(data).__name__}"]
    problems = []
    for section, fields in SCHEMA.items():
        if section not in data:
            if not partial:
                problems.append(f"{where}: missing section '{section}'")
            continue
        values = data[section]
        if not isinstance(values, Mapping):
            problems.append(f"{where}: {section}: expected a mapping, got {values!r}")
            continue
        for key, check in fields.items():
            if key not in values:
                if not partial:
                    problems.append(f"{where}: {section}.{key}: missing")
                continue
            expected = check(values[key])
            if expected:
                problems.append(f"{where}: {section}.{key}: expected {expected}, got {values[key]!r}")
        for key in values:
            if key not in fields:
                problems.append(f"{where}: {section}.{key}: unknown key (known: {', '.join(fields)})")
    for section in data:
        if section not in SCHEMA:
            problems.append(f"{where}: '{section}': unknown section (known: {', '.join(SCHEMA)})")
    return problems


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    merged = copy.deepcopy(base)
    for section, values in override.items():
        merged.setdefault(section, {}).update(copy.deepcopy(dict(values)))
    return merged


def _normalise(data: dict[str, Any]) -> dict[str, Any]:
    data["nccl"]["busbw_min_gbps"] = {int(k): float(v) for k, v in data["nccl"]["busbw_min_gbps"].items()}
    return data


@cache
def load_file(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        known = ", ".join(sorted(p.stem for p in PROFILE_DIR.glob("*.yml")))
        raise ProfileError(f"no preflight profile '{path.stem}' (known: {known})") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    problems = validate(data, str(path))
    if problems:
        raise ProfileError("invalid preflight profile:\n  " + "\n  ".join(problems))
    return _normalise(data)


def profile_of(node: Any, profile_dir: Path = PROFILE_DIR) -> dict[str, Any]:
    """:func:`profile_for` a model node (``cluster.model.Node``), from its typed preflight settings."""
    preflight = node.settings.preflight
    return profile_for(node.name, {"preflight_profile": preflight.profile, "preflight_overrides": preflight.overrides},
                       profile_dir)


def profile_for(host: str, hostvars: Mapping[str, Any], profile_dir: Path = PROFILE_DIR) -> dict[str, Any]:
    """The thresholds for one host: its group's (or GPU model's) profile with its overrides merged in."""
    name = str(hostvars.get("preflight_profile") or hostvars.get("gpu_model") or "")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ProfileError(f"{host}: preflight_profile/gpu_model {name!r} does not name a profile")
    profile = load_file(profile_dir / f"{name}.yml")
    overrides = hostvars.get("preflight_overrides")
    if not overrides:
        return profile
    problems = validate(overrides, f"{host}: preflight_overrides", partial=True)
    if problems:
        raise ProfileError("invalid preflight_overrides:\n  " + "\n  ".join(problems))
    return _normalise(_merge(profile, overrides))


def run_depth(profiles: Mapping[str, Mapping[str, Any]], requested: str | None = None) -> str | None:
    """The depth a run names in its report: ``--depth`` when given; else every node runs its profile's
    ``depth.default``, and when they all agree that one is named; ``None`` when they differ (the report then
    says "per profile" and each deep check's evidence carries its node's depth)."""
    if requested:
        return requested
    defaults = {p["depth"]["default"] for p in profiles.values()}
    return defaults.pop() if len(defaults) == 1 else None
