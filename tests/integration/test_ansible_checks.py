"""tests/ansible_checks.sh (every playbook's syntax-check, ansible-lint's production profile over the whole
repository) as a test: ~50 s of CPU that runs beside the machine tests on the other xdist worker, not before them."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_playbooks_pass_syntax_check_and_roles_pass_ansible_lint_production():
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    run = subprocess.run(["bash", str(ROOT / "tests/ansible_checks.sh")], cwd=ROOT, env=env, capture_output=True,
                         text=True, timeout=590)
    assert run.returncode == 0, (run.stdout + run.stderr)[-6000:]
