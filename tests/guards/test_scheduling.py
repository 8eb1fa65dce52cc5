"""The run order and the xdist work units come from the modules' marks (tests/conftest.py).

Two machine modules on two xdist workers at once would race for the same 127.0.R.N addresses, so every module
under tests/machines/ that shares them is one work unit, run in its ``machines(order=N)``; the demo and the
preflight machine modules boot their machines on nets of their own (127.42.R.N, 127.NET.R.N) and are each their
own unit, run beside the chain after the ``realtime`` modules.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import MACHINES_SCOPE, ROOT, declared_marks, run_rank, scope_of

pytestmark = pytest.mark.unit


def _test_modules(folder: str) -> list[str]:
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests" / folder).rglob("test_*.py"))


def test_every_machine_module_has_a_place_in_the_chain_or_a_net_of_its_own():
    modules = _test_modules("machines")
    marks = {path: declared_marks(ROOT / path)["machines"] for path in modules}
    assert [path for path, kwargs in marks.items() if set(kwargs) not in ({"order"}, {"own_net"})] == []
    own = [path for path, kwargs in marks.items() if kwargs.get("own_net")]
    assert "tests/machines/test_demo.py" in own and len(modules) >= 10
    # every other own-net module names its net (NET = R: its machines on 127.R.x.y) and passes it to its inventory
    nets = {}
    for path in own:
        if path == "tests/machines/test_demo.py":
            continue
        source = (ROOT / path).read_text()
        found = re.search(r"^NET = (\d+)$", source, re.M)
        assert found and "net=NET" in source, f"{path}: an own-net module without its NET"
        nets[path] = int(found.group(1))
    from demo import scenario as demo

    assert 0 not in nets.values() and len({*nets.values(), demo.DEMO_NET}) == len(nets) + 1, nets


def test_the_demo_that_runs_beside_the_chain_boots_its_machines_on_its_own_net():
    from demo import scenario as demo
    from sim.hosts import create

    assert demo.DEMO_NET != 0
    assert "net=DEMO_NET" in (ROOT / "demo/scenario.py").read_text()  # what make_cluster passes to create.write
    default = {h.address for h in create.plan(16, 8, "mixed", "none")}
    own = {h.address for h in create.plan(16, 8, "mixed", "none", demo.DEMO_NET)}
    assert not default & own


def test_the_marks_read_from_source_are_the_marks_pytest_sees(tmp_path):
    module = tmp_path / "test_x.py"
    module.write_text("import pytest\npytestmark = [pytest.mark.machines(order=3), pytest.mark.timeout(9)]\n")
    assert declared_marks(module) == {"machines": {"order": 3}, "timeout": {}}
    module.write_text("import pytest\npytestmark = pytest.mark.integration\n")
    assert declared_marks(module) == {"integration": {}}


def test_shared_net_machines_come_first_in_order_then_realtime_then_the_demo_then_the_rest():
    ranks = [run_rank({"machines": {"order": 9}}), run_rank({"unit": {}}), run_rank({"machines": {"own_net": True}}),
             run_rank({"integration": {}, "realtime": {}}), run_rank({"machines": {"order": 0}})]
    assert sorted(ranks) == [(0, 0), (0, 9), (1, 0), (2, 0), (3, 0)]


def test_the_machine_tests_are_one_work_unit_and_make_test_uses_the_scheduler_that_knows_it():
    assert {scope_of("tests/machines/sim/hosts/test_machines.py::test_up"),
            scope_of("tests/machines/provision/test_site_virtual.py::test_a[b]")} == {MACHINES_SCOPE}
    assert scope_of("tests/machines/test_demo.py::test_demo[x::y]") == "tests/machines/test_demo.py"
    assert scope_of("tests/integration/playbooks/test_filters.py::test_a[b]") == "tests/integration/playbooks/test_filters.py"
    makefile = (ROOT / "Makefile").read_text()
    assert "-n 2 --dist loadscope" in makefile  # the scheduler in tests/conftest.py takes over loadscope only


def _collect(*args: str) -> tuple[list[str], str]:
    """The modules ``pytest --collect-only`` lists for ``args``, in order, and its summary line."""
    listed = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                            cwd=ROOT, capture_output=True, text=True).stdout
    lines = listed.splitlines()
    modules = list(dict.fromkeys(line.split("::", 1)[0] for line in lines if "::" in line))
    return modules, next((line for line in reversed(lines) if " collected" in line), "")


def test_the_machine_tests_run_in_their_order_before_the_others():
    order, _ = _collect("tests/machines/provision/test_site_virtual.py", "tests/machines/test_demo.py",
                               "tests/integration/playbooks/test_filters.py", "tests/machines/sim/hosts/test_create.py",
                               "tests/integration/eas_agent/test_end_to_end.py",
                               "tests/machines/provision/test_redfish.py",
                               "tests/machines/provision/test_vault_option.py")
    assert order == ["tests/machines/provision/test_vault_option.py", "tests/machines/sim/hosts/test_create.py",
                     "tests/machines/provision/test_site_virtual.py", "tests/integration/eas_agent/test_end_to_end.py",
                     "tests/machines/test_demo.py", "tests/machines/provision/test_redfish.py",
                     "tests/integration/playbooks/test_filters.py"], order


def test_pytest_sees_the_machines_mark_of_every_module_under_machines():
    """What the controller reads from the source (declared_marks) is what pytest selects by: ``-m machines``
    keeps every module under tests/machines/ and deselects nothing there (the folder agrees with the mark:
    tests/guards/test_test_classes.py)."""
    modules, summary = _collect("-m", "machines", "tests/machines")
    assert sorted(modules) == _test_modules("machines")
    assert " collected" in summary and "deselected" not in summary, summary
