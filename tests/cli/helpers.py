"""Helpers of the CLI tests: golden snapshots of rendered output, the one-line error rule, and a machine's
provisioned stamp."""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

SNAPSHOTS = Path(__file__).parent / "snapshots"


def check_snapshot(name: str, text: str, directory: Path = SNAPSHOTS) -> None:
    """Compare with ``directory/NAME``; UPDATE_SNAPSHOTS=1 rewrites it (then read the git diff)."""
    path = directory / name
    if os.environ.get("UPDATE_SNAPSHOTS"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; rerun with UPDATE_SNAPSHOTS=1 and review the diff"


def render_at(renderable_for_width: Callable[[int], object], width: int | None) -> str:
    """What a console of ``width`` columns (None: piped, rich's own non-TTY default) prints."""
    out = io.StringIO()
    console = Console(file=out, width=width, force_terminal=False, color_system=None)
    console.print(renderable_for_width(console.width))
    return out.getvalue()


def one_line(err: str) -> str:
    """``err`` is exactly one line (the CLI's rule for an error); returns it stripped."""
    assert err.count("\n") == 1, err
    return err.strip()


def stamp_provisioned(inventory: Path, host: str, when: float | None = None) -> Path:
    """Leave the provisioned stamp in ``host``'s machine overlay, where provisioning's write inside the running
    machine lands (no machine is booted)."""
    from sim.hosts import lifecycle, run_state

    path = lifecycle.layout(inventory).host(host).upper / run_state.PROVISIONED_STAMP.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("provisioned by clusterctl\n")
    if when is not None:
        os.utime(path, (when, when))
    return path
