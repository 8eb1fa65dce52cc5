"""The check contract of preflight/checks/base.py, held for every registered check: ``run`` is the base
one (gather then evaluate), and nothing that ``evaluate`` (or a helper of its module that it calls) does
runs a command, talks to Consul or parses tool output."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import pytest

from preflight.checks import CHECKS
from preflight.checks.base import Check

pytestmark = pytest.mark.unit

# What running or parsing looks like in a check module: the context's command methods, the transport,
# the parser entry points and Consul.
FORBIDDEN_CALLS = {"run", "output", "completed", "parsed", "start", "parse_output", "parse", "cached_outputs"}
FORBIDDEN_NAMES = {"ctx", "transport", "consul_io", "parsers", "re"}


def _calls_and_names(function) -> tuple[set[str], set[str]]:
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    calls = {node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
             for node in ast.walk(tree) if isinstance(node, ast.Call)}
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    return calls, names


@pytest.mark.parametrize("check", CHECKS, ids=lambda c: c.name)
def test_run_is_the_base_gather_then_evaluate(check):
    assert type(check).run is Check.run, f"{check.name} overrides run(): split it into gather and evaluate"


def test_every_check_has_its_own_evaluate():
    """Rack checks too (ib_pairs, versions): ``run_rack`` gathers, then judges through ``evaluate``."""
    assert [c.name for c in CHECKS if type(c).evaluate is Check.evaluate] == []


@pytest.mark.parametrize("check", [c for c in CHECKS if c.scope != "rack" or type(c).evaluate is not Check.evaluate],
                         ids=lambda c: c.name)
def test_evaluate_runs_nothing_and_parses_nothing(check):
    evaluate = type(check).evaluate
    assert evaluate is not Check.evaluate, f"{check.name} has no evaluate()"
    assert list(inspect.signature(evaluate).parameters) == ["self", "facts", "profile", "node"]
    module = inspect.getmodule(type(check))
    # evaluate and every method/function of its own module it reaches by name, however deep (a helper of a
    # helper: gpu_topology's evaluate -> _iu_problems -> nvlinks read NVLink counts with a regex)
    functions, todo = [], [evaluate]
    while todo:
        function = todo.pop()
        functions.append(function)
        calls, _ = _calls_and_names(function)
        for name in calls:
            helper = getattr(type(check), name, None) or getattr(module, name, None)
            if inspect.isfunction(helper) and inspect.getmodule(helper) is module and helper not in functions + todo:
                todo.append(helper)
    for function in functions:
        calls, names = _calls_and_names(function)
        patterns = {n for n in names if isinstance(getattr(module, n, None), re.Pattern)}
        assert not calls & FORBIDDEN_CALLS, f"{check.name}.{function.__name__} calls {sorted(calls & FORBIDDEN_CALLS)}"
        assert not names & FORBIDDEN_NAMES, f"{check.name}.{function.__name__} uses {sorted(names & FORBIDDEN_NAMES)}"
        assert not patterns, f"{check.name}.{function.__name__} matches tool output with {sorted(patterns)}"


CHECK_MODULES = sorted(p.stem for p in (Path(__file__).resolve().parents[4] / "preflight" / "checks").glob("*.py")
                       if p.stem not in ("__init__", "base"))


@pytest.mark.parametrize("name", CHECK_MODULES + ["base"])
def test_no_check_module_holds_a_regex(name):
    """Parsing is the parsers' (preflight/parsers/): a check that imports ``re`` or keeps a compiled pattern in a
    module constant reads tool output itself, whichever function uses it (gather included)."""
    module = importlib.import_module(f"preflight.checks.{name}")
    assert [n for n, value in vars(module).items() if isinstance(value, re.Pattern)] == []
    assert "re" not in {alias.name for node in ast.walk(ast.parse(inspect.getsource(module)))
                        if isinstance(node, ast.Import) for alias in node.names}


def test_one_test_module_per_check_module():
    """tests/unit/preflight/checks/ mirrors preflight/checks/: test_<check>.py for each <check>.py, nothing else
    (base.py's contract is this file; builders shared by several are helpers.py)."""
    here = Path(__file__).resolve().parent
    tests = sorted(p.stem.removeprefix("test_") for p in here.glob("test_*.py") if p.name != "test_base.py")
    assert tests == CHECK_MODULES
    assert sorted(c.name for c in CHECKS) == CHECK_MODULES  # and every module registers its one check


def test_every_fault_code_a_check_can_emit_is_declared():
    import inspect
    import re

    from preflight.checks import CHECKS

    common = {"GATHER", "INTERNAL", "HOST_UNREACHABLE"}
    for check in CHECKS:
        source = inspect.getsource(inspect.getmodule(type(check)))
        emitted = set(re.findall(r'"([A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+)"', source)) - common
        passing = {c for c in emitted if c.endswith(("_OK", "_SKIP")) or c in ("NO_NICS", "IB_NO_PEERS")}
        undeclared = emitted - passing - set(check.codes)
        assert not undeclared, f"{check.name}: codes used but not declared: {sorted(undeclared)}"
        assert check.name in source.split("\n", 1)[0]  # the module docstring opens with the check's name
