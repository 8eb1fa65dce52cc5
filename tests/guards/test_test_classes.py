"""Every test module declares exactly one class (``pytestmark``: unit, integration or machines), the folder it
lives in agrees with it, and a module under tests/unit/ starts no process: `make check` runs the unit tier
alone and must stay quick and free of servers, CLIs run as programs and machines.

The guards (tests/guards/) are unit tests of the repository itself; they may ask git for its file list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import CLASSES, ROOT, declared_marks

pytestmark = pytest.mark.unit

CLASS_OF_FOLDER = {"unit": "unit", "guards": "unit", "integration": "integration", "machines": "machines"}

# What starting a process looks like in a test module: a subprocess or a multiprocessing child, a Python run
# as a program, a dev Consul server (directly or through the ``consul_addr`` fixture), or a helper module
# of the integration tier.
STARTS_A_PROCESS = re.compile(
    r"^\s*(?:import|from)\s+(?:subprocess|multiprocessing|devconsul\.server|tests\.integration)\b"
    r"|\bsys\.executable\b|\bDevConsulServer\b|\bdef\s+\w+\([^)]*\bconsul_addr\b", re.M)


def all_test_modules() -> list[Path]:
    return sorted((ROOT / "tests").rglob("test_*.py"))


def classes_of(path: Path) -> list[str]:
    return [name for name in declared_marks(path) if name in CLASSES]


def misplaced(paths: list[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for path in paths:
        rel = path.relative_to(root).as_posix()
        declared = classes_of(path)
        folder = rel.split("/")[1]
        if len(declared) != 1:
            problems.append(f"{rel}: declares {declared or 'no class'} (exactly one of {', '.join(CLASSES)})")
        elif CLASS_OF_FOLDER.get(folder) != declared[0]:
            problems.append(f"{rel}: marked {declared[0]} but lives under tests/{folder}/")
    return problems


def process_starters(paths: list[Path]) -> list[str]:
    return [f"{path.as_posix()}: {match.group(0).strip()}" for path in paths
            if (match := STARTS_A_PROCESS.search(path.read_text()))]


def test_every_test_module_declares_one_class_that_its_folder_agrees_with():
    assert misplaced(all_test_modules()) == []


def test_no_unit_test_module_starts_a_process():
    assert process_starters(sorted((ROOT / "tests" / "unit").rglob("*.py"))) == []


def test_the_checks_see_a_missing_class_a_second_class_a_wrong_folder_and_a_subprocess(tmp_path):
    unit = tmp_path / "tests" / "unit"
    unit.mkdir(parents=True)
    cases = {"test_none.py": "x = 1\n",
             "test_two.py": "import pytest\npytestmark = [pytest.mark.unit, pytest.mark.integration]\n",
             "test_wrong.py": "import pytest\npytestmark = pytest.mark.machines(order=1)\n",
             "test_good.py": "import pytest\npytestmark = [pytest.mark.unit, pytest.mark.timeout(5)]\n"}
    for name, text in cases.items():
        (unit / name).write_text(text)
    found = misplaced(sorted(unit.glob("test_*.py")), root=tmp_path)
    assert [line.split(":")[0] for line in found] == ["tests/unit/test_none.py", "tests/unit/test_two.py",
                                                       "tests/unit/test_wrong.py"]
    (unit / "test_good.py").write_text("def test_a(consul_addr):\n    pass\n")
    (unit / "test_none.py").write_text("def f():\n    import subprocess\n")
    assert len(process_starters([unit / "test_good.py", unit / "test_none.py", unit / "test_two.py"])) == 2

