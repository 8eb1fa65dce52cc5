"""Fixtures shared across test areas (helpers they use live in tests/helpers.py).

``clusterctl``: run ``clusterctl ARGS`` in-process as a shell would, at a fixed terminal width.

``consul_addr``: an HTTP address of a Consul agent. When ``CONSUL_HTTP_ADDR`` is set the tests talk to
that (real) Consul, so anyone with a Consul binary can check that the dev server and Consul agree;
otherwise a fresh project dev server (``devconsul``) is started on a free loopback port per test.

``make test`` runs the suite on two pytest-xdist workers (``-n 2 --dist loadscope``). The tests that boot
simulated machines on the default addresses (MACHINE_TESTS) share what one machine has once: the 127.0.R.N
addresses. They form one xdist scope, run one after another on one worker, and come first, so that the
longest chain starts at once. The demo's machines live on their own net (127.42.R.N, ``sim.demo.DEMO_NET``)
and share only what is made to be shared (the package server, refcounted by ``sim.hosts.repos``; the image
cache, built under a lock), so ``test_demo`` is its own scope: it runs on the other worker beside the
machines' first, one-core part (after the few load-sensitive EARLY_UNIT_TESTS), before that worker's other
unit tests. tests/test_xdist_groups.py keeps the lists complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# In run order. First the tests that keep about one core busy (one machine provisioned at a time: the Redfish
# and render-only runs; the small machine tests), while the demo and then the unit tests on the other worker
# use the other core; last the ones that take both cores (the fault matrix's 18 machines, site.yml on 3), by
# when most of the other worker's tests are done. Served with the unit tests alongside, site.yml's first run
# on 3 machines took 260 s instead of ~190.
MACHINE_TESTS = (
    "tests/provision/test_redfish.py",
    "tests/provision/test_render_only.py",
    "tests/provision/test_vault_option.py",
    "tests/cluster/test_vault.py",
    "tests/virtual/",
    "tests/bench/test_virtual_machines.py",
    "tests/preflight/test_e2e_virtual.py",
    "tests/preflight/test_checks_depth_virtual.py",
    "tests/preflight/test_checks_virtual.py",
    "tests/provision/test_site_virtual.py",
    "tests/test_fresh_clone.py",
)


# Tests that boot machines on a net of their own (not 127.0.R.N): each its own scope, scheduled right after the
# machines' (so on the other worker).
OWN_NET_MACHINE_TESTS = ("tests/test_demo.py",)
# Unit-test modules whose real-time agents (0.1 s cycles, several in one process) fall behind when both cores
# are taken: handed to the other worker before the demo, so they run beside the machine tests' one-core part
# (two fresh-clone runs with them after the demo, beside site.yml's two-core part, failed in
# test_eight_ius_reader_picks_by_score_and_flags_frozen: scores stale at pick, fail-open).
EARLY_UNIT_TESTS = ("tests/eas_agent/test_end_to_end.py",)


def _position(relative_path: str, entries: tuple[str, ...]) -> int | None:
    """The index of the first of ``entries`` (a file, or a directory ending in /) the path is under, else None."""
    return next((i for i, entry in enumerate(entries) if relative_path.startswith(entry)), None)


def machine_order(relative_path: str) -> int | None:
    """The position of a machine test's entry in MACHINE_TESTS (its run order), None for other tests."""
    return _position(relative_path, MACHINE_TESTS)


def is_machine_test(relative_path: str) -> bool:
    return machine_order(relative_path) is not None


def scope_of(nodeid: str) -> str:
    """The xdist work unit of a test: "machines" for every machine test, else its module."""
    module = nodeid.split("::", 1)[0]
    return "machines" if is_machine_test(module) else module


def pytest_collection_modifyitems(config, items):
    # Machine tests first, in MACHINE_TESTS order (stable: each module's tests stay together and in order), so
    # that the scheduler below hands the machines' unit out first.
    def key(item) -> tuple[int, int]:
        path = item.path.relative_to(ROOT).as_posix()
        for rank, entries in enumerate((MACHINE_TESTS, EARLY_UNIT_TESTS, OWN_NET_MACHINE_TESTS)):
            position = _position(path, entries)
            if position is not None:
                return (rank, position)
        return (3, 0)

    items[:] = sorted(items, key=key)


# xdist's own `--dist loadgroup` cannot be used: on pytest 9.2 its xdist_group suffix on the node id no longer
# takes effect (pytest-dev/pytest-xdist#1386, open), and the tests are spread as if unmarked. With
# `--dist loadscope` this scheduler makes every machine test one scope and every other module its own, and
# hands the scopes out in collection order (the order above; xdist would sort them by test count, which put
# the one-test demo last, beside site.yml's two-core part).
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


@pytest.fixture
def consul_addr():
    real = os.environ.get("CONSUL_HTTP_ADDR")
    if real:
        yield real.removeprefix("http://")
        return
    from devconsul.server import DevConsulServer

    with DevConsulServer(addr="127.0.0.1:0") as server:
        yield server.address


# The fault suite's tally (tests/faults/tally.py): a worker hands its counts to the controller, which prints them.
def pytest_sessionfinish(session):
    worker_output = getattr(session.config, "workeroutput", None)
    if worker_output is not None:
        from tests.faults import tally

        worker_output["fault_tally"] = tally.counts()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    from tests.faults import tally

    tally.add(getattr(node, "workeroutput", {}).get("fault_tally", {}))


def pytest_terminal_summary(terminalreporter):
    if getattr(terminalreporter.config, "workeroutput", None) is None:
        from tests.faults import tally

        tally.write_summary(terminalreporter)
