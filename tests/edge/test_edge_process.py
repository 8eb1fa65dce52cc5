"""The eas-edge process: a SIGTERM right after it announced itself."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def start_edge(consul_addr: str, *flags: str) -> subprocess.Popen:
    edge = subprocess.Popen([sys.executable, "-m", "edge", "--consul", consul_addr, "--listen", "127.0.0.1:0",
                             "--no-push", *flags], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert edge.stdout.readline().startswith("eas-edge listening on http://127.0.0.1:")
    return edge


def test_a_sigterm_as_soon_as_the_edge_says_it_listens_drains_and_exits_0(consul_addr):
    """A supervisor may stop the edge the moment it reports ready: its handlers must already be there (they
    were installed after the "listening" line, and a SIGTERM in between killed it: exit -15, no drain)."""
    for _ in range(5):
        edge = start_edge(consul_addr)
        edge.terminate()
        _out, err = edge.communicate(timeout=30)
        assert edge.returncode == 0, err
