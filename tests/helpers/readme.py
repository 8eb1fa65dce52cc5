"""README.md's command blocks, and a shell to run one of their lines in as a reader would: the venv's bin first
on PATH (the README's "clusterctl on your PATH"), a HOME of the test's own, no vault password from the
environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def block(heading: str) -> list[str]:
    """The command lines (comments stripped) of the first ```sh block under ``## heading``."""
    section = README.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    code = re.search(r"```sh\n(.*?)```", section, re.DOTALL)
    assert code, f"no sh block under '## {heading}'"
    return [line.split("#", 1)[0].strip() for line in code.group(1).splitlines() if line.split("#", 1)[0].strip()]


def shell(line: str, cwd: Path, home: Path, *, stdin: int | None = None, timeout: float = 120,
          columns: int = 200) -> subprocess.CompletedProcess:
    """One README line in bash; ``stdin``: a file descriptor (a terminal's, for a line that asks), else none."""
    env = {**os.environ, "HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": str(columns)}
    env.pop("ANSIBLE_VAULT_PASSWORD_FILE", None)
    return subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL if stdin is None else stdin)
