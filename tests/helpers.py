"""Small helpers shared by test modules."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

from cli.main import main


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``clusterctl ARGS`` in-process; return (exit code, stdout, stderr)."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    out, err = capsys.readouterr()
    return code, out, err


def write_tree(root: Path, files: dict[str, str]) -> Path:
    """Write ``{relative path: text}`` under root (text is dedented) and return root."""
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip("\n"))
    return root


def wait_for(condition, timeout: float, what: str, interval: float = 0.05):
    """``condition()``'s first truthy value within ``timeout`` seconds, else AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
