"""The one writer of operations reports: a run (a load test, a sweep, a calibration) -> files in a folder.

``write(result, out_dir)`` writes, for any result with ``as_dict()`` and ``render()``:

- ``<kind>.json``: every number (the machine-readable verdict);
- ``<kind>.md``: the verdict table(s) as text, for a ticket or a pull request;
- PNG plots (matplotlib, when installed): for a load test, latency over time per class
  (``latency-over-time.png``), TTFT CDFs per class with the SLO limits (``ttft-cdf.png``) and the GPU
  utilisation per unit over the run when the agents' data was read (``utilisation.png``); for a
  calibration, measured wait against the published score per unit (``calibration.png``).

Returns the paths written; a missing matplotlib leaves the PNGs out and says so (the JSON and Markdown
carry every number).
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console

PLOT_CLASSES_COLOURS = ("tab:blue", "tab:orange", "tab:red", "tab:green", "tab:purple", "tab:brown")


def render_text(renderable, width: int = 140) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    console.print(renderable)
    return console.export_text()


def _kind(result) -> str:
    from operate.loadtest import Result, SweepResult

    if isinstance(result, SweepResult):
        return "sweep"
    if isinstance(result, Result):
        return "loadtest"
    return "calibration"


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def write(result, out_dir: str | Path) -> tuple[list[Path], str | None]:
    """(paths written, a note when the PNGs were left out)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    kind = _kind(result)
    written = [out / f"{kind}.json", out / f"{kind}.md"]
    written[0].write_text(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
    written[1].write_text("```\n" + render_text(result.render()) + "```\n")
    plt = _pyplot()
    if plt is None:
        return written, "PNG plots left out: matplotlib is not installed (pip install matplotlib)"
    if kind == "loadtest":
        written += _loadtest_plots(plt, result, out)
    elif kind == "sweep":
        for r in result.results:
            written += _loadtest_plots(plt, r, out / f"rate-{r.rate:g}")
    else:
        written += _calibration_plot(plt, result, out)
    return written, None


def _loadtest_plots(plt, result, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    names = [k.name for k in result.scenario.classes]
    colour = {n: PLOT_CLASSES_COLOURS[i % len(PLOT_CLASSES_COLOURS)] for i, n in enumerate(names)}
    limits = {k.name: k.slo.limits().get("ttft") for k in result.scenario.classes}
    paths = []

    fig, ax = plt.subplots(figsize=(10, 5))
    for name in names:
        ok = [o for o in result.outcomes if o.klass == name and o.ok]
        ax.scatter([o.at for o in ok], [o.ttft_s * 1000 for o in ok], s=6, color=colour[name], label=f"{name} TTFT")
        failed = [o for o in result.outcomes if o.klass == name and not o.ok]
        if failed:
            ax.scatter([o.at for o in failed], [0] * len(failed), marker="x", color=colour[name],
                       label=f"{name} failed ({len(failed)})")
        if limits.get(name):
            ax.axhline(limits[name] * 1000, color=colour[name], linestyle="--", linewidth=0.8)
    ax.set(xlabel="seconds into the run (planned send)", ylabel="TTFT ms (dashed: p99 limit)",
           title=f"{result.scenario.name}: TTFT over time at {result.rate:g} req/s")
    ax.set_yscale("log")
    ax.legend(loc="upper left", fontsize=8)
    paths.append(_save(plt, fig, out / "latency-over-time.png"))

    fig, ax = plt.subplots(figsize=(8, 5))
    for name in names:
        values = sorted(o.ttft_s * 1000 for o in result.outcomes if o.klass == name and o.ok)
        if values:
            ax.step(values, [(i + 1) / len(values) for i in range(len(values))], where="post",
                    color=colour[name], label=f"{name} (n={len(values)})")
        if limits.get(name):
            ax.axvline(limits[name] * 1000, color=colour[name], linestyle="--", linewidth=0.8)
    ax.axhline(0.99, color="grey", linewidth=0.5)
    ax.set(xlabel="TTFT ms (dashed: the class's p99 limit)", ylabel="fraction of requests", xscale="log",
           title="TTFT CDF per class")
    ax.legend(loc="lower right", fontsize=8)
    paths.append(_save(plt, fig, out / "ttft-cdf.png"))

    if result.utilisation_samples:
        fig, ax = plt.subplots(figsize=(10, 4))
        per = defaultdict(list)
        for t, iu, pct in result.utilisation_samples:
            per[iu].append((t, pct))
        for iu, points in sorted(per.items()):
            ax.plot([p[0] for p in points], [p[1] for p in points], label=iu, linewidth=1)
        ax.set(xlabel="seconds into the run", ylabel="GPU utilisation %", ylim=(0, 100),
               title="GPU utilisation per unit (agents' NVML readings)")
        ax.legend(loc="lower right", fontsize=7, ncol=4)
        paths.append(_save(plt, fig, out / "utilisation.png"))
    return paths


def _calibration_plot(plt, result, out: Path) -> list[Path]:
    fig, ax = plt.subplots(figsize=(8, 6))
    top = 0.0
    for i, unit in enumerate(sorted(result.samples_by_unit)):
        samples = result.samples_by_unit[unit]
        flagged = unit in result.flagged
        ax.scatter([s.predicted_s * 1000 for s in samples], [s.wait_s * 1000 for s in samples], s=8,
                   marker="x" if flagged else "o", color=PLOT_CLASSES_COLOURS[i % len(PLOT_CLASSES_COLOURS)],
                   label=unit + (" (flagged)" if flagged else ""))
        top = max([top] + [s.predicted_s * 1000 for s in samples] + [s.wait_s * 1000 for s in samples])
    ax.plot([0, top], [0, top], color="grey", linewidth=0.8, label="score = wait")
    ax.set(xlabel="predicted queue wait at pick ms", ylabel="measured queue wait ms (TTFT - own prefill)",
           title="score calibration per unit")
    ax.legend(fontsize=8)
    return [_save(plt, fig, out / "calibration.png")]


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
