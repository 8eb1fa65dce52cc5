"""A newcomer's first hour, chained in one test from the README as written: the README's top puts clusterctl on
the PATH (the venv's bin), then the "Your first hour" block runs line by line in a fresh directory: a virtual
cluster of your own (create, up, provision, which asks on a terminal and is answered yes, preflight catching the
injected faults, down), then the sample copied, its placeholders replaced as inventory/sample/README.md says,
validate and --plan.

Two lines are left to the tests that already run them: `make demo` (tests/machines/test_demo.py; its machines
live on their own net, and two demos at once would share it) and the canary provision of inventory/prod, whose
hosts are the sample's real names. tests/integration/docs/test_readme_first_hour.py runs the lines that touch
no machine on every run.

Slow (a four-node cluster of its own, provisioned for real with its reboot: 6.4 minutes on a two-core host
with little else running, far more under load; CI's run has no room for it), so it runs only where
CLUSTERCTL_FIRST_HOUR_TEST=1: a check before landing a change to the README's first hour, the virtual cluster or
the roles."""

from __future__ import annotations

import os
import pty
import re
import shlex
import shutil
import subprocess

import pytest

from tests.helpers.inventory import SAMPLE, SAMPLE_VAULT_PASSWORD, fill_placeholders
from tests.helpers.machines import leftovers, needs_root
from tests.helpers.readme import README, block, shell

only_when_asked = pytest.mark.skipif(
    os.environ.get("CLUSTERCTL_FIRST_HOUR_TEST") != "1",
    reason="set CLUSTERCTL_FIRST_HOUR_TEST=1 (a pre-landing check: it provisions four machines of its own)")

pytestmark = [pytest.mark.machines(order=10), needs_root, only_when_asked, pytest.mark.timeout(3600)]

LEFT_TO_OTHER_TESTS = ("make demo", "clusterctl provision -i inventory/prod --limit")
PROVISION_TIMEOUT_S = 2700  # site.yml on four machines, reboot included: 30+ minutes on a loaded two-core host


def on_a_terminal(line: str, cwd, home, answer: str) -> subprocess.CompletedProcess:
    """``line`` with a terminal as its stdin, ``answer`` typed there (output still captured, as in a log)."""
    keyboard, terminal = pty.openpty()
    try:
        os.write(keyboard, answer.encode() + b"\n")
        return shell(line, cwd, home, stdin=terminal, timeout=PROVISION_TIMEOUT_S)
    finally:
        os.close(terminal)
        os.close(keyboard)


def test_the_first_hour_from_the_readme_top_to_a_plan_of_your_own_cluster(tmp_path):
    top = README.split("## Your first hour")[0]
    assert ".venv/bin" in top  # how clusterctl gets on the PATH, before the first command that needs it
    steps = block("Your first hour")
    skipped = [line for line in steps if line.startswith(LEFT_TO_OTHER_TESTS)]
    assert len(skipped) == 2, steps
    home = tmp_path / "home"
    home.mkdir()
    (home / ".vault-pass").write_text(SAMPLE_VAULT_PASSWORD + "\n")
    (home / ".vault-pass").chmod(0o600)
    shutil.copytree(SAMPLE, tmp_path / "inventory" / "sample")
    mycluster = tmp_path / "mycluster"
    ran: dict[str, subprocess.CompletedProcess] = {}  # the line's first three words -> its run
    try:
        for line in steps:
            if line in skipped:
                continue
            argv = shlex.split(line)
            if argv[:2] == ["clusterctl", "provision"] and "--plan" not in argv and "--limit" not in argv:
                done = on_a_terminal(line, tmp_path, home, "y")
                assert re.search(r"no --limit: run site\.yml on all 4 hosts of \S*mycluster in \d+ batches\? \[y/N\]",
                                 done.stderr), done.stderr[-2000:]
            else:
                if argv[:2] == ["clusterctl", "inventory"]:  # "between cp and validate": the placeholders replaced
                    assert fill_placeholders(tmp_path / "inventory" / "prod") == 36
                done = shell(line, tmp_path, home, timeout=600)
            expected = 1 if argv[:2] == ["clusterctl", "preflight"] else 0  # the README: "(exit 1)"
            assert done.returncode == expected, (f"`{line}` exited {done.returncode}:\n{done.stdout[-4000:]}\n"
                                                 f"{done.stderr[-3000:]}")
            ran[" ".join(argv[:3]) + (" --plan" if "--plan" in argv else "")] = done
    finally:
        if (mycluster / "hosts.yml").exists():
            shell("clusterctl virtual down -i mycluster", tmp_path, home, timeout=180)
    assert leftovers(mycluster) == []
    faulty = re.search(r"injected faults on ([\w, ]+)", ran["clusterctl virtual create"].stdout).group(1).split(", ")
    assert "reboot pending" not in ran["clusterctl provision -i"].stdout  # --allow-reboot: the driver is loaded
    problems = [line.split()[:2] for line in ran["clusterctl preflight -i"].stdout.splitlines()
                if re.match(r"(FAIL|ERROR|UNREACHABLE) r\d+n\d+ ", line)]
    # every node with injected faults is caught; a healthy one has no check that could not run (a driver
    # installed but not loaded would make nvidia-smi fail on every node: ERROR rows on the healthy ones too)
    assert {node for _, node in problems} >= set(faulty) and "FAIL" in {v for v, _ in problems}, (faulty, problems)
    assert [p for p in problems if p[1] not in faulty and p[0] != "FAIL"] == [], (faulty, problems)
    assert ran["clusterctl inventory validate"].stdout.splitlines() == [
        "inventory/prod: Consul servers: consul01, consul02, consul03 (dedicated)", "inventory/prod: OK (11 hosts)"]
    plan = ran["clusterctl provision -i --plan"].stdout
    assert plan.splitlines()[0].startswith("plan: site.yml on 11 hosts of ") and "inventory/prod" in plan
