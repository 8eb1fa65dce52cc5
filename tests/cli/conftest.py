"""Helpers for the CLI tests: run ``clusterctl`` in-process and capture one line, the exit code."""

from __future__ import annotations

import pytest


@pytest.fixture
def clusterctl(capsys, monkeypatch):
    """``clusterctl(*args)`` -> (exit code, stdout, stderr), through cli.main.main as a shell would."""
    from cli.main import main

    def run(*args: str, columns: int = 100):
        monkeypatch.setenv("COLUMNS", str(columns))
        monkeypatch.delenv("FORCE_COLOR", raising=False)
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out, err = capsys.readouterr()
        return code, out, err

    return run


@pytest.fixture(scope="session")
def virtual_inventory(tmp_path_factory):
    """A virtual inventory on disk (4 nodes, 2 racks, no faults); no simulated host is brought up."""
    from cluster.virtual import create

    path = tmp_path_factory.mktemp("inv") / "mycluster"
    create.write(path, 4, 2, faults="none")
    return path
