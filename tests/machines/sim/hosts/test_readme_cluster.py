"""The README's "your own virtual cluster: a green preflight in three commands", run as written.

The commands are read from the README's code block, not copied here, so the page and the test cannot drift
apart: each runs in a fresh directory (where its relative ``mycluster`` and ``.state`` land) and must exit 0.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.machines import leftovers, needs_root

pytestmark = pytest.mark.machines(order=4)

ROOT = Path(__file__).resolve().parents[4]
SECTION = "### Your own virtual cluster: a green preflight in three commands"


def readme_commands() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    after = text.split(SECTION, 1)[1]
    block = re.search(r"```sh\n(.*?)```", after, re.S).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def test_the_readme_block_is_three_clusterctl_commands():
    commands = readme_commands()
    assert len(commands) == 3
    assert all(argv[0] == "clusterctl" for argv in commands)
    assert [argv[1] for argv in commands] == ["virtual", "virtual", "preflight"]


@needs_root
def test_the_readme_commands_give_a_green_preflight(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    clusterctl = [sys.executable, "-m", "cli.main"]
    inventory = tmp_path / "mycluster"
    try:
        for argv in readme_commands():
            done = subprocess.run(clusterctl + argv[1:], cwd=tmp_path, env=env, capture_output=True, text=True,
                                  timeout=600)
            assert done.returncode == 0, (
                f"`{shlex.join(argv)}` exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        assert "passed" in done.stdout, done.stdout[-2000:]
    finally:
        if (inventory / "hosts.yml").exists():
            subprocess.run(clusterctl + ["virtual", "down", "-i", str(inventory)], cwd=tmp_path, env=env,
                           capture_output=True, timeout=120)
    assert leftovers(inventory) == []
