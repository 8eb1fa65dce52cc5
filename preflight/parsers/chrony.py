"""Parser for ``chronyc tracking``.

Usage::

    from preflight.parsers import chrony
    tracking = chrony.parse(text)
    tracking.synchronised                 # False for "Not synchronised" or reference 00000000
    abs(tracking.system_time_offset_s)    # gate against the profile's limit

Schema (``Tracking.to_json()``, the contract's ``chrony`` shape)::

    {"reference": "A9FEA97B (169.254.169.123)", "stratum": 4, "system_time_offset_s": -0.0000316,
     "last_offset_s": -0.000041040, "rms_offset_s": 0.000053422, "leap_status": "Normal"}

``System time`` is printed unsigned with ``fast``/``slow of NTP time``; the parser signs it: positive =
system clock fast of NTP time, negative = slow. ``Last offset`` is printed signed and kept so.
An unsynchronised daemon prints ``Reference ID : 00000000 ()``, stratum 0 and ``Leap status : Not
synchronised``; those are parsed as printed (the check decides). ``506 Cannot talk to daemon`` or output
cut before ``Leap status`` (the last line chronyc prints) raises ParseError naming the line.

Real example (chrony 4.2, AWS Time Sync through the link-local address)::

    Reference ID    : A9FEA97B (169.254.169.123)
    Stratum         : 4
    Ref time (UTC)  : Mon Nov 18 09:12:45 2024
    System time     : 0.000031600 seconds slow of NTP time
    Last offset     : -0.000041040 seconds
    RMS offset      : 0.000053422 seconds
    Frequency       : 2.286 ppm slow
    Residual freq   : -0.000 ppm
    Skew            : 0.012 ppm
    Root delay      : 0.000312345 seconds
    Root dispersion : 0.000430042 seconds
    Update interval : 16.1 seconds
    Leap status     : Normal
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from preflight.parsers.common import (
    Line,
    ParseError,
    first_nonblank,
    last_complete,
    last_nonblank,
    lines,
    split_key_value,
    split_runs,
)

_START = re.compile(r"^\s*Reference ID\s*:")
# Numbers: digits with at most one point ("." alone, "1.2.3" are not numbers: fuzzing found float('.')).
_SECONDS = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:e[+-]?\d+)?) seconds(?: (fast|slow) of NTP time)?$")
_PPM = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)) ppm(?: (fast|slow))?$")
UNSYNCHRONISED_REFERENCE = "00000000"


@dataclass(frozen=True)
class Tracking:
    reference: str  # "A9FEA97B (169.254.169.123)" as printed
    stratum: int
    system_time_offset_s: float  # + fast, - slow
    last_offset_s: float | None
    rms_offset_s: float | None
    leap_status: str
    frequency_ppm: float | None = None  # + fast, - slow
    root_delay_s: float | None = None
    root_dispersion_s: float | None = None
    update_interval_s: float | None = None
    ref_time_utc: str | None = None

    @property
    def reference_id(self) -> str:
        return self.reference.split()[0]

    @property
    def synchronised(self) -> bool:
        return self.reference_id != UNSYNCHRONISED_REFERENCE and self.leap_status != "Not synchronised"

    def to_json(self) -> dict:
        return {"reference": self.reference, "stratum": self.stratum,
                "system_time_offset_s": self.system_time_offset_s, "last_offset_s": self.last_offset_s,
                "rms_offset_s": self.rms_offset_s, "leap_status": self.leap_status}


def parse(text: str) -> Tracking:
    all_lines = lines(text)
    if not any(_START.match(line.text) for line in all_lines):
        first = first_nonblank(all_lines)
        raise ParseError(first.no, first.text, "no chronyc tracking output (a 'Reference ID :' line)")
    return last_complete(split_runs(all_lines, lambda t: bool(_START.match(t))), _parse_run)


def _parse_run(run: list[Line]) -> Tracking:
    raw: dict[str, tuple[str, Line]] = {}
    started = False
    for line in run:
        if _START.match(line.text):
            started = True
        if not started or not line.text.strip():
            continue
        pair = split_key_value(line.text)
        if pair is None:
            raise ParseError(line.no, line.text, "not a chronyc 'Key : value' line")
        raw[pair[0]] = (pair[1], line)
        if pair[0] == "Leap status":
            break  # chronyc's last line; what follows (a prompt, the next command) is not ours
    if "Leap status" not in raw:
        end = last_nonblank(run)
        raise ParseError(end.no, end.text, "chronyc tracking output ends before 'Leap status'")
    for key in ("Stratum", "System time"):
        if key not in raw:
            end = raw["Leap status"][1]
            raise ParseError(end.no, end.text, f"chronyc tracking output has no '{key}' line")
    stratum_token, stratum_line = raw["Stratum"]
    if not stratum_token.isdigit():
        raise ParseError(stratum_line.no, stratum_line.text, f"Stratum is not a number ({stratum_token!r})")
    return Tracking(
        reference=raw["Reference ID"][0],
        stratum=int(stratum_token),
        system_time_offset_s=_seconds(raw["System time"]),
        last_offset_s=_seconds(raw["Last offset"]) if "Last offset" in raw else None,
        rms_offset_s=_seconds(raw["RMS offset"]) if "RMS offset" in raw else None,
        leap_status=raw["Leap status"][0],
        frequency_ppm=_ppm(raw["Frequency"]) if "Frequency" in raw else None,
        root_delay_s=_seconds(raw["Root delay"]) if "Root delay" in raw else None,
        root_dispersion_s=_seconds(raw["Root dispersion"]) if "Root dispersion" in raw else None,
        update_interval_s=_seconds(raw["Update interval"]) if "Update interval" in raw else None,
        ref_time_utc=raw["Ref time (UTC)"][0] if "Ref time (UTC)" in raw else None,
    )


def _seconds(item: tuple[str, Line]) -> float:
    token, line = item
    match = _SECONDS.match(token)
    if match is None:
        raise ParseError(line.no, line.text, f"expected '<number> seconds', got {token!r}")
    value = float(match.group(1))
    return -value if match.group(2) == "slow" else value


def _ppm(item: tuple[str, Line]) -> float:
    token, line = item
    match = _PPM.match(token)
    if match is None:
        raise ParseError(line.no, line.text, f"expected '<number> ppm', got {token!r}")
    value = float(match.group(1))
    return -value if match.group(2) == "slow" else value
