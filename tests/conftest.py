"""Fixtures shared across test areas (helpers they use live in tests/helpers/), and the run order.

``clusterctl``: run ``clusterctl ARGS`` in-process as a shell would, at a fixed terminal width.

``virtual_inventory`` / ``brought_up_inventory``: a virtual inventory on disk (no machine booted), the second
with the state directory `virtual up` creates.

``consul_addr``: an HTTP address of a Consul agent. When ``CONSUL_HTTP_ADDR`` is set the tests talk to
that (real) Consul, so anyone with a Consul binary can check that the dev server and Consul agree;
otherwise a fresh project dev server (``devconsul``) is started on a free loopback port per test.

Every test module declares its class with a module-level ``pytestmark`` (tests/README.md): ``unit``,
``integration`` or ``machines``, plus ``realtime`` for wall-clock agent tests. ``make test`` runs the suite
on two pytest-xdist workers (``-n 2 --dist loadscope``) and the order comes from those marks. The tests that
boot simulated machines on the default addresses (``machines(order=N)``) share what one machine has once: the
127.0.R.N addresses. They form one xdist scope, run one after another on one worker in ``order``, and come
first, so that the longest chain starts at once. The demo's machines and the preflight machine modules' live on
nets of their own (127.42.R.N, 127.NET.R.N; ``machines(own_net=True)``) and share only what is made to be shared
(the package server, refcounted by ``sim.hosts.repos``; the image cache, built under a lock), so each is its own
scope: they run on whichever worker is free, after the load-sensitive ``realtime`` modules, which keeps the chain
(CI's longest path: its machine tests run 1.3-1.9x slower there) shorter than the other worker's share.
tests/guards/test_scheduling.py checks the marks and the order.
"""
from __future__ import annotations

import ast
import functools
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The order of the machine tests (``machines(order=N)``, lowest first): first the ones that keep about one core
# busy (one machine provisioned at a time: the Redfish and render-only runs; the small machine tests), while
# the demo and then the other tests on the other worker use the other core; last the ones that take both cores
# (the fault matrix's 18 machines, site.yml on 3), by when most of the other worker's tests are done. Served
# with the unit tests alongside, site.yml's first run on 3 machines took 260 s instead of ~190.
#
# ``realtime`` modules (agents on 0.1 s cycles, several in one process) fall behind when both cores are taken:
# they go to the other worker before the demo, so they run beside the machine tests' one-core part; beside
# site.yml's two-core part their scores went stale at pick.
MACHINES_SCOPE = "machines"
CLASSES = ("unit", "integration", "machines")


def declared_marks(path: Path) -> dict[str, dict]:
    """The marks a test module's ``pytestmark`` declares, read from its source: name -> keyword arguments.

    The xdist controller reads them this way: it hands out work units by node id and never imports the tests.
    """
    tree = ast.parse(path.read_text(), str(path))
    marks: dict[str, dict] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            values = node.value.elts if isinstance(node.value, ast.List | ast.Tuple) else [node.value]
            for value in values:
                call = value if isinstance(value, ast.Call) else None
                target = call.func if call else value
                if isinstance(target, ast.Attribute) and ast.unparse(target.value) == "pytest.mark":
                    marks[target.attr] = {k.arg: ast.literal_eval(k.value) for k in call.keywords} if call else {}
    return marks


@functools.cache
def _module_marks(relative_path: str) -> dict[str, dict]:
    path = ROOT / relative_path
    return declared_marks(path) if path.suffix == ".py" and path.exists() else {}


def run_rank(marks: dict[str, dict]) -> tuple[int, int]:
    """Where a module's tests run: shared-net machine tests first (in their order), then the realtime modules,
    then the own-net demo, then everything else (collection order within a rank: the sort is stable)."""
    machines = marks.get("machines")
    if machines is not None and not machines.get("own_net"):
        return (0, machines["order"])
    if "realtime" in marks:
        return (1, 0)
    if machines is not None:
        return (2, 0)
    return (3, 0)


# Integration modules that bind the same fixed loopback range (127.0.73.N: the remediation fleet's units, whose
# helpers the others import): one work unit, so two of them never run at once on two workers.
SHARED_RANGE_MODULES = frozenset({
    "tests/integration/operate/test_remediate.py", "tests/integration/operate/test_remediate_load.py",
    "tests/integration/operate/test_drill_hardware.py", "tests/integration/operate/test_drill_devices.py",
    "tests/integration/eas_agent/test_xid_critical.py", "tests/integration/edge/test_rollout_sessions.py"})
SHARED_RANGE_SCOPE = "loopback 127.0.73"


def scope_of(nodeid: str) -> str:
    """The xdist work unit of a test: one for every shared-net machine test, one for the modules on one fixed
    loopback range, else its module."""
    module = nodeid.split("::", 1)[0]
    if module in SHARED_RANGE_MODULES:
        return SHARED_RANGE_SCOPE
    return MACHINES_SCOPE if run_rank(_module_marks(module))[0] == 0 else module


def _item_marks(item) -> dict[str, dict]:
    return {name: dict(marker.kwargs) for name in ("machines", "realtime")
            if (marker := item.get_closest_marker(name)) is not None}


def pytest_collection_modifyitems(config, items):
    # Machine tests first, in their order (stable: each module's tests stay together and in order), so that
    # the scheduler below hands the machines' unit out first.
    items[:] = sorted(items, key=lambda item: run_rank(_item_marks(item)))


# xdist's own `--dist loadgroup` cannot be used: on pytest 9.2 its xdist_group suffix on the node id no longer
# takes effect (pytest-dev/pytest-xdist#1386, open), and the tests are spread as if unmarked. With
# `--dist loadscope` this scheduler makes every shared-net machine test one scope and every other module its
# own, and hands the scopes out in collection order (the order above; xdist would sort them by test count,
# which put the one-test demo last, beside site.yml's two-core part).
@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class MachineTestsTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

    return MachineTestsTogether(config, log)


@pytest.fixture
def clusterctl(capsys, monkeypatch):
    """``clusterctl(*args)`` -> (exit code, stdout, stderr) at ``columns`` wide, as a shell would run it."""
    from tests.helpers import run_cli

    def run(*args: str, columns: int = 100):
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        return run_cli(capsys, *args)

    return run


@pytest.fixture(scope="session")
def virtual_inventory(tmp_path_factory):
    """A virtual inventory on disk (4 nodes, 2 racks, no faults); no simulated host is brought up."""
    from sim.hosts import create

    path = tmp_path_factory.mktemp("inv") / "mycluster"
    create.write(path, 4, 2, faults="none")
    return path


@pytest.fixture
def brought_up_inventory(tmp_path):
    """A virtual inventory of its own (4 nodes, 2 racks) with the machines' state directory that `virtual up`
    creates (no machine is booted): where a machine's overlay, and the provisioned stamp in it, would be."""
    from sim.hosts import create, state_dir

    path = tmp_path / "brought-up"
    create.write(path, 4, 2, faults="none")
    (path / state_dir.STATE_DIR_NAME).mkdir(mode=0o700)
    return path


@pytest.fixture
def consul_addr():
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        yield real.removeprefix("http://")
        return
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0") as server:
        yield server.address


@pytest.fixture
def tally(request):
    """The fault suite's counter of hostile inputs tried and faults survived (tests/helpers/fault_tally.py)."""
    from tests.helpers.fault_tally import Tally

    return Tally(request.node.nodeid)


# The fault suite's tally (tests/helpers/fault_tally.py): a worker hands its counts to the controller, which prints them.
def pytest_sessionfinish(session):
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        from tests.helpers import fault_tally as tally

        worker_output["fault_tally"] = tally.counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.helpers import fault_tally as tally

    tally.add(getattr(node, "workeroutput", {}).get("fault_tally", {}))


def pytest_terminal_summary(terminalreporter):
    if getattr(terminalreporter.config, "workeroutput", None) is None:
        from tests.helpers import fault_tally as tally

        tally.write_summary(terminalreporter)
