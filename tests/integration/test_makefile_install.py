"""`make demo`'s first screen: the install steps print one status line each (pip's and apt's output goes to
a log), then the demo's step 1; a failed install shows the log's tail.

The Makefile's own recipes run, with a stand-in venv (a `python` whose pip prints screens of noise, a
`clusterctl` that prints step 1) and a stand-in `apt-get` on PATH: nothing is installed."""

from __future__ import annotations

import os
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NOISE = "WARNING: Location 'file:///opt/pypi/simple/x/' is ignored: it is neither a file nor a directory."

pytestmark = pytest.mark.integration


def stand_ins(tmp_path: Path, pip_rc: int = 0) -> tuple[Path, dict[str, str]]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    scripts = {
        venv / "bin" / "python": f"for i in $(seq 1 120); do echo \"{NOISE}\"; echo 'BuildBackendWarning' >&2; done\n"
                                 f"echo \"pip $*\"\nexit {pip_rc}\n",
        venv / "bin" / "clusterctl": "echo '──── 1/6 virtual cluster: 2 nodes in 2 racks ────'\n",
        tmp_path / "path" / "apt-get": "echo 'debconf: delaying package configuration, since apt-utils is not "
                                       "installed' >&2\necho \"apt-get $*\"\n",
    }
    for path, body in scripts.items():
        path.parent.mkdir(exist_ok=True)
        path.write_text("#!/bin/sh\n" + body)
        path.chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path / 'path'}:{os.environ['PATH']}"}
    return venv, env


def make_demo(venv: Path, env: dict[str, str], tools: str) -> subprocess.CompletedProcess:
    # as a newcomer types it (no -s), in the checkout; only the venv and the tool list are stand-ins
    return subprocess.run(["make", "demo", f"VENV={venv}", f"MACHINE_TOOLS={tools}", "PYTHON=false"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_make_demo_shows_one_line_per_install_step_then_step_1(tmp_path):
    venv, env = stand_ins(tmp_path)
    done = make_demo(venv, env, tools="sh no-such-tool-for-this-test")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        f"installing clusterctl into {venv} (log: {venv}/install.log)",
        "installing systemd-container debootstrap openssh-client util-linux apt-utils gnupg "
        f"(missing: no-such-tool-for-this-test; log: {venv}/machine-tools.log)",
        "──── 1/6 virtual cluster: 2 nodes in 2 racks ────",
    ]
    assert done.stderr == ""
    log = (venv / "install.log").read_text()
    assert NOISE in log and "BuildBackendWarning" in log and "pip -m pip install -e .[dev]" in log
    assert "debconf: delaying" in (venv / "machine-tools.log").read_text()
    assert (venv / ".installed").exists()
    again = make_demo(venv, env, tools="sh")  # installed, every tool there: step 1 is the first line
    assert again.stdout.splitlines() == ["──── 1/6 virtual cluster: 2 nodes in 2 racks ────"], again.stdout


def test_a_failed_install_shows_the_logs_tail_and_stops(tmp_path):
    venv, env = stand_ins(tmp_path, pip_rc=1)
    done = make_demo(venv, env, tools="sh")
    assert done.returncode != 0
    assert f"pip install failed; the whole log: {venv}/install.log" in done.stdout
    assert "pip -m pip install --upgrade pip" in done.stdout  # the log's last lines: what failed
    assert done.stdout.count(NOISE) < 40 and "1/6" not in done.stdout
    assert not (venv / ".installed").exists()


def test_the_license_is_an_spdx_expression_and_the_build_backend_reads_it():
    """The deprecated ``license = { text = ... }`` table made setuptools print a 12-line warning per build
    step into every install; the SPDX string needs setuptools >= 77 (PEP 639)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    (requirement,) = [r for r in project["build-system"]["requires"] if r.startswith("setuptools")]
    minimum = requirement.split(">=")[1]
    assert int(minimum.split(".")[0]) >= 77, requirement
