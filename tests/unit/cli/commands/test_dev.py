"""`clusterctl dev consul` (cli/commands/dev.py) when it cannot start: exit 2 in one line that names why."""

from __future__ import annotations

import socket

import pytest

from tests.helpers.cli import one_line

pytestmark = pytest.mark.unit


def test_dev_consul_that_cannot_start_is_exit_2_in_one_line(clusterctl, tmp_path, monkeypatch):
    import logging

    # the command configures the root logger (to this test's captured stderr): put it back afterwards
    monkeypatch.setattr(logging.root, "handlers", list(logging.root.handlers))
    monkeypatch.setattr(logging.root, "level", logging.root.level)

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        addr = f"127.0.0.1:{taken.getsockname()[1]}"
        code, _, err = clusterctl("dev", "consul", "--addr", addr)
    assert code == 2 and one_line(err) == f"error: cannot start on {addr}: Address already in use"
    (tmp_path / "state.json").write_text("{not json")
    code, _, err = clusterctl("dev", "consul", "--addr", "127.0.0.1:0", "--data-dir", str(tmp_path))
    assert code == 2 and one_line(err).startswith(f"error: {tmp_path}: unreadable state file (")
