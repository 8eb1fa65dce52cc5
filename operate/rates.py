"""Rates and endpoints as a person types them (``--rate``, ``--sweep``, ``--endpoint``), checked once."""

from __future__ import annotations

from urllib.parse import urlsplit

from common.errors import UsageError

MAX_RATE = 10_000.0
MAX_SWEEP_STEPS = 50


def parse_rate(text: str, what: str = "--rate") -> float:
    try:
        rate = float(text)
    except ValueError:
        raise UsageError(f"{what}: expected requests per second (a number > 0), got {text!r}") from None
    if not 0 < rate <= MAX_RATE:
        raise UsageError(f"{what}: expected requests per second in (0, {MAX_RATE:g}], got {text!r}")
    return rate


def parse_sweep(text: str) -> list[float]:
    """``1,2,4,8`` (those rates) or ``LO:HI:STEP`` (LO, LO+STEP, ... up to HI), ascending, distinct."""
    if ":" in text:
        parts = text.split(":")
        if len(parts) != 3:
            raise UsageError(f"--sweep: expected LO:HI:STEP or a list R1,R2,..., got {text!r}")
        low, high, step = (parse_rate(p, "--sweep") for p in parts)
        if high < low:
            raise UsageError(f"--sweep: HI {high:g} is below LO {low:g}")
        count = int((high - low) / step + 1e-9) + 1
        if count > MAX_SWEEP_STEPS:
            raise UsageError(f"--sweep: {count} rates; at most {MAX_SWEEP_STEPS} (a larger STEP)")
        return [round(low + i * step, 6) for i in range(count)]
    rates = sorted({parse_rate(p.strip(), "--sweep") for p in text.split(",") if p.strip()})
    if not rates:
        raise UsageError(f"--sweep: expected LO:HI:STEP or a list R1,R2,..., got {text!r}")
    if len(rates) > MAX_SWEEP_STEPS:
        raise UsageError(f"--sweep: {len(rates)} rates; at most {MAX_SWEEP_STEPS}")
    return rates


def parse_endpoint(text: str) -> str:
    """``http://host:port`` (a bare ``host:port`` gets ``http://``); no path, query or credentials."""
    url = text if "://" in text else f"http://{text}"
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        raise UsageError(f"--endpoint: expected http://HOST:PORT of an OpenAI-compatible server, got {text!r}")
    if parts.path not in ("", "/") or parts.query or parts.username:
        raise UsageError(f"--endpoint: expected only http://HOST:PORT (the /v1/... paths are added), got {text!r}")
    return f"{parts.scheme}://{parts.netloc}"
