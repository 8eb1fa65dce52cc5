"""Go ``time.Duration`` text, as Consul reads and prints it ("10s", "1m30s", "250ms").

Consul parses query and check durations with Go's ``time.ParseDuration`` and prints them with
``Duration.String()`` (``Interval: "1m0s"`` in ``/v1/agent/checks``), so the dev server does both the
same way. A JSON number in a check definition is nanoseconds, as Go decodes it.
"""

from __future__ import annotations

import re

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_duration(text: str) -> float:
    """Seconds in a Go duration string; raises ValueError like ``time.ParseDuration`` would fail."""
    raw = text.strip()
    sign = -1.0 if raw.startswith("-") else 1.0
    body = raw.lstrip("+-")
    if body == "0":
        return 0.0
    if not body:
        raise ValueError(f"time: invalid duration {text!r}")
    pos, total = 0, 0.0
    for match in _PART.finditer(body):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(body):
        raise ValueError(f"time: invalid duration {text!r}")
    return sign * total


def duration_value(value: object) -> float:
    """Seconds from a check-definition field: a Go duration string, or a number of nanoseconds."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, (int, float)):
        return float(value) / 1e9
    if isinstance(value, str):
        return parse_duration(value) if value else 0.0
    raise ValueError(f"invalid duration {value!r}")


def format_duration(seconds: float) -> str:
    """Go's ``Duration.String()``: "0s", "500ms", "1s", "1m0s", "1h2m3s"."""
    ns = round(seconds * 1e9)
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000_000_000:
        for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
            if ns >= size:
                return sign + _trim(ns / size) + unit
    hours, rest = divmod(ns, 3600 * 1_000_000_000)
    minutes, rest = divmod(rest, 60 * 1_000_000_000)
    secs = _trim(rest / 1e9) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{secs}"
    if minutes:
        return f"{sign}{minutes}m{secs}"
    return sign + secs


def _trim(number: float) -> str:
    text = f"{number:.9f}".rstrip("0").rstrip(".")
    return text or "0"
