"""Parsers for two ``nvidia-smi -q -d <DISPLAY>`` outputs: PCIe link state and clock event reasons.

Kinds (``clusterctl preflight parse KIND FILE``):

``nvsmi-pci``  ``nvidia-smi -q -d PCI`` (or ``-d PCI,PERFORMANCE``, which adds the performance state the
pcie_link check needs to tell an idle GPU's power-saving link speed from a link trained low)::

    {"gpus": [{"bus_id": "00000000:18:00.0", "gen_max": 5, "gen_current": 5, "gen_device_max": 5,
      "gen_host_max": 5, "width_max": 16, "width_current": 16, "replays": 0,
      "performance_state": "P0", "idle": false}]}

``nvsmi-perf``  ``nvidia-smi -q -d PERFORMANCE``: the clock event (before R535: throttle) reasons as
flags, and where the driver prints them (R535+) the accumulated time per reason in microseconds::

    {"gpus": [{"bus_id": "00000000:18:00.0", "performance_state": "P0",
      "reasons": {"idle": false, "applications_clocks_setting": false, "sw_power_cap": false,
                  "hw_slowdown": false, "hw_thermal_slowdown": false, "hw_power_brake_slowdown": false,
                  "sync_boost": false, "sw_thermal_slowdown": false, "display_clock_setting": false},
      "counters_us": {"sw_power_capping": 0, "sync_boost": 0, "sw_thermal_slowdown": 0,
                      "hw_thermal_slowdown": 0, "hw_power_braking": 0}}]}

Real example (H100 SXM, driver 550.54.15, ``-q -d PCI,PERFORMANCE``, idle GPU)::

    GPU 00000000:18:00.0
        PCI
            Bus                               : 0x18
            Bus Id                            : 00000000:18:00.0
            GPU Link Info
                PCIe Generation
                    Max                       : 5
                    Current                   : 1
                    Device Current            : 1
                    Device Max                : 5
                    Host Max                  : 5
                Link Width
                    Max                       : 16x
                    Current                   : 16x
            Replays Since Reset               : 0
        Performance State                     : P0
        Clocks Event Reasons
            Idle                              : Active
            ...

A GPU at rest drops its link to Gen1 (``Current : 1``) to save power; the width does not change. That is
why ``idle`` is reported and the check reads the generation again under load.

Both parsers share the raw step with ``nvsmi-q`` (:func:`preflight.parsers.nvsmi_q.read_run`: ``key :
value`` lines by indentation path, per ``GPU <bus id>`` block; several pasted outputs: the last complete
one) and reject: no GPU block (``No devices were found``), fewer blocks than ``Attached GPUs``, a block missing
the lines every block before it had (an output cut mid-GPU), and a value that is not what the field
holds (``Current : fast``) -- each a ParseError naming the line.
"""

from __future__ import annotations

from dataclasses import dataclass

from preflight.parsers import nvsmi_q
from preflight.parsers.common import Line, ParseError, last_complete, optional
from preflight.parsers.nvsmi_q import Block, Path

# Before R535 the section was "Clocks Throttle Reasons"; R535 renamed it "Clocks Event Reasons".
_REASON_SECTIONS = ("Clocks Event Reasons", "Clocks Throttle Reasons")
_COUNTER_SECTIONS = ("Clocks Event Reasons Counters", "Clocks Throttle Reasons Counters")
REASONS = {
    "Idle": "idle",
    "Applications Clocks Setting": "applications_clocks_setting",
    "SW Power Cap": "sw_power_cap",
    "HW Slowdown": "hw_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Brake Slowdown": "hw_power_brake_slowdown",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "Display Clock Setting": "display_clock_setting",
}
COUNTERS = {
    "SW Power Capping": "sw_power_capping",
    "Sync Boost": "sync_boost",
    "SW Thermal Slowdown": "sw_thermal_slowdown",
    "HW Thermal Slowdown": "hw_thermal_slowdown",
    "HW Power Braking": "hw_power_braking",
}


def read_blocks(text: str, what: str) -> list[Block]:
    """Per GPU block of the last complete output: (its ``GPU`` line, {indentation path: (value, line)}),
    read by the one ``nvidia-smi -q`` reader (:func:`preflight.parsers.nvsmi_q.read_run`)."""
    return last_complete(nvsmi_q.read(text, f" {what}"), _checked_blocks)


def _checked_blocks(run: list[Line]) -> list[Block]:
    raw = nvsmi_q.read_run(run)
    blocks, end = raw.gpus, raw.end
    if not blocks:
        raise ParseError(end.no, end.text, "no GPU block in this nvidia-smi -q output")
    # Fewer blocks than attached is a cut output, unless a person elided GPUs in a paste (the elision marker
    # is reported as a warning saying lines may be missing there): the blocks shown are still whole.
    if raw.attached is not None and len(blocks) < raw.attached[0] and not raw.elided:
        raise ParseError(end.no, end.text, f"output ends after {len(blocks)} of {raw.attached[0]} attached GPUs")
    first_keys = set(blocks[0][1])
    for gpu_line, values in blocks[1:]:
        missing = sorted(" / ".join(p) for p in first_keys - set(values))
        if missing:
            raise ParseError(end.no, end.text, f"GPU {gpu_line.text.split()[-1]} ends without {missing[0]}")
    return blocks


def _bus(block: Block) -> str:
    return block[0].text.split()[-1]


def _int(values: dict, path: Path, suffix: str = "") -> int | None:
    if path not in values:
        return None
    token, line = values[path]
    if optional(token) is None:
        return None
    digits = token.removesuffix(suffix).strip()
    if not digits.isdigit():
        raise ParseError(line.no, line.text, f"{' / '.join(path)} is not a number ({token!r})")
    return int(digits)


def _active(values: dict, path: Path) -> bool | None:
    if path not in values:
        return None
    token, line = values[path]
    if optional(token) is None:
        return None
    if token not in ("Active", "Not Active"):
        raise ParseError(line.no, line.text, f"{path[-1]} is neither Active nor Not Active ({token!r})")
    return token == "Active"


def _section(values: dict, names: tuple[str, ...]) -> str | None:
    return next((n for n in names if any(p[0] == n for p in values)), None)


# ------------------------------------------------------------------------------------------ PCI


@dataclass(frozen=True)
class GpuPcie:
    bus_id: str
    gen_max: int | None
    gen_current: int | None
    gen_device_max: int | None
    gen_host_max: int | None
    width_max: int | None
    width_current: int | None
    replays: int | None
    performance_state: str | None
    idle: bool | None  # "Idle : Active" among the clock event reasons (-d PERFORMANCE)

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass(frozen=True)
class PcieReport:
    gpus: list[GpuPcie]

    def to_json(self) -> dict:
        return {"gpus": [g.to_json() for g in self.gpus]}


def parse_pci(text: str) -> PcieReport:
    blocks = read_blocks(text, "-d PCI")
    gpus = []
    for block in blocks:
        values = block[1]
        link = ("PCI", "GPU Link Info")
        if link + ("Link Width", "Current") not in values:
            raise ParseError(block[0].no, block[0].text, f"GPU {_bus(block)} has no PCI / GPU Link Info "
                                                          "(not nvidia-smi -q -d PCI output?)")
        reasons = _section(values, _REASON_SECTIONS)
        gpus.append(GpuPcie(
            bus_id=_bus(block),
            gen_max=_int(values, link + ("PCIe Generation", "Max")),
            gen_current=_int(values, link + ("PCIe Generation", "Current")),
            gen_device_max=_int(values, link + ("PCIe Generation", "Device Max")),
            gen_host_max=_int(values, link + ("PCIe Generation", "Host Max")),
            width_max=_int(values, link + ("Link Width", "Max"), "x"),
            width_current=_int(values, link + ("Link Width", "Current"), "x"),
            replays=_int(values, ("PCI", "Replays Since Reset")),
            performance_state=optional(values.get(("Performance State",), (None,))[0]),
            idle=_active(values, (reasons, "Idle")) if reasons else None,
        ))
    return PcieReport(gpus)


# ---------------------------------------------------------------------------------- PERFORMANCE


@dataclass(frozen=True)
class GpuClockEvents:
    bus_id: str
    performance_state: str | None
    reasons: dict[str, bool | None]
    counters_us: dict[str, int | None]  # empty when the driver prints no counters (before R535)

    def to_json(self) -> dict:
        return {"bus_id": self.bus_id, "performance_state": self.performance_state,
                "reasons": dict(self.reasons), "counters_us": dict(self.counters_us)}


@dataclass(frozen=True)
class ClockEventsReport:
    gpus: list[GpuClockEvents]

    def to_json(self) -> dict:
        return {"gpus": [g.to_json() for g in self.gpus]}


def parse_perf(text: str) -> ClockEventsReport:
    blocks = read_blocks(text, "-d PERFORMANCE")
    gpus = []
    for block in blocks:
        values = block[1]
        section = _section(values, _REASON_SECTIONS)
        if section is None:
            raise ParseError(block[0].no, block[0].text,
                             f"GPU {_bus(block)} has no Clocks Event Reasons (not -q -d PERFORMANCE output?)")
        # HW Thermal/Power Brake Slowdown print indented under HW Slowdown (a sub-reason of it).
        flags: dict[str, bool | None] = {}
        for path in values:
            if path[0] == section and path[-1] in REASONS:
                flags[REASONS[path[-1]]] = _active(values, path)
        counters_section = _section(values, _COUNTER_SECTIONS)
        counters = {}
        if counters_section:
            for path in values:
                if path[0] == counters_section and path[-1] in COUNTERS:
                    counters[COUNTERS[path[-1]]] = _int(values, path, "us")
        gpus.append(GpuClockEvents(_bus(block), optional(values.get(("Performance State",), (None,))[0]),
                                   flags, counters))
    return ClockEventsReport(gpus)
