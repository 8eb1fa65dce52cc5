"""Fixtures shared across test areas (helpers they use live in tests/helpers.py).

``clusterctl``: run ``clusterctl ARGS`` in-process as a shell would, at a fixed terminal width.

``consul_addr``: an HTTP address of a Consul agent. When ``CONSUL_HTTP_ADDR`` is set the tests talk to
that (real) Consul, so anyone with a Consul binary can check that the dev server and Consul agree;
otherwise a fresh project dev server (``devconsul``) is started on a free loopback port per test.
"""

from __future__ import annotations

import os

import pytest


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
