"""The eas-edge process: its event loop (``event_loop``: asyncio | uvloop), a SIGTERM right after it
announced itself."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from edge.config import ConfigError, load_edge_config
from edge.main import loop_factory
from edge.main import main as edge_main
from tests.helpers.edge import free_port

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]


def start_edge(consul_addr: str, *flags: str) -> subprocess.Popen:
    edge = subprocess.Popen([sys.executable, "-m", "edge", "--consul", consul_addr, "--listen", "127.0.0.1:0",
                             "--no-push", *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert edge.stdout.readline().startswith("eas-edge listening on http://127.0.0.1:")
    return edge


def test_a_sigterm_as_soon_as_the_edge_says_it_listens_drains_and_exits_0(consul_addr):
    """A supervisor may stop the edge the moment it reports ready: its handlers must already be there (they
    were installed after the "listening" line, and a SIGTERM in between killed it: exit -15, no drain)."""
    for _ in range(5):
        edge = start_edge(consul_addr, "--event-loop", "asyncio")
        edge.terminate()
        _out, err = edge.communicate(timeout=30)
        assert edge.returncode == 0, err


def test_event_loop_is_a_config_field_and_a_flag_and_anything_else_is_one_line(tmp_path):
    path = tmp_path / "edge.yml"
    path.write_text("event_loop: uvloop\n")
    assert load_edge_config(None).event_loop == "asyncio"
    assert load_edge_config(path).event_loop == "uvloop"
    assert load_edge_config(path, {"event_loop": "asyncio"}).event_loop == "asyncio"
    path.write_text("event_loop: trio\n")
    with pytest.raises(ConfigError) as info:
        load_edge_config(path)
    assert str(info.value) == f"{path}: event_loop: must be one of asyncio, uvloop; got 'trio'"
    assert loop_factory(load_edge_config(None)) is asyncio.new_event_loop


def test_uvloop_asked_for_but_not_installed_is_one_line_and_exit_2(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if not installed: importing it raises ImportError
    assert edge_main(["--event-loop", "uvloop", "--consul", f"127.0.0.1:{free_port()}", "--listen", "127.0.0.1:0"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "eas-edge: <flags>: event_loop: uvloop is not installed (pip install uvloop, or set event_loop: asyncio)"


def test_the_edge_serves_on_the_loop_it_was_given(consul_addr):
    for name in ("asyncio", "uvloop"):
        if name == "uvloop":
            pytest.importorskip("uvloop")
        edge = start_edge(consul_addr, "--log-level", "info", "--event-loop", name)
        edge.terminate()
        _out, err = edge.communicate(timeout=30)
        assert edge.returncode == 0 and f"(push off, event loop {name})" in err, err
