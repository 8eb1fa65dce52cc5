"""Every test module that boots simulated machines is in the machines group (tests/conftest.py).

Two such modules on two xdist workers at once would race for the same 127.0.R.N addresses: a test outside
the group fails at random, on CI, later. A module counts as booting machines when its source (or its
package's conftest) uses one of the ways the suite brings machines up. The demo (``make demo``) boots its
machines on its own net (127.42.R.N) and is its own scope (OWN_NET_MACHINE_TESTS), run beside the group.
"""

from __future__ import annotations

import re

from tests.conftest import (
    EARLY_UNIT_TESTS,
    MACHINE_TESTS,
    OWN_NET_MACHINE_TESTS,
    ROOT,
    is_machine_test,
    scope_of,
)

# `clusterctl virtual up` as argv or as simulate.up(), the preflight helper that boots a cluster, the
# provisioned-cluster, one-machine and up-inventory fixtures, the machines module itself, the image build.
BOOTS_MACHINES = re.compile(
    r"""["']virtual["'],\s*["']up["']|VirtualInventory\(|\bdef\s+(?:provisioned|one_host)\b|"""
    r"""\bdef\s+\w+\([^)]*\b(?:provisioned|one_host)\b|sim\.hosts\.machines\b|from sim\.hosts import [^\n]*\bmachines\b|"""
    r"""image\.ensure\(|\b(?:simulate|lifecycle)\.up\(|\bup_inventory\b""")


def _modules() -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
                  if p.name != "test_xdist_groups.py")  # this file spells the patterns out


def test_every_module_that_boots_machines_is_in_the_group():
    booting = [path for path in _modules() if BOOTS_MACHINES.search((ROOT / path).read_text())]
    # `virtual up` with simulate.up monkeypatched: nothing boots
    mocked = {"tests/cli/test_mistakes.py", "tests/cli/commands/test_provision.py"}
    assert [path for path in booting if not is_machine_test(path) and path not in mocked] == []
    assert len(booting) >= 10  # the pattern still finds the suite's machine tests


def test_every_group_entry_names_something_that_exists():
    entries = MACHINE_TESTS + OWN_NET_MACHINE_TESTS + EARLY_UNIT_TESTS
    assert [entry for entry in entries if not (ROOT / entry).exists()] == []


def test_the_demo_that_runs_beside_the_group_boots_its_machines_on_its_own_net():
    from demo import scenario as demo
    from sim.hosts import create

    assert demo.DEMO_NET != 0
    assert "net=DEMO_NET" in (ROOT / "demo/scenario.py").read_text()  # what make_cluster passes to create.write
    default = {h.address for h in create.plan(16, 8, "mixed", "none")}
    own = {h.address for h in create.plan(16, 8, "mixed", "none", demo.DEMO_NET)}
    assert not default & own


def test_the_machine_tests_are_one_work_unit_and_make_test_uses_the_scheduler_that_knows_it():
    assert {scope_of("tests/virtual/test_machines.py::test_up"),
            scope_of("tests/provision/test_site_virtual.py::test_a[b]")} == {"machines"}
    assert scope_of("tests/test_demo.py::test_demo[x::y]") == "tests/test_demo.py"
    assert scope_of("tests/provision/test_filters.py::test_a[b]") == "tests/provision/test_filters.py"
    makefile = (ROOT / "Makefile").read_text()
    assert "-n 2 --dist loadscope" in makefile  # the scheduler in tests/conftest.py takes over loadscope only


def test_the_machine_tests_run_in_the_listed_order_before_the_others():
    import subprocess
    import sys

    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                             "tests/provision/test_site_virtual.py", "tests/test_demo.py", "tests/provision/test_filters.py",
                             "tests/virtual/test_create.py", "tests/eas_agent/test_end_to_end.py"], cwd=ROOT,
                            capture_output=True, text=True).stdout
    modules = [line.split("::", 1)[0] for line in listed.splitlines() if "::" in line]
    order = list(dict.fromkeys(modules))
    assert order == ["tests/virtual/test_create.py", "tests/provision/test_site_virtual.py",
                     "tests/eas_agent/test_end_to_end.py", "tests/test_demo.py", "tests/provision/test_filters.py"], order
