"""GPU utilisation per unit over a run, read from what the agents publish (their score bodies in Consul).

Each agent's body carries, per IU, the mean GPU utilisation of the IU's GPUs (component ``gpu_util_pct``,
read from NVML each cycle). A :class:`UtilisationSampler` reads every body once a second in a thread and
keeps (seconds since its start, IU, percent); :func:`summary` gives the mean per unit, the mean over units
and the variance across units (how evenly the pool is loaded).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections import defaultdict

from consul_io import layout
from consul_io.client import ConsulIO, ConsulUnavailable

UTIL_COMPONENT = "gpu_util_pct"


def utilisation_of(body: dict) -> dict[str, float]:
    """IU -> GPU utilisation percent of one score body (IUs without the component are left out)."""
    out = {}
    ius = body.get("ius") if isinstance(body, dict) else None
    for iu, entry in (ius or {}).items():
        value = ((entry or {}).get("components") or {}).get(UTIL_COMPONENT) if isinstance(entry, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 100:
            out[iu] = float(value)
    return out


class UtilisationSampler:
    def __init__(self, io: ConsulIO, datacenter: str = layout.DEFAULT_DATACENTER, interval_s: float = 1.0):
        self.io, self.prefix, self.interval_s = io, layout.score_prefix(datacenter), interval_s
        self.samples: list[tuple[float, str, float]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()

    def sample_once(self) -> None:
        try:
            _, entries = self.io.kv_list(self.prefix)
        except ConsulUnavailable:
            self.errors += 1
            return
        now = time.monotonic() - self.started
        for entry in entries:
            try:
                body = json.loads(entry.get("Value") or b"{}")
            except ValueError:
                continue
            for iu, pct in utilisation_of(body).items():
                self.samples.append((now, iu, pct))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample_once()

    def start(self) -> UtilisationSampler:
        self.started = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="utilisation", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)


def summary(samples: list[tuple[float, str, float]]) -> dict:
    """Mean utilisation per unit, their mean, and the variance of the unit means (percent points^2)."""
    per: dict[str, list[float]] = defaultdict(list)
    for _, iu, pct in samples:
        per[iu].append(pct)
    means = {iu: statistics.fmean(v) for iu, v in sorted(per.items())}
    if not means:
        return {"units": {}, "mean_pct": None, "variance_pct2": None}
    values = list(means.values())
    return {"units": {iu: round(m, 1) for iu, m in means.items()}, "mean_pct": round(statistics.fmean(values), 1),
            "variance_pct2": round(statistics.pvariance(values), 2) if len(values) > 1 else 0.0}
