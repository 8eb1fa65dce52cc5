"""The node-side wheels (provision/wheels.py): what each carries and leaves out, their metadata, code that
Python 3.10 runs, and a version that changes with the packaged code. Builds the wheels; installs nothing."""

from __future__ import annotations

import ast
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

from provision import wheels

# Modules and names that Python 3.11+ added; the wheels' code must not use them (Ubuntu 22.04 runs 3.10).
PY311_ONLY = {"tomllib", "wsgiref.types"}
PY311_NAMES = {("datetime", "UTC"), ("typing", "Self"), ("typing", "LiteralString"), ("typing", "Never"),
               ("typing", "assert_never"), ("typing", "reveal_type"), ("enum", "StrEnum"), ("asyncio", "TaskGroup"),
               ("asyncio", "timeout"), ("hashlib", "file_digest"), ("typing", "Required"), ("typing", "NotRequired")}
# import names of the declared distributions (py-consul -> consul, PyYAML -> yaml, nvidia-ml-py -> pynvml)
THIRD_PARTY = {
    "clusterctl-eas-agent": {"click", "psutil", "consul", "prometheus_client", "yaml", "pynvml", "requests"},
    # uvloop: only with event_loop: uvloop, imported when asked for (an install of its own, edge/README.md)
    "clusterctl-eas-edge": {"aiohttp", "consul", "prometheus_client", "yaml", "requests", "uvloop"},
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("wheels")
    return {name: wheels.build_wheel(deployable, out) for name, deployable in wheels.DEPLOYABLES.items()}


def members(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def metadata(wheel: Path) -> list[tuple[str, str]]:
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return [tuple(line.split(": ", 1)) for line in archive.read(name).decode().splitlines() if ": " in line]


def packages(wheel: Path) -> set[str]:
    return {name.split("/")[0] for name in members(wheel) if not name.split("/")[0].endswith(".dist-info")}


def test_the_agent_wheel_carries_the_agent_and_the_protocol_only(built):
    assert packages(built["agent"]) == {"eas_agent", "eas_wire", "consul_io"}
    names = members(built["agent"])
    assert "eas_wire/scorebody.py" in names and "eas_agent/main.py" in names
    assert not [n for n in names if n.startswith(("edge/", "eas_agent/scheduler/", "sim/"))]


def test_the_edge_wheel_carries_the_edge_its_pool_and_the_protocol_only(built):
    assert packages(built["edge"]) == {"edge", "eas_wire", "consul_io"}
    names = members(built["edge"])
    assert {"edge/main.py", "edge/pool/view.py", "edge/pool/pick.py", "eas_wire/stream.py"} <= set(names)
    assert not [n for n in names if n.startswith(("cli/", "cluster/", "eas_agent/", "provision/", "sim/"))]


def test_the_packaged_sources_are_the_checkouts(built):
    for name, deployable in wheels.DEPLOYABLES.items():
        with zipfile.ZipFile(built[name]) as archive:
            sources = {n: archive.read(n) for n in archive.namelist() if n.endswith(".py")}
        assert sources == wheels.package_files(deployable.packages)
        assert not [n for n in sources if "__pycache__" in n]


def test_metadata_names_the_script_the_python_and_the_dependencies(built):
    for name, deployable in wheels.DEPLOYABLES.items():
        fields = dict(metadata(built[name]))
        assert fields["Name"] == deployable.dist and fields["Requires-Python"] == ">=3.10"
        requires = [value for key, value in metadata(built[name]) if key == "Requires-Dist"]
        assert requires == deployable.requirements(wheels.REPO_ROOT)
        with zipfile.ZipFile(built[name]) as archive:
            entry = next(n for n in archive.namelist() if n.endswith("entry_points.txt"))
            assert f"{deployable.script} = " in archive.read(entry).decode()
    edge_pins = [line for line in (wheels.REPO_ROOT / "edge" / "requirements.txt").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
    assert wheels.edge_requirements() == edge_pins + ["requests>=2.28,<3"]


def python_310_problems(sources: dict[str, str]) -> tuple[list[str], set[str]]:
    """(uses of 3.11-only syntax, modules or names, the top-level modules imported) of ``sources``."""
    problems, imported = [], set()
    for name, source in sources.items():
        try:
            tree = ast.parse(source, name, feature_version=(3, 10))  # except* and other 3.11 syntax fail here
        except SyntaxError as exc:
            problems.append(f"{name}: {exc}")
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                problems += [f"{name}: import {a.name} (3.11+)" for a in node.names if a.name in PY311_ONLY]
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                if node.module in PY311_ONLY:
                    problems.append(f"{name}: from {node.module} (3.11+)")
                problems += [f"{name}: {node.module}.{a.name} (3.11+)" for a in node.names
                             if (node.module, a.name) in PY311_NAMES]
                imported.add(node.module.split(".")[0])
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and (node.value.id, node.attr) in PY311_NAMES:
                problems.append(f"{name}: {node.value.id}.{node.attr} (3.11+)")
    return problems, imported


def test_the_wheels_code_is_python_310_and_imports_only_what_they_declare(built):
    for name, deployable in wheels.DEPLOYABLES.items():
        with zipfile.ZipFile(built[name]) as archive:
            sources = {n: archive.read(n).decode() for n in archive.namelist() if n.endswith(".py")}
        problems, imported = python_310_problems(sources)
        assert problems == [], name
        third_party = imported - set(sys.stdlib_module_names) - set(deployable.packages) - {"__future__"}
        assert third_party <= THIRD_PARTY[deployable.dist], (name, third_party)


@pytest.mark.parametrize(("source", "expected"), [
    ("import tomllib\n", 1),
    ("from datetime import UTC\n", 1),
    ("import asyncio\nasyncio.timeout(1)\n", 1),
    ("try:\n    pass\nexcept* ValueError:\n    pass\n", 1),
    ("import json\nfrom typing import Any\n", 0),
])
def test_the_310_check_sees_each_kind(source, expected):
    assert len(python_310_problems({"x.py": source})[0]) == expected


def checkout_copy(root: Path) -> Path:
    """The parts of the checkout the wheels are built from, copied to ``root``."""
    for package in ("eas_agent", "eas_wire", "consul_io", "edge"):
        shutil.copytree(wheels.REPO_ROOT / package, root / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(wheels.REPO_ROOT / "pyproject.toml", root / "pyproject.toml")
    return root


def test_the_version_changes_with_the_packaged_code_and_only_with_it(tmp_path):
    root = checkout_copy(tmp_path / "checkout")
    first = {name: wheels.build_wheel(d, tmp_path / "first", root) for name, d in wheels.DEPLOYABLES.items()}
    again = {name: wheels.build_wheel(d, tmp_path / "again", root) for name, d in wheels.DEPLOYABLES.items()}
    for name in first:  # same code: same name and version, same bytes
        assert first[name].name == again[name].name and first[name].read_bytes() == again[name].read_bytes()
        assert dict(metadata(first[name]))["Version"].startswith(wheels.project(root)["version"] + "+src.")
    (root / "eas_wire" / "stream.py").write_text((root / "eas_wire" / "stream.py").read_text() + "\n# changed\n")
    (root / "edge" / "pool" / "anomaly.py").write_text((root / "edge" / "pool" / "anomaly.py").read_text() + "#\n")
    changed = {name: wheels.build_wheel(d, tmp_path / "changed", root) for name, d in wheels.DEPLOYABLES.items()}
    versions = {name: (dict(metadata(first[name]))["Version"], dict(metadata(changed[name]))["Version"])
                for name in first}
    assert all(old != new for old, new in versions.values()), versions  # both carry eas_wire
    (root / "edge" / "tokens.py").write_text((root / "edge" / "tokens.py").read_text() + "#\n")
    agent_again = wheels.build_wheel(wheels.AGENT, tmp_path / "agent", root)
    assert agent_again.name == changed["agent"].name  # an edge-only change leaves the agent's version


def test_the_command_builds_each_and_refuses_anything_else(tmp_path, capsys):
    assert wheels.main(["edge", str(tmp_path)]) == 0
    assert Path(capsys.readouterr().out.strip()).name.startswith("clusterctl_eas_edge-")
    assert wheels.main(["controller", str(tmp_path)]) == 2 and "usage" in capsys.readouterr().err
